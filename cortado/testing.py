"""Hypothesis strategies for random, well-typed expression graphs and matching random feeds.

For people who test rules, passes and backends, cortado's own tests included::

    from hypothesis import given
    import cortado as ct
    from cortado.testing import graphs_with_feeds

    @given(graphs_with_feeds(ops=["add", "exp", "sum", "matmul"]))
    def test_my_backend(case):
        graph, feeds = case
        expected = ct.evaluate(graph.outputs, feeds, precision="float64")
        ...

A drawn ``RandomGraph`` is a *recipe*: a list of steps, each a call of one function by name with
earlier values and literal constants as arguments. Building it with cortado's functions gives
the terms (``graph.outputs``); ``graph.replay(namespace, feeds)`` runs the same recipe with any
other implementation of those functions (NumPy's, say) as an independent oracle. Its ``repr`` is
the recipe as code, so a failing example reads as a program. By default it draws every op of the
op table (``ALL_OPS``, grouped by kind and arity as ``UNARY``, ``BINARY``, ...) but those that
``NOT_DRAWN`` excludes, each for a reason.

Every value carries an interval that bounds it for feeds drawn by ``feeds``, and steps are only
taken where the result stays finite and well-conditioned: ``log`` and ``sqrt`` see values of at
least 0.25, divisors stay away from zero, ``exp`` sees at most 8, and no value grows past 1e4. So
drawn graphs are safe for tolerance-based comparison and for finite differences.
"""

import math
import string
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cortado
from cortado.exprgraph.dtypes import as_dtype, finfo, is_bfloat16, is_float
from cortado.exprgraph.ops import OPS, REDUCTION
from cortado.exprgraph.term import RuleViolation

# The ops of the table these strategies never draw, and why. Every other op is drawn, so an op added
# to the table is drawn too (and needs a builder below) unless it is listed here on purpose.
NOT_DRAWN = {
    "var": "a graph's variables are its inputs, drawn apart from its steps",
    "const": "constants enter steps as literal arguments (x * 2.0), as users write them",
    "fused": "only fusion builds it, from the ops drawn here",
    "param": "it stands for an operand in a fused body, which only fusion builds",
    "stop_gradient": "its derivative is 0 by definition, which finite differences contradict (a program "
                     "computes it as its operand; tests/test_quantization.py tests it)",
    "float8_gradient": "its derivative rounds the cotangent to float8, which finite differences contradict (a "
                       "program computes it as its operand; tests/test_float8.py tests it)",
    "attention": "the rules build it from the softmax and products drawn here (tests/test_attention.py tests it)",
    "attention_grad": "the derivative rules build it, from attention",
    "random_uniform": "its operands are integer keys, not values drawn from intervals (tests/test_random.py tests it "
                      "on every backend)",
}


def _plain_elementwise(op, arity):
    """Whether ``op`` is elementwise, of ``arity`` operands and no attributes."""
    return op.elementwise and op.arity == arity and not op.attr_names


def _gives_bool(op):
    """Whether ``op``'s result is bool for floating operands: a comparison."""
    operand = cortado.var("x", (), "float32")
    return op.dtype_rule((operand,) * op.arity) == np.bool_


_DRAWN = [op for name, op in OPS.items() if name not in NOT_DRAWN]
UNARY = [op.name for op in _DRAWN if _plain_elementwise(op, 1)]
BINARY = [op.name for op in _DRAWN if _plain_elementwise(op, 2) and not _gives_bool(op)]
COMPARISONS = [op.name for op in _DRAWN if _plain_elementwise(op, 2) and _gives_bool(op)]
REDUCTIONS = [op.name for op in _DRAWN if op.kind == REDUCTION]
# the ops of none of those groups: a builder each
STRUCTURAL = [op.name for op in _DRAWN
              if not (_plain_elementwise(op, 1) or _plain_elementwise(op, 2) or op.kind == REDUCTION)]
ALL_OPS = UNARY + BINARY + COMPARISONS + REDUCTIONS + STRUCTURAL

LIMIT = 1e4  # no value may be bounded by more than this
MAX_SIZE = 1024  # nor have more elements than this
MARGIN = 0.25  # log, sqrt and divisors stay this far from their singularities


@dataclass(frozen=True)
class Literal:
    """A constant argument of a step, passed as is (Python scalars stay weak, as in NumPy), or, where it is nested
    tuples (a gather's indices), as an array: NumPy's ``take_along_axis`` takes no tuples."""

    value: object

    def __repr__(self):
        return repr(self.value)


