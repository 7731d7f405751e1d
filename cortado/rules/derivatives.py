"""``derivatives``: the vector-Jacobian product of every op, as rules (XGrad.jl's ``@diffrule``).

A rule matches a term of one op, as any rewrite rule does, and gives for each input (each
placeholder of its pattern) that input's VJP: an expression of the inputs, the output ``_y``
and the output's adjoint ``_dy``. ``exp(_x)`` gives ``_x`` the VJP ``_dy * _y``.
A VJP may keep the output's shape: the reverse-mode driver (``cortado.grad``) sums
a broadcast VJP down to its input's shape and casts it to its input's dtype, so the rules of
``add``, ``broadcast_to`` and ``cast`` are simply ``_dy``. A VJP of ``0`` contributes nothing.
VJPs are built from differentiable ops only, so gradients of gradients work.

Where a function has no derivative, the rules choose what PyTorch and JAX choose:

- ``relu`` and ``abs`` have derivative 0 at 0 (``abs``'s is ``sign``);
- ``maximum`` and ``minimum`` split a tie evenly: each input gets half (so ``maximum(x, x)``
  has derivative 1, as ``x`` has), and ``max`` over axes splits the adjoint evenly among the
  elements that attain the maximum;
- a NaN is not swallowed, as in PyTorch: ``max`` over a slice holding a NaN (whose maximum is
  NaN, equal to nothing) splits the adjoint evenly among its NaNs, as ``torch.max(x)`` does, so
  ``max_pool2d`` routes a window's adjoint to its NaN; ``maximum`` and ``minimum`` give each input
  the whole adjoint where either is NaN (no comparison holds, so neither loses), and ``relu`` gives
  a NaN the adjoint. (``torch.amax`` differs: its ``0 * inf`` makes the VJP NaN across a NaN slice.)
- ``sign``, ``rint``, the comparisons and ``where``'s condition are piecewise constant: derivative 0
  (``stop_gradient``'s is 0 by definition);
- ``sqrt`` at 0 and ``log`` at 0 have infinite derivatives, as in every framework, and
  ``x ** p`` with respect to ``p`` counts ``log(0)`` as 0, so ``0 ** p`` has derivative 0 in ``p``.
"""

import inspect
import math

import numpy as np

from ..errors import RewriteError
from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float, is_narrow_float
from ..exprgraph.einsum import LABELS, spelled_out
from ..exprgraph.numerics import GELU_CUBIC, GELU_SCALE, gelu_argument, gelu_slope
from ..exprgraph.scaling import pushed, scale_for
from ..exprgraph.ops import (
    ADD_AT, EQUAL, FLOOR_DIVIDE, GELU_GRAD, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, LOGICAL_AND, LOGICAL_NOT, LOGICAL_OR,
    LOGICAL_XOR, NOT_EQUAL, OPS, RINT, SIGN,
)
from ..exprgraph.graph import post_order
from ..exprgraph.term import Term, apply
from .attention_vjps import attention_grad_vjp, attention_vjp
from .convolution_vjps import conv_input_vjp, conv_weight_vjp, overlap_add_vjp, pad_vjp, windows_vjp
from .decompositions import places, reshaped, taken_places
from .engine import Rewrite, substitute
from .matching import Bindings, instantiate, match
from .patterns import Pattern, PatternNode, Placeholder, Splat, as_pattern, matchable, placeholder_names
from .primitives import in_primitives
from .reverse import backpropagate
from .domains import TENSOR, NotApplicable, op_name, tensor_problems