@dataclass(frozen=True)
class Step:
    """``values.append(namespace.fn(*args, **kwargs))``; int args index earlier values."""

    fn: str
    args: tuple
    kwargs: tuple = ()


@dataclass(frozen=True)
class RandomGraph:
    """A drawn graph: its variables, the recipe that built it, and its outputs.

    ``bounds[name]`` is the interval ``feeds`` draws that variable's values from.
    """

    inputs: tuple
    steps: tuple
    output_indices: tuple
    outputs: tuple
    bounds: dict

    def replay(self, namespace, feeds):
        """The outputs computed by the recipe with ``namespace``'s functions (a module or mapping)."""
        values = [feeds[v.name] for v in self.inputs]
        for step in self.steps:
            values.append(_call(namespace, step, values))
        return [values[i] for i in self.output_indices]

    def __repr__(self):
        lines = [f"v{i} = var({v.name!r}, {v.shape}, {v.dtype.name!r})" for i, v in enumerate(self.inputs)]
        for k, step in enumerate(self.steps, start=len(self.inputs)):
            args = [f"v{a}" if isinstance(a, int) else repr(a) for a in step.args]
            args += [f"{name}={value!r}" for name, value in step.kwargs]
            lines.append(f"v{k} = {step.fn}({', '.join(args)})")
        lines.append("outputs: " + ", ".join(f"v{i}" for i in self.output_indices))
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):  # how hypothesis shows a falsifying example
        printer.text(repr(self))


def _call(namespace, step, values):
    fn = namespace[step.fn] if isinstance(namespace, dict) else getattr(namespace, step.fn)
    args = [values[a] if isinstance(a, int) else np.asarray(a.value) if isinstance(a.value, tuple) else a.value
            for a in step.args]
    return fn(*args, **dict(step.kwargs))


@dataclass(frozen=True)
class _Value:
    term: object
    lo: float
    hi: float

    @property
    def shape(self):
        return self.term.shape

    @property
    def is_bool(self):
        return self.term.dtype == np.bool_


# -- intervals -------------------------------------------------------------------------------


def _monotone(f):
    return lambda lo, hi: (f(lo), f(hi))


def _product(a, b):
    corners = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(corners), max(corners)


def _divide(a, b):
    return _product(a, (1 / b[1], 1 / b[0]))


def _power(a, exponent):
    corners = [a[0] ** exponent, a[1] ** exponent]
    if isinstance(exponent, int) and exponent % 2 == 0 and a[0] < 0 < a[1]:
        corners.append(0.0)
    return min(corners), max(corners)


def _meaning(name):
    """Op ``name`` on one Python float, by its record's reference semantics (in float64)."""
    evaluate = OPS[name].evaluate
    return lambda x: float(evaluate([np.float64(x)]))


def _turning(f, *points):
    """Bounds of ``f``, monotone between the ``points`` where it turns."""

    def bounds(lo, hi):
        values = [f(lo), f(hi)] + [f(p) for p in points if lo < p < hi]
        return min(values), max(values)

    return bounds


def _periodic(f, peak):
    """Bounds of ``f`` of period 2 pi, which turns at ``peak`` and every pi from it."""

    def bounds(lo, hi):
        first = peak + math.pi * math.ceil((lo - peak) / math.pi)
        turns = [first + k * math.pi for k in range(3) if first + k * math.pi < hi]
        return _turning(f, *turns)(lo, hi) if hi - lo < 2 * math.pi else (-1.0, 1.0)

    return bounds


UNARY_BOUNDS = {
    "negative": lambda lo, hi: (-hi, -lo),
    "exp": _monotone(math.exp),
    "log": _monotone(math.log),
    "log1p": _monotone(math.log1p),
    "expm1": _monotone(math.expm1),
    "sqrt": _monotone(math.sqrt),
    "tanh": _monotone(math.tanh),
    "sin": _periodic(math.sin, math.pi / 2),
    "cos": _periodic(math.cos, 0.0),
    "logical_not": lambda lo, hi: (0.0, 1.0),
    "relu": _monotone(lambda x: max(x, 0.0)),
    "abs": lambda lo, hi: (0.0 if lo < 0 < hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi))),
    "sign": lambda lo, hi: (-1.0 if lo < 0 else 0.0, 1.0 if hi > 0 else 0.0),
    "rint": _monotone(round),  # Python's round, like NumPy's rint, takes ties to even
    # ops whose records say where they turn (the composites): bounded by their own reference semantics
    **{op.name: _turning(_meaning(op.name), *op.turns) for op in OPS.values() if op.turns is not None},
}
UNARY_DOMAINS = {
    "exp": lambda lo, hi: hi <= 8,
    "expm1": lambda lo, hi: hi <= 8,
    "log": lambda lo, hi: lo >= MARGIN,
    "log1p": lambda lo, hi: lo >= MARGIN - 1,
    "sqrt": lambda lo, hi: lo >= MARGIN,
}
BINARY_BOUNDS = {
    "add": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "subtract": lambda a, b: (a[0] - b[1], a[1] - b[0]),
    "multiply": _product,
    "divide": _divide,
    "floor_divide": lambda a, b: tuple(map(math.floor, _divide(a, b))),
    "remainder": lambda a, b: (min(0.0, b[0]), max(0.0, b[1])),  # of the divisor's sign, smaller than it
    "maximum": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
    "minimum": lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
}
REDUCTION_BOUNDS = {  # bounds of the result of reducing ``count`` elements bounded by ``lo`` and ``hi``
    "sum": lambda lo, hi, count: (min(lo, lo * count), max(hi, hi * count)),
    "mean": lambda lo, hi, count: (lo, hi),
    "max": lambda lo, hi, count: (lo, hi),
    "logsumexp": lambda lo, hi, count: (lo, hi + math.log(max(count, 1))),
    "softmax": lambda lo, hi, count: (0.0, 1.0),
    "log_softmax": lambda lo, hi, count: (-(hi - lo) - math.log(max(count, 1)), 0.0),
}
SCALARS = [0.5, 2.0, -1.5, 3, 1.0]
DIVISIONS = ("divide", "floor_divide", "remainder")  # their divisors are kept MARGIN from 0
EXPONENTS = {2: -math.inf, 3: -math.inf, 0.5: MARGIN, -1.0: MARGIN}  # exponent -> least base


def _promotable(*values):
    """Whether the values' dtypes have a common dtype (bfloat16 has none with float16, say)."""
    try:
        np.result_type(*(v.term.dtype for v in values))
        return True
    except TypeError:
        return False


def _broadcastable(*shapes):
    try:
        np.broadcast_shapes(*shapes)
        return True
    except ValueError:
        return False


# -- one builder per kind of op: which values it may take, and how to draw its arguments -----


def _numeric(values):
    return [i for i, v in enumerate(values) if not v.is_bool]


def _takes(name, value):
    """Whether op ``name`` takes ``value``'s dtype (gelu refuses integers, which exp widens)."""
    try:
        OPS[name].dtype_rule((value.term,))
    except RuleViolation:
        return False
    return True


def _unary(draw, name, values):
    domain = UNARY_DOMAINS.get(name, lambda lo, hi: True)
    choices = [i for i in _numeric(values) if domain(values[i].lo, values[i].hi) and _takes(name, values[i])]
    if not choices:
        return None
    i = draw(st.sampled_from(choices))
    return Step(name, (i,)), UNARY_BOUNDS[name](values[i].lo, values[i].hi)


def _binary(draw, name, values):
    numeric = _numeric(values)
    a = draw(st.sampled_from(numeric))
    with_value = [j for j in numeric if _broadcastable(values[a].shape, values[j].shape)
                  and _promotable(values[a], values[j])]
    if name in DIVISIONS:
        with_value = [j for j in with_value if values[j].lo >= MARGIN or values[j].hi <= -MARGIN]
    if name == "power":
        exponent = draw(st.sampled_from([e for e, least in EXPONENTS.items() if values[a].lo >= least] or [2]))
        return Step(name, (a, Literal(exponent))), _power((values[a].lo, values[a].hi), exponent)
    if with_value and draw(st.booleans()):
        b = draw(st.sampled_from(with_value))
        bounds_b, arg_b = (values[b].lo, values[b].hi), b
    else:
        scalar = draw(st.sampled_from(SCALARS))
        bounds_b, arg_b = (scalar, scalar), Literal(scalar)
    bounds_a = (values[a].lo, values[a].hi)
    if draw(st.booleans()) and name not in DIVISIONS:  # scalar on the left too: 2.0 - x
        return Step(name, (arg_b, a)), BINARY_BOUNDS[name](bounds_b, bounds_a)
    return Step(name, (a, arg_b)), BINARY_BOUNDS[name](bounds_a, bounds_b)