class Derivative:
    """The vector-Jacobian products (VJPs) of one op: ``Derivative("exp", "exp(_x)", _x="_dy * _y")``.

    ``pattern`` is a call of the op whose arguments are placeholders (a trailing splat for ops
    of any arity), binding each of the op's keywords to a placeholder; each keyword of the
    ``Derivative`` names one of the arguments and gives its VJP, as a text pattern over
    the pattern's placeholders, ``_y`` and ``_dy``, or as a function of the bindings (a splat's
    function also finds the argument's index within the splat as ``_i``).
    """

    def __init__(self, name, pattern, **vjps):
        self.name = name
        self.pattern = matchable(pattern)
        if not isinstance(self.pattern, PatternNode) or not all(
                isinstance(a, (Placeholder, Splat)) for a in self.pattern.args):
            raise RewriteError(f"derivative {name!r}: the pattern must be a call of one op on placeholders, "
                               f"not {self.pattern!r}")
        if not all(isinstance(v, Placeholder) for v in self.pattern.params.values()):
            raise RewriteError(f"derivative {name!r}: the attributes in {self.pattern!r} must be placeholders; "
                               f"the rule of an op covers every use of it (a VJP can look at their values)")
        self.op = op_name(self.pattern.head, len(self.pattern.args))  # its name; ``Derivatives`` keys by its record
        if self.op not in OPS or OPS[self.op].kind == "leaf":
            raise RewriteError(f"derivative {name!r}: {self.pattern.head!r} is no cortado op with inputs")
        self.inputs = tuple(a.name for a in self.pattern.args)
        if set(vjps) != set(self.inputs):
            raise RewriteError(f"derivative {name!r} gives VJPs for {sorted(vjps)} but its pattern "
                               f"{self.pattern!r} has the inputs {sorted(self.inputs)}: give one VJP each")
        self.vjps = {k: v if callable(v) and not isinstance(v, Pattern) else as_pattern(v) for k, v in vjps.items()}
        problems = tensor_problems(self.pattern) + self._left_out()
        if problems:
            raise RewriteError(f"derivative {name!r}: its pattern {self.pattern!r} cannot match every term of "
                               f"{self.op}: {'; '.join(problems)}")
        for k, vjp in self.vjps.items():
            problems = tensor_problems(vjp, replacement=True) if isinstance(vjp, Pattern) else []
            if problems:
                raise RewriteError(f"derivative {name!r}: the VJP of {k}, {vjp!r}, cannot be built: "
                                   f"{'; '.join(problems)}")
        known = set(placeholder_names(self.pattern)) | {"_y", "_dy"}
        for k, vjp in self.vjps.items():
            unbound = set(placeholder_names(vjp)) - known if isinstance(vjp, Pattern) else set()
            if unbound:
                raise RewriteError(f"derivative {name!r}: the VJP of {k} uses {', '.join(sorted(unbound))}, which "
                                   f"neither the pattern {self.pattern!r} binds nor is _y (the output) or _dy (its "
                                   f"adjoint)")

    def _left_out(self):
        """The op's keywords the pattern does not bind, as a problem: a rule covers every term of its op, and a
        keyword left out matches only the terms that have its default."""
        keywords = [k for k in inspect.signature(OPS[self.op].normalize).parameters if k != "args"]
        missing = [k for k in keywords if k not in self.pattern.params]
        if not missing:
            return []
        return [f"it leaves out {', '.join(f'{k}=' for k in missing)} (a derivative's pattern binds every keyword of "
                f"its op; {self.op}'s: {', '.join(f'{k}=' for k in keywords)})"]

    def vjp(self, term, position, adjoint, trace=None):
        """The VJP of ``adjoint`` (the adjoint of ``term``) with respect to ``term.args[position]``.

        A term of the output's shape or the input's, or None where the VJP is zero.
        """
        bound = match(self.pattern, term, TENSOR)
        if bound is None:
            raise RewriteError(f"derivative {self.name!r}: its pattern {self.pattern!r} does not match {term!r}")
        splat = self.pattern.splat is not None and position >= len(self.inputs) - 1
        name = self.inputs[-1] if splat else self.inputs[position]
        extra = {"_y": term, "_dy": adjoint}
        if splat:
            extra["_i"] = position - (len(self.inputs) - 1)
        bindings = Bindings({**bound, **extra}, term, TENSOR)
        vjp = self.vjps[name]
        try:
            result = instantiate(vjp, bindings, TENSOR) if isinstance(vjp, Pattern) else vjp(bindings)
        except NotApplicable as error:
            raise RewriteError(f"derivative {self.name!r} could not build the VJP of {name} for {term!r}: "
                               f"{error}") from None
        if not isinstance(result, Term):
            if result != 0:
                raise RewriteError(f"derivative {self.name!r}: the VJP of {name} is {result!r}; "
                                   f"a VJP is a term, or 0 for none")
            return None
        if trace is not None:
            trace.append(Rewrite(f"d{self.name}/d{name}", term, result))
        return result

    def __repr__(self):
        vjps = ", ".join(f"{k}={getattr(v, '__name__', v)!r}" for k, v in self.vjps.items())
        return f"Derivative({self.name!r}: {self.pattern!r}; {vjps})"


class Derivatives:
    """Derivative rules by op, in order; ``a + b`` is ``a`` with ``b``'s rules taking precedence."""

    def __init__(self, rules, name=None):
        self.rules = tuple(rules)
        for rule in self.rules:
            if not isinstance(rule, Derivative):
                raise RewriteError(f"a set of derivative rules holds Derivative rules, not {type(rule).__name__} {rule!r}")
        self.name = name
        self._by_op = {OPS[rule.op]: rule for rule in self.rules}  # by op record: ``vjp`` looks up a term's op

    def __add__(self, other):
        other = Derivatives([other]) if isinstance(other, Derivative) else other
        if not isinstance(other, Derivatives):
            return NotImplemented
        return Derivatives(self.rules + other.rules)

    def __iter__(self):
        return iter(self._by_op.values())

    def __len__(self):
        return len(self._by_op)

    def __getitem__(self, op):
        """The rule of the op named ``op`` (a KeyError naming the ops that have one, if none)."""
        try:
            return self._by_op[OPS[op]]
        except KeyError:
            names = sorted(rule.op for rule in self._by_op.values())
            raise KeyError(f"no derivative rule for {op!r}; rules exist for {', '.join(names)}") from None

    def vjp(self, term, position, adjoint, trace=None):
        rule = self._by_op.get(term.op)
        if rule is None and term.op.formula is not None:
            return self._through_formula(term, position, adjoint, trace)
        try:
            rule = self._by_op[term.op]
        except KeyError:
            raise RewriteError(f"no derivative rule for {term.op.name!r}, so {term!r} (built at "
                               f"{term.where_built}) cannot be differentiated") from None
        return rule.vjp(term, position, adjoint, trace)

    def _through_formula(self, term, position, adjoint, trace):
        """The VJP of a composite op with no rule of its own: its formula in primitives (``rules.primitives``) over
        a stand-in for each operand, walked in reverse, the stand-ins then replaced by the operands (so an operand
        read in two places gets the VJP of each place)."""
        stand_ins = [ct.var(f"_{k}", a.shape, a.dtype) for k, a in enumerate(term.args)]
        spelled = in_primitives(term, stand_ins)
        vjps = backpropagate(post_order([spelled]), [spelled], [adjoint], [stand_ins[position]], self, trace)
        vjp = vjps.get(stand_ins[position])
        return None if vjp is None else substitute(vjp, dict(zip(stand_ins, term.args)))

    def __repr__(self):
        return f"Derivatives({self.name or ''}: {', '.join(rule.op for rule in self._by_op.values())})"


# -- VJPs that need arithmetic on shapes and attributes --------------------------------------


def kept(reduced, shape, axes):
    """A reduction's result (or its adjoint) with the reduced ``axes`` of ``shape`` kept as size 1."""
    return reshaped(reduced, tuple(1 if i in axes else d for i, d in enumerate(shape)))


def _sum_vjp(b):
    x = b["_x"]
    return ct.broadcast_to(kept(b["_dy"], x.shape, b["_a"]), x.shape)


def _mean_vjp(b):
    """The adjoint over the count, as ``dy * (1 / n)`` (a float16 ``n`` past 65504 would be inf), taken in float32
    and rounded once for float16 and bfloat16: ``1 / n`` of a mean of 5 million float16 values, itself rounded to a
    float16 subnormal, made its gradient 11% small (and 0 past 3.4e7 values)."""
    x, dy = b["_x"], b["_dy"]
    count = math.prod(x.shape[a] for a in b["_a"])
    scaled = kept(dy * (1 / max(count, 1)) if not is_narrow_float(dy.dtype) else
                  ct.cast(ct.cast(dy, "float32") * (1 / max(count, 1)), dy.dtype), x.shape, b["_a"])
    return ct.broadcast_to(scaled, x.shape)


def _max_winners(x, peak):
    """Where ``x`` attains ``peak``, the maximum of its slice. A NaN wins: the maximum of a slice
    holding one is NaN, which equals nothing, so ``x != x`` (true at a NaN alone) must find it."""
    return ct.where(ct.not_equal(x, x), True, ct.equal(x, peak))