def _comparison(draw, name, values):
    numeric = _numeric(values)
    a = draw(st.sampled_from(numeric))
    partners = [j for j in numeric if _broadcastable(values[a].shape, values[j].shape)
                and _promotable(values[a], values[j])]
    b = draw(st.sampled_from(partners))
    return Step(name, (a, b)), (0.0, 1.0)


def _where(draw, name, values):
    conditions = [i for i, v in enumerate(values) if v.is_bool]
    if not conditions or draw(st.integers(0, 3)) == 0:
        conditions = range(len(values))  # a numeric condition means "nonzero", as in NumPy
    c = draw(st.sampled_from(conditions))
    numeric = [j for j in _numeric(values) if _broadcastable(values[c].shape, values[j].shape)]
    if not numeric:  # a broadcast condition no numeric value fits
        return None
    x = draw(st.sampled_from(numeric))
    y_choices = [j for j in numeric if _broadcastable(values[c].shape, values[x].shape, values[j].shape)
                 and _promotable(values[x], values[j])]
    y = draw(st.sampled_from(y_choices))
    return Step(name, (c, x, y)), (min(values[x].lo, values[y].lo), max(values[x].hi, values[y].hi))


def _axes(draw, ndim, nonempty):
    if ndim == 0:
        return None, ()
    subset = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=int(nonempty), max_size=ndim))
    form = draw(st.sampled_from(["tuple", "int", "negative", "none"]))
    if form == "none" and ndim:
        return None, tuple(range(ndim))
    if form in ("int", "negative") and len(subset) == 1:
        return subset[0] - ndim * (form == "negative"), tuple(subset)
    return tuple(subset), tuple(subset)


def _reduction(draw, name, values):
    keeps_shape = "keepdims" not in OPS[name].attr_names  # the softmax family: over one axis or more
    choices = [i for i in _numeric(values) if values[i].term.ndim or not keeps_shape]
    if not choices:
        return None
    i = draw(st.sampled_from(choices))
    v = values[i]
    if keeps_shape:
        axis, axes = _axes(draw, v.term.ndim, nonempty=True)
        kwargs = (("axis", axis),)
    else:
        axis, axes = _axes(draw, v.term.ndim, nonempty=False)
        kwargs = (("axis", axis), ("keepdims", draw(st.booleans())))
    count = math.prod(v.shape[a] for a in axes)
    return Step(name, (i,), kwargs), REDUCTION_BOUNDS[name](v.lo, v.hi, count)


def _matmul(draw, name, values):
    def fits(a, b):
        if not a or not b:
            return False
        a2 = (1,) + a if len(a) == 1 else a
        b2 = b + (1,) if len(b) == 1 else b
        return a2[-1] == b2[-2] and _broadcastable(a2[:-2], b2[:-2])

    numeric = _numeric(values)
    pairs = [(i, j) for i in numeric for j in numeric
             if fits(values[i].shape, values[j].shape) and _promotable(values[i], values[j])]
    if not pairs:
        return None
    i, j = draw(st.sampled_from(pairs))
    a = values[i].shape
    n = a[-1]
    lo, hi = _product((values[i].lo, values[i].hi), (values[j].lo, values[j].hi))
    return Step(name, (i, j)), (min(lo, lo * n), max(hi, hi * n))


def _einsum(draw, name, values):
    numeric = _numeric(values)
    operands = [draw(st.sampled_from(numeric))]
    if draw(st.booleans()):
        operands.append(draw(st.sampled_from([j for j in numeric if _promotable(values[operands[0]], values[j])])))
    sizes = {}
    terms = []
    letters = iter(string.ascii_lowercase)
    for i in operands:
        labels = ""
        for size in values[i].shape:
            reusable = [label for label, s in sizes.items() if s == size]
            if reusable and draw(st.booleans()):
                labels += draw(st.sampled_from(reusable))
            else:
                label = next(letters)
                sizes[label] = size
                labels += label
        terms.append(labels)
    used = sorted(set("".join(terms)))
    output = "".join(draw(st.permutations(used))[: draw(st.integers(0, len(used)))])
    explicit = draw(st.booleans())
    subscripts = ",".join(terms) + ("->" + output if explicit else "")
    if not explicit:
        output = "".join(label for label in used if "".join(terms).count(label) == 1)
    summed = math.prod(sizes[label] for label in used if label not in output)
    lo, hi = values[operands[0]].lo, values[operands[0]].hi
    for i in operands[1:]:
        lo, hi = _product((lo, hi), (values[i].lo, values[i].hi))
    return Step(name, (Literal(subscripts), *operands)), (min(lo, lo * summed), max(hi, hi * summed))