def _max_vjp(b):
    """The adjoint split evenly among the elements equal to the maximum (or among the NaNs, as
    PyTorch's ``max`` splits it), counted in float32 at least (float16 counts stop at 65504); the
    driver casts the VJP back."""
    x, axes = b["_x"], b["_a"]
    winners = _max_winners(x, kept(b["_y"], x.shape, axes))
    count = ct.sum(ct.cast(winners, np.promote_types(x.dtype, np.float32)), axis=axes, keepdims=True)
    return ct.where(winners, kept(b["_dy"], x.shape, axes) / count, 0)


def _logsumexp_vjp(b):
    x, axes = b["_x"], b["_a"]
    return kept(b["_dy"], x.shape, axes) * ct.softmax(x, axis=axes)


def _computed_wide(vjp):
    """``vjp(y, dy, axis)`` over float16 and bfloat16 values computed in float32 and rounded once, as PyTorch's kernels
    compute them: rounded op by op, a float16 softmax's gradient, whose difference cancels, was 3 times further
    from the exact one than PyTorch's (0.195 against 0.060, relative in norm, over rows of 50 logits of scale 4)."""
    def rule(b):
        y, dy, axis = b["_y"], b["_dy"], b["_a"]
        if not is_narrow_float(y.dtype):
            return vjp(y, dy, axis)
        return ct.cast(vjp(ct.cast(y, "float32"), ct.cast(dy, "float32"), axis), y.dtype)
    return rule


_softmax_vjp = _computed_wide(lambda y, dy, axis: y * (dy - ct.sum(dy * y, axis=axis, keepdims=True)))
_log_softmax_vjp = _computed_wide(lambda y, dy, axis: dy - ct.exp(y) * ct.sum(dy, axis=axis, keepdims=True))


def _swap_last(t):
    axes = list(range(t.ndim))
    axes[-2:] = axes[-1], axes[-2]
    return ct.transpose(t, axes)


def _with_axis(t):
    """``t[..., None]``: ``t`` with a trailing axis of size 1."""
    return ct.reshape(t, t.shape + (1,))


def _matmul_left(b):
    """``a``'s VJP in ``a @ w``: ``dy @ w.T``, or an outer or matrix-vector product where
    an operand is 1-d (the driver sums over a batch that ``a`` lacks)."""
    a, w, dy = b["_x"], b["_z"], b["_dy"]
    if w.ndim == 1:  # dy has a's shape without its last axis
        return (dy if dy.ndim == 0 else _with_axis(dy)) * w
    if a.ndim == 1:  # dy has w's batch and w's last axis
        if dy.ndim == 1:
            return w @ dy
        vjp = w @ _with_axis(dy)
        return ct.reshape(vjp, vjp.shape[:-1])
    return dy @ _swap_last(w)


def _matmul_right(b):
    """``w``'s VJP in ``a @ w``: ``a.T @ dy``, or an outer or vector-matrix product where
    an operand is 1-d; a batch of ``a`` against one matrix ``w`` is flattened into one GEMM."""
    a, w, dy = b["_x"], b["_z"], b["_dy"]
    if a.ndim == 1:
        if w.ndim == 1:
            return dy * a
        return _with_axis(a) * ct.reshape(dy, dy.shape[:-1] + (1, dy.shape[-1]))
    rows = math.prod(a.shape[:-1])
    if w.ndim == 1:  # every row of a, weighted by its element of dy
        return reshaped(dy, (rows,)) @ reshaped(a, (rows, a.shape[-1]))
    if w.ndim == 2 and a.ndim > 2:
        return ct.transpose(ct.reshape(a, (rows, a.shape[-1]))) @ ct.reshape(dy, (rows, dy.shape[-1]))
    return _swap_last(a) @ dy


def _float8_gradient_vjp(b):
    """``dy`` rounded to float8: scaled by a power of two (``scaling.scale_for``) of its own largest magnitude, or of
    the largest in the amax history where one is given (delayed scaling), cast (saturating), widened and scaled
    back, all exact but the one rounding to float8. The scales are powers of two so that the lowering may move them
    out of the float8 products that read this cotangent."""
    dy, history = b["_dy"], b["_history"]
    wide = ct.cast(dy, "float32")
    amax = ct.max(history[0]) if history else ct.max(ct.abs(wide))
    scale = scale_for(amax, b["_d"])
    rounded = ct.cast(ct.cast(wide * scale, b["_d"]), "float32") * (1 / scale)
    return rounded if dy.dtype == np.float32 else ct.cast(rounded, dy.dtype)