def _transpose(draw, name, values):
    i = draw(st.sampled_from(range(len(values))))
    ndim = values[i].term.ndim
    axes = draw(st.none() | st.permutations(range(ndim)).map(tuple))
    kwargs = () if axes is None else (("axes", axes),)
    return Step(name, (i,), kwargs), (values[i].lo, values[i].hi)


def _reshape(draw, name, values):
    i = draw(st.sampled_from(range(len(values))))
    size = values[i].term.size
    dims = []
    rest = size
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    if rest != 1 or not dims or draw(st.booleans()):
        dims.append(rest)
    if draw(st.booleans()) and dims:
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return Step(name, (i,), (("shape", tuple(dims)),)), (values[i].lo, values[i].hi)


def _broadcast_to(draw, name, values):
    i = draw(st.sampled_from(range(len(values))))
    shape = tuple(draw(st.integers(2, 3)) if d == 1 and draw(st.booleans()) else d for d in values[i].shape)
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=max(0, 4 - len(shape)))))
    return Step(name, (i,), (("shape", lead + shape),)), (values[i].lo, values[i].hi)


def _flip(draw, name, values):
    i = draw(st.sampled_from(range(len(values))))
    axis, _ = _axes(draw, values[i].term.ndim, nonempty=False)
    return Step(name, (i,), (("axis", axis),)), (values[i].lo, values[i].hi)


def _pad(draw, name, values):
    i = draw(st.sampled_from(range(len(values))))
    v = values[i]
    if not v.term.ndim:
        return None
    widths = tuple((draw(st.integers(-min(1, n - 1), 2)), draw(st.integers(0, 1))) for n in v.shape)
    fill = draw(st.sampled_from([0, 1] if v.is_bool else [0, 0.5, -1.5]))
    lo, hi = v.lo, v.hi
    if any(low > 0 or high > 0 for low, high in widths):
        lo, hi = min(lo, fill), max(hi, fill)
    return Step(name, (i,), (("pad_width", widths), ("constant_values", fill))), (lo, hi)


def _gather(index_shape):
    """The builder of a gather (``take``, ``take_along_axis``) from a nonempty value along a drawn axis, its indices
    (of ``index_shape(draw, value shape, axis)``) a literal of nested tuples of ints in ``[-size, size)``."""

    def build(draw, name, values):
        choices = [i for i, v in enumerate(values) if v.term.ndim and all(v.shape)]
        if not choices:
            return None
        i = draw(st.sampled_from(choices))
        v = values[i]
        axis = draw(st.integers(-v.term.ndim, v.term.ndim - 1))
        shape, size = index_shape(draw, v.shape, axis % v.term.ndim), v.shape[axis]
        flat = draw(st.lists(st.integers(-size, size - 1), min_size=math.prod(shape), max_size=math.prod(shape)))
        indices = _as_tuples(np.array(flat, dtype=np.int64).reshape(shape).tolist()) if shape else flat[0]
        return Step(name, (i, Literal(indices)), (("axis", axis),)), (v.lo, v.hi)

    return build


def _add_at(draw, name, values):
    """``add_at(x, indices, x, axis)``: a nonempty value's rows along a drawn axis added back at drawn places (a
    place may take several rows, or none), so the values always have the shape the indices take."""
    choices = [i for i, v in enumerate(values) if v.term.ndim and all(v.shape) and not v.is_bool]
    if not choices:
        return None
    i = draw(st.sampled_from(choices))
    v = values[i]
    axis = draw(st.integers(-v.term.ndim, v.term.ndim - 1))
    size = v.shape[axis]
    places = draw(st.lists(st.integers(-size, size - 1), min_size=size, max_size=size))
    reach = size * max(abs(v.lo), abs(v.hi))  # a place takes at most every row
    return Step(name, (i, Literal(tuple(places)), i), (("axis", axis),)), (v.lo - reach, v.hi + reach)