def _float8_history_vjp(b):
    """The amax history's next value, as its "gradient" (``ct.float8_gradient``): the cotangent's largest magnitude
    pushed in front."""
    return pushed(b["_history"][0], ct.max(ct.abs(ct.cast(b["_dy"], "float32"))))


def _gelu_grad_vjp(b):
    """``dy * gelu''(x)``, in differentiable ops. With ``z`` the gelu argument, ``s = sigmoid(z)``
    and ``t = sigmoid(-z)`` (so ``s' = s t z'`` and ``1 - 2s = t - s``), ``gelu' = s + x z' s t`` and
    ``gelu'' = s t (2 z' + x z'' + x z'^2 (t - s))``, where ``2 z' + x z'' = 4 GELU_SCALE (1 + 6 GELU_CUBIC x^2)``.
    Products start from ``s t``, which is 0 far out, so the VJP is finite wherever ``x * x`` is; a
    float16 or bfloat16 ``x`` is taken in float32, as ``gelu_grad`` takes it (the driver casts back).
    """
    x = b["_x"]
    if GELU_GRAD.computes_in_float32(x.dtype):
        x = ct.cast(x, "float32")
    z, slope = gelu_argument(x), gelu_slope(x)
    s, t = ct.sigmoid(z), ct.sigmoid(-z)
    st = s * t
    return b["_dy"] * (st * ((x * x * (6 * GELU_CUBIC) + 1) * (4 * GELU_SCALE)) + st * x * slope * slope * (t - s))


def _power_base_vjp(b):
    """``dy * z * x ** (z - 1)`` (0 where ``z`` is 0), an integer exponent taken in the output's dtype first: its
    own ``z - 1`` wraps at its minimum (int8's -128 - 1 is 127)."""
    x, z, y = b["_x"], b["_z"], b["_y"]
    if z.dtype.kind in "iu" and is_float(y.dtype):
        z = ct.cast(z, y.dtype)
    return ct.where(ct.equal(z, 0), 0, b["_dy"] * z * x ** (z - 1))


def _power_exponent_vjp(b):
    """``dy * y * log(x)``, with ``log(0)`` counted as 0 and the log taken in the output's dtype
    (an int8 base would take it in float16)."""
    x, y = b["_x"], b["_y"]
    return b["_dy"] * y * ct.log(ct.where(ct.equal(x, 0), 1, ct.cast(x, y.dtype)))


def _transpose_vjp(b):
    return ct.transpose(b["_dy"], tuple(np.argsort(b["_p"]).tolist()))


def _reshape_vjp(b):
    return reshaped(b["_dy"], b["_x"].shape)


def _einsum_vjp(b):
    """The adjoint of operand ``_i``: one einsum of the output's adjoint and the other operands.

    ``...`` is first spelled out as labels. A label the operand repeats (a diagonal) is put back
    on the diagonal by identity matrices; a label no other term has at the operand's size (it was
    summed away, or broadcast from size 1) comes back through a vector of ones; where the operand
    has size 1 and broadcast, the driver sums.
    """
    operands, position = b["_xs"], b["_i"]
    inputs, output = spelled_out(b["_s"], [x.shape for x in operands])
    mine = inputs[position]
    terms = [(output, b["_dy"])] + [(labels, x) for k, (labels, x) in enumerate(zip(inputs, operands)) if k != position]
    available = {}  # label -> its size among the other terms, broadcast as einsum does (1 gives way)
    for labels, x in terms:
        for label, size in zip(labels, x.shape):
            available[label] = size if available.get(label, 1) == 1 else available[label]
    fresh = iter(label for label in LABELS if label not in available and label not in mine)
    result, seen = "", set()
    for label, size in zip(mine, operands[position].shape):
        if label in seen:  # a repeated label: its own axis, tied to the first by the identity
            twin = next(fresh)
            terms.append((label + twin, ct.const(np.eye(size, dtype=b["_dy"].dtype))))
            label = twin
        elif label not in available or (size != 1 and available[label] != size):  # summed away, or broadcast
            terms.append((label, ct.const(np.ones(size, dtype=b["_dy"].dtype))))
        seen.add(label)
        result += label
    return ct.einsum(",".join(labels for labels, _ in terms) + "->" + result, *(x for _, x in terms))


def _take_vjp(b):
    """The adjoint's rows added back where ``take`` took them, a repeated index's rows summed (``add_at``)."""
    axis = b["_a"]
    return apply(ADD_AT, (b["_dy"], b["_z"]), axis=axis, size=b["_x"].shape[axis])


def _take_along_axis_vjp(b):
    """Each element of the adjoint added back at the place its index picked along ``axis``: the indices compared
    with every place of the axis, the adjoint kept where they agree. With one index per row (a label) that is
    ``where(index == place, dy, 0)``; with more, the comparison takes a new axis after ``axis`` and the kept
    adjoint is summed over the indices' own extent."""
    x, indices, axis, dy = b["_x"], b["_z"], b["_a"], b["_dy"]
    size, trailing = x.shape[axis], x.ndim - axis - 1
    zero = ct.const(0, dy.dtype)
    if indices.shape[axis] == 1:
        spread = taken_places(indices, size)
        return ct.where(ct.equal(spread, places(size, spread.dtype, trailing)), dy, zero)
    spread = taken_places(_with_axis_after(indices, axis), size)
    kept_dy = ct.where(ct.equal(spread, places(size, spread.dtype, trailing)), _with_axis_after(dy, axis), zero)
    return ct.sum(kept_dy, axis=axis)


def _with_axis_after(t, axis):
    """``t`` with a new axis of size 1 after ``axis``."""
    return ct.reshape(t, t.shape[:axis + 1] + (1,) + t.shape[axis + 1:])


# -- the rules -------------------------------------------------------------------------------

NOT_DIFFERENTIABLE = (SIGN, RINT, FLOOR_DIVIDE, LESS, LESS_EQUAL, GREATER, GREATER_EQUAL, EQUAL, NOT_EQUAL,
                      LOGICAL_AND, LOGICAL_OR, LOGICAL_XOR, LOGICAL_NOT)


def _constant_rule(op):
    """``op``'s output is piecewise constant in its inputs: every VJP is 0."""
    names = ["_x", "_z"][:op.arity]
    return Derivative(op.name, f"{op.name}({', '.join(names)})", **dict.fromkeys(names, "0"))