def _as_tuples(nested):
    """Nested lists as nested tuples (a literal's repr reads as the value it was)."""
    return tuple(_as_tuples(x) for x in nested) if isinstance(nested, list) else nested


def _window_geometry(draw, sizes):
    """A window shape, strides and dilation that fit axes of ``sizes``."""
    window, strides, dilation = [], [], []
    for n in sizes:
        k = draw(st.integers(1, n))
        d = draw(st.integers(1, max(1, (n - 1) // max(k - 1, 1))))
        window.append(k)
        dilation.append(d)
        strides.append(draw(st.integers(1, 2)))
    return tuple(window), tuple(strides), tuple(dilation)


def _windows(draw, name, values):
    choices = [i for i, v in enumerate(values) if v.term.ndim]
    if not choices:
        return None
    i = draw(st.sampled_from(choices))
    count = draw(st.integers(1, min(2, values[i].term.ndim)))
    window, strides, dilation = _window_geometry(draw, values[i].shape[-count:])
    kwargs = (("window_shape", window), ("strides", strides), ("dilation", dilation))
    return Step(name, (i,), kwargs), (values[i].lo, values[i].hi)


def _overlap_add(draw, name, values):
    choices = [i for i, v in enumerate(values) if v.term.ndim >= 2 and not v.is_bool]
    if not choices:
        return None
    i = draw(st.sampled_from(choices))
    v = values[i]
    count = draw(st.integers(1, v.term.ndim // 2))
    counts, window = v.shape[v.term.ndim - 2 * count:v.term.ndim - count], v.shape[v.term.ndim - count:]
    strides = tuple(draw(st.integers(1, 2)) for _ in counts)
    dilation = tuple(draw(st.integers(1, 2)) for _ in counts)
    shape = tuple((c - 1) * s + (k - 1) * d + 1 + draw(st.integers(0, s - 1))
                  for c, k, s, d in zip(counts, window, strides, dilation))
    overlaps = math.prod(window)  # an element receives at most one tap of each window position
    kwargs = (("shape", shape), ("strides", strides), ("dilation", dilation))
    return Step(name, (i,), kwargs), (min(0.0, v.lo * overlaps), max(0.0, v.hi * overlaps))


def _conv(draw, name, values):
    def groupings(x, w):
        if x.term.ndim < 3 or w.term.ndim != x.term.ndim or x.is_bool or w.is_bool or not _promotable(x, w):
            return []
        channels, outputs, per_group = x.shape[1], w.shape[0], w.shape[1]
        groups = channels // per_group
        return [groups] if groups * per_group == channels and outputs % groups == 0 else []

    pairs = [(i, j, g) for i, x in enumerate(values) for j, w in enumerate(values) for g in groupings(x, w)]
    if not pairs:
        return None
    i, j, groups = draw(st.sampled_from(pairs))
    x, w = values[i], values[j]
    strides, padding, lhs, rhs = [], [], [], []
    for n, k in zip(x.shape[2:], w.shape[2:]):
        lhs.append(draw(st.integers(1, 2)))
        rhs.append(draw(st.integers(1, 2)))
        low = draw(st.integers(-1, 2))
        least_high = (k - 1) * rhs[-1] + 1 - ((n - 1) * lhs[-1] + 1) - low  # the kernel must fit once
        padding.append((low, draw(st.integers(max(least_high, -1), max(least_high, -1) + 2))))
        strides.append(draw(st.integers(1, 2)))
    kwargs = (("strides", tuple(strides)), ("padding", tuple(padding)), ("lhs_dilation", tuple(lhs)),
              ("rhs_dilation", tuple(rhs)), ("groups", groups))
    taps = w.shape[1] * math.prod(w.shape[2:])
    lo, hi = _product((x.lo, x.hi), (w.lo, w.hi))
    return Step(name, (i, j), kwargs), (min(0.0, lo * taps), max(0.0, hi * taps))


BUILDERS = {
    **{name: _unary for name in UNARY},
    **{name: _binary for name in BINARY},
    **{name: _comparison for name in COMPARISONS},
    **{name: _reduction for name in REDUCTIONS},
    "where": _where,
    "matmul": _matmul,
    "einsum": _einsum,
    "transpose": _transpose,
    "reshape": _reshape,
    "broadcast_to": _broadcast_to,
    "flip": _flip,
    "pad": _pad,
    "windows": _windows,
    "overlap_add": _overlap_add,
    "conv": _conv,
    "take": _gather(lambda draw, shape, axis: tuple(draw(st.lists(st.integers(1, 3), max_size=2)))),
    "take_along_axis": _gather(lambda draw, shape, axis: shape[:axis] + (draw(st.integers(1, 3)),) + shape[axis + 1:]),
    "add_at": _add_at,
}


def _cast_builder(dtypes):
    def build(draw, name, values):
        i = draw(st.sampled_from(_numeric(values)))
        return Step(name, (i,), (("dtype", draw(st.sampled_from(dtypes))),)), (values[i].lo, values[i].hi)

    return build


# -- the strategies --------------------------------------------------------------------------


def _input_shapes(draw, count, max_rank, max_side):
    """Shapes that often broadcast together and share sizes, so that every op finds operands."""
    base = draw(st.lists(st.integers(1, max_side), min_size=0, max_size=max_rank))
    shapes = []
    for _ in range(count):
        if draw(st.integers(0, 4)) == 0:
            shapes.append(tuple(draw(st.lists(st.integers(1, max_side), max_size=max_rank))))
        else:
            suffix = base[len(base) - draw(st.integers(0, len(base))):]
            shapes.append(tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in suffix))
    return shapes


def _lacking(ops):
    """What each of ``ops`` lacks to be drawn, and where it goes: a builder, or the bounds its builder reads."""
    lacking = []
    for name in ops:
        if name in NOT_DRAWN:
            lacking.append(f"{name}: {NOT_DRAWN[name]}")
        elif name in OPS and name not in BUILDERS and name != "cast":
            lacking.append(f"{name}: it has no builder (add one to cortado.testing.BUILDERS, or list it in "
                           f"cortado.testing.NOT_DRAWN with the reason)")
        elif name not in BUILDERS and name != "cast":
            lacking.append(f"{name}: it is no op of the table")
        elif name in UNARY and name not in UNARY_BOUNDS:
            lacking.append(f"{name}: it has no bounds (add them to cortado.testing.UNARY_BOUNDS, or give its record "
                           f"the places it turns, Op.turns)")
        elif name in BINARY and name not in BINARY_BOUNDS and name != "power":  # power: its exponents' own
            lacking.append(f"{name}: it has no bounds (add them to cortado.testing.BINARY_BOUNDS)")
        elif name in REDUCTIONS and name not in REDUCTION_BOUNDS:
            lacking.append(f"{name}: it has no bounds (add them to cortado.testing.REDUCTION_BOUNDS)")
    return lacking


def graphs(ops=None, dtypes=("float32", "float64"), max_inputs=3, max_steps=8, max_rank=3, max_side=4):
    """A strategy of ``RandomGraph``: well-typed graphs over ``ops`` (names of cortado functions).

    Variables are named ``x0, x1, ...`` with floating dtypes drawn from ``dtypes`` (bfloat16 too;
    only operands that promote together meet); shapes have at most ``max_rank`` dimensions of at
    most ``max_side``. Steps whose result would not stay bounded are skipped, so a graph may have
    fewer than ``max_steps`` of them.
    """
    ops = list(ALL_OPS if ops is None else ops)
    lacking = _lacking(ops)
    if lacking:
        raise ValueError(f"cortado.testing.graphs cannot draw {'; '.join(lacking)}; the ops it draws: {ALL_OPS}")
    dtypes = [as_dtype(d) for d in dtypes]
    if not dtypes or not all(is_float(d) for d in dtypes):
        raise ValueError(f"cortado.testing.graphs draws floating variables; got dtypes {[d.name for d in dtypes]}")
    dtypes = [d.name for d in dtypes]
    builders = {name: BUILDERS.get(name) for name in ops}
    if "cast" in ops:
        builders["cast"] = _cast_builder(dtypes)
    sizes = {"max_inputs": max_inputs, "max_steps": max_steps, "max_rank": max_rank, "max_side": max_side}
    small = [f"{name}={value!r}" for name, value in sizes.items() if not isinstance(value, int) or value < 1]
    if small:
        raise ValueError(f"cortado.testing.graphs: {', '.join(small)}; each is a whole number of at least 1")
    return _graphs(builders, dtypes, max_inputs, max_steps, max_rank, max_side)


@st.composite
def _graphs(draw, builders, dtypes, max_inputs, max_steps, max_rank, max_side):
    ops = list(builders)
    count = draw(st.integers(1, max_inputs))
    values, inputs, bounds = [], [], {}
    for k, shape in enumerate(_input_shapes(draw, count, max_rank, max_side)):
        v = cortado.var(f"x{k}", shape, draw(st.sampled_from(dtypes)))
        lo, hi = draw(st.sampled_from([(-2.0, 2.0), (0.5, 2.0)]))
        inputs.append(v)
        bounds[v.name] = (lo, hi)
        values.append(_Value(v, lo, hi))
    steps = []
    for _ in range(draw(st.integers(0, max_steps))):
        name = draw(st.sampled_from(ops))
        built = builders[name](draw, name, values)
        if built is None:
            continue
        step, (lo, hi) = built
        if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > LIMIT:
            continue
        term = _call(cortado, step, [v.term for v in values])
        if term.size <= MAX_SIZE:
            steps.append(step)
            values.append(_Value(term, lo, hi))
    read = {a for step in steps for a in step.args if isinstance(a, int)}
    sinks = [i for i in range(len(inputs), len(values)) if i not in read] or [0]
    outputs = tuple(values[i].term for i in sinks)
    used = set(cortado.Graph(outputs).variables)
    kept = tuple(v for v in inputs if v in used)
    renumber = {old: new for new, old in enumerate([inputs.index(v) for v in kept])}
    renumber.update({i: i - len(inputs) + len(kept) for i in range(len(inputs), len(values))})
    steps = tuple(
        Step(s.fn, tuple(renumber[a] if isinstance(a, int) else a for a in s.args), s.kwargs) for s in steps
    )
    return RandomGraph(kept, steps, tuple(renumber[i] for i in sinks), outputs,
                       {v.name: bounds[v.name] for v in kept})


def _inside(bound, dtype, direction):
    """``bound`` as the nearest value of the float ``dtype`` on its ``direction`` side (in range)."""
    info = finfo(dtype)
    value = dtype.type(np.clip(bound, -info.max, info.max))
    if (float(value) - bound) * direction < 0:
        value = np.nextafter(value, dtype.type(direction * np.inf))
    return float(value)


def _array(var, lo, hi):
    """Arrays for ``var`` with elements in ``[lo, hi]``, the bounds moved inside the dtype's range."""
    drawn = np.dtype(np.float32) if is_bfloat16(var.dtype) else var.dtype  # hypothesis draws no bfloat16
    if is_float(var.dtype):
        lo, hi = _inside(lo, var.dtype, +1), _inside(hi, var.dtype, -1)
        elements = st.floats(lo, hi, width=drawn.itemsize * 8, allow_nan=False, allow_infinity=False)
        if drawn != var.dtype:  # float32 values rounded to the nearest bfloat16, within [lo, hi] as they are
            elements = elements.map(lambda v: float(var.dtype.type(v)))
    elif var.dtype.kind == "b":
        elements = st.booleans()
    else:
        info = np.iinfo(var.dtype)
        lo, hi = max(math.ceil(lo), int(info.min)), min(math.floor(hi), int(info.max))
        elements = st.integers(lo, hi)
    if lo > hi:
        raise ValueError(f"cortado.testing.feeds: no {var.dtype.name} value lies in [{lo}, {hi}] for {var.name!r}")
    return hnp.arrays(drawn, var.shape, elements=elements).map(lambda array: array.astype(var.dtype, copy=False))


def feeds(graph, bounds=None):
    """A strategy of ``{name: array}`` for a ``RandomGraph`` or a list of variables, each value within ``bounds``
    (by default ``(-2.0, 2.0)``); a ``RandomGraph``'s values also within the bounds of each of its inputs that keep
    its values finite and well-conditioned."""
    if isinstance(graph, RandomGraph):
        variables = graph.inputs
        low, high = (-math.inf, math.inf) if bounds is None else bounds
        ranges = {name: (max(lo, low), min(hi, high)) for name, (lo, hi) in graph.bounds.items()}
    else:
        variables = list(graph)
        ranges = {v.name: (-2.0, 2.0) if bounds is None else bounds for v in variables}
    return st.fixed_dictionaries({v.name: _array(v, *ranges[v.name]) for v in variables})


@st.composite
def graphs_with_feeds(draw, **graph_options):
    """``(RandomGraph, feeds)``: a graph from ``graphs(**graph_options)`` and feeds for it."""
    graph = draw(graphs(**graph_options))
    return graph, draw(feeds(graph))