derivatives = Derivatives([
    Derivative("negative", "-_x", _x="-_dy"),
    Derivative("add", "_x + _z", _x="_dy", _z="_dy"),
    Derivative("subtract", "_x - _z", _x="_dy", _z="-_dy"),
    Derivative("multiply", "_x * _z", _x="_dy * _z", _z="_dy * _x"),
    Derivative("divide", "_x / _z", _x="_dy / _z", _z="-(_dy * _y) / _z"),
    # x % z = x - floor(x / z) * z, the floor piecewise constant (PyTorch's rule)
    Derivative("remainder", "_x % _z", _x="_dy", _z="-(_dy * (_x // _z))"),
    Derivative("power", "_x ** _z", _x=_power_base_vjp, _z=_power_exponent_vjp),
    # a NaN makes every comparison false, so neither input loses and each gets the whole adjoint (PyTorch's rule)
    Derivative("maximum", "maximum(_x, _z)",
               _x="where(_x < _z, 0, where(_x == _z, _dy / 2, _dy))",
               _z="where(_z < _x, 0, where(_x == _z, _dy / 2, _dy))"),
    Derivative("minimum", "minimum(_x, _z)",
               _x="where(_x > _z, 0, where(_x == _z, _dy / 2, _dy))",
               _z="where(_z > _x, 0, where(_x == _z, _dy / 2, _dy))"),
    Derivative("exp", "exp(_x)", _x="_dy * _y"),
    Derivative("log", "log(_x)", _x="_dy / _x"),
    Derivative("log1p", "log1p(_x)", _x="_dy / (1 + _x)"),
    Derivative("expm1", "expm1(_x)", _x="_dy * (_y + 1)"),
    Derivative("sqrt", "sqrt(_x)", _x="_dy / (2 * _y)"),
    Derivative("tanh", "tanh(_x)", _x="_dy * (1 - _y * _y)"),
    Derivative("sin", "sin(_x)", _x="_dy * cos(_x)"),
    Derivative("cos", "cos(_x)", _x="-(_dy * sin(_x))"),
    Derivative("sigmoid", "sigmoid(_x)", _x="_dy * _y * (1 - _y)"),
    Derivative("softplus", "softplus(_x)", _x="_dy * sigmoid(_x)"),
    Derivative("gelu", "gelu(_x)", _x="_dy * gelu_grad(_x)"),
    Derivative("gelu_grad", "gelu_grad(_x)", _x=_gelu_grad_vjp),
    # read from the output, not the input (both are positive at the same elements): a training step then keeps the
    # activation alone, and its pre-activation can die inside the product that makes it (a GEMM's relu epilogue);
    # zero where the output is <= 0, so a NaN output gets the adjoint, as in PyTorch
    Derivative("relu", "relu(_x)", _x="where(_y <= 0, 0, _dy)"),
    Derivative("abs", "abs(_x)", _x="_dy * sign(_x)"),
    Derivative("where", "where(_c, _x, _z)", _c="0", _x="where(_c, _dy, 0)", _z="where(_c, 0, _dy)"),
    Derivative("cast", "cast(_x, dtype=_d)", _x="_dy"),
    *[_constant_rule(op) for op in NOT_DIFFERENTIABLE],
    Derivative("stop_gradient", "stop_gradient(_x)", _x="0"),  # by definition
    Derivative("float8_gradient", "float8_gradient(_x, *_history, dtype=_d)", _x=_float8_gradient_vjp,
               _history=_float8_history_vjp),
    Derivative("sum", "sum(_x, axis=_a, keepdims=_k)", _x=_sum_vjp),
    Derivative("mean", "mean(_x, axis=_a, keepdims=_k)", _x=_mean_vjp),
    Derivative("max", "max(_x, axis=_a, keepdims=_k)", _x=_max_vjp),
    Derivative("logsumexp", "logsumexp(_x, axis=_a, keepdims=_k)", _x=_logsumexp_vjp),
    Derivative("softmax", "softmax(_x, axis=_a)", _x=_softmax_vjp),
    Derivative("log_softmax", "log_softmax(_x, axis=_a)", _x=_log_softmax_vjp),
    Derivative("matmul", "_x @ _z", _x=_matmul_left, _z=_matmul_right),
    Derivative("einsum", "einsum(*_xs, subscripts=_s)", _xs=_einsum_vjp),
    Derivative("transpose", "transpose(_x, axes=_p)", _x=_transpose_vjp),
    Derivative("reshape", "reshape(_x, shape=_s)", _x=_reshape_vjp),
    Derivative("broadcast_to", "broadcast_to(_x, shape=_s)", _x="_dy"),
    Derivative("flip", "flip(_x, axis=_a)", _x="flip(_dy, axis=_a)"),
    Derivative("conv", "conv(_x, _w, strides=_s, padding=_p, lhs_dilation=_l, rhs_dilation=_r, groups=_g)",
               _x=conv_input_vjp, _w=conv_weight_vjp),
    Derivative("windows", "windows(_x, window_shape=_k, strides=_s, dilation=_d)", _x=windows_vjp),
    Derivative("overlap_add", "overlap_add(_x, shape=_n, strides=_s, dilation=_d)", _x=overlap_add_vjp),
    Derivative("pad", "pad(_x, pad_width=_w, constant_values=_c)", _x=pad_vjp),
    Derivative("take", "take(_x, _z, axis=_a)", _x=_take_vjp, _z="0"),
    Derivative("take_along_axis", "take_along_axis(_x, _z, axis=_a)", _x=_take_along_axis_vjp, _z="0"),
    Derivative("add_at", "add_at(_x, _z, axis=_a, size=_n)", _x="take(_dy, _z, axis=_a)", _z="0"),
    Derivative("random_uniform", "random_uniform(_s, _c, shape=_n, stream=_t)", _s="0", _c="0"),  # of its integer key: none
    Derivative("attention", "attention(_q, _k, _v, scale=_s, causal=_c)",
               _q=attention_vjp(0), _k=attention_vjp(1), _v=attention_vjp(2)),
    Derivative("attention_grad", "attention_grad(_q, _k, _v, _o, _g, scale=_s, causal=_c, result=_r)",
               _q=attention_grad_vjp(0, lambda: derivatives), _k=attention_grad_vjp(1, lambda: derivatives),
               _v=attention_grad_vjp(2, lambda: derivatives), _o="0",
               _g=attention_grad_vjp(3, lambda: derivatives)),
], name="derivatives")
