"""The GEMM target: the ``gemm`` op, cuBLASLt's form of a product, and the rules that build it.

``gemm`` is the GPU backend's own op, not the general table's: its attributes, shape, dtype and
reference semantics are here, and ``calls.cublaslt`` runs it. ``rules`` turn ``matmul`` into cuBLASLt's form
and then fold what surrounds it into the one call: a transpose of an operand into the operation
flags, a scalar factor into ``alpha``, an added term of the product's shape into ``beta`` and
``c``, an added row into the bias epilogue, a ``relu`` or ``gelu`` of it all into that epilogue,
and a product times ``gelu_grad(z)`` (gelu's backward) into the dgelu epilogue, which reads ``z``.
A product used more than once is not folded into its users (each would compute it again).
``finish`` then makes the gemm whose gelu and whose own value are both read (a training step's
``gelu(z)``, with ``z`` kept for gelu's backward) write both, and takes bias gradients from the gemms
that can compute them on the side; ``alternatives`` proposes planning again without those that a gemm
holds at the memory peak.
"""

import math

import numpy as np

from ....exprgraph import constructors as ct
from ....exprgraph.dtypes import BFLOAT16, is_float, is_narrow_float
from ....exprgraph.graph import post_order, users
from ....exprgraph.ops import BROADCAST_TO, CONST, GELU, GELU_GRAD, LOWERED, RESHAPE, SUM, TRANSPOSE, Op
from ....exprgraph.ops.base import broadcast_shapes
from ....exprgraph.semantics import implementation
from ....exprgraph.term import dtype_violation, make, shape_violation
from ....memplan import live_bytes
from ....rules.engine import Rewrite, Rule, RuleSet, bottom_up

# ``gemm(a, b[, c][, bias][, aux])``: what ``matmul`` lowers to for a BLAS library, cuBLASLt's form
# ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)``. ``op`` swaps the last two axes where
# ``transpose_a`` / ``transpose_b`` say; ``c`` is there when ``beta`` is not 0, ``bias`` (a row
# added to every row of the product) when the epilogue names it. The epilogue ``dgelu`` is gelu's
# backward: ``alpha * op(a) @ op(b) * gelu_grad(aux)``, ``aux`` the gelu argument of the forward
# pass (of the product's shape). Some epilogues have a second result, the term with ``output=1``
# (``output=0`` is the product): ``bgrad_a`` the sums of ``op(a)`` over the contracted axis (a
# bias gradient of length m), ``bgrad_b`` those of ``op(b)`` (length n), ``dgelu_bgrad`` the
# column sums of its dgelu product (length n), ``gelu_aux`` and ``bias_gelu_aux`` (gelu's result)
# the gelu's argument (the product's shape). Only lowering rules build gemms.
GEMM_EPILOGUES = ("none", "bias", "relu", "bias_relu", "gelu", "bias_gelu", "gelu_aux", "bias_gelu_aux", "dgelu",
                  "dgelu_bgrad", "bgrad_a", "bgrad_b")
BIAS_GRADIENT_RESULTS = ("dgelu_bgrad", "bgrad_a", "bgrad_b")  # the epilogues whose second result is a bias gradient
GELU_ARGUMENT_RESULTS = ("gelu_aux", "bias_gelu_aux")  # those whose second result is their gelu's argument
TWO_RESULTS = BIAS_GRADIENT_RESULTS + GELU_ARGUMENT_RESULTS


def gemm_operands(args, beta, epilogue):
    """``(a, b, c, bias, aux)`` of a gemm's arguments, None for those it has not."""
    a, b, *rest = args
    c = rest.pop(0) if beta else None
    bias = rest.pop(0) if "bias" in epilogue else None
    aux = rest.pop(0) if epilogue.startswith("dgelu") else None
    return a, b, c, bias, aux


def _gemm_shape(args, transpose_a, transpose_b, alpha, beta, epilogue, output):
    if epilogue not in GEMM_EPILOGUES:
        raise shape_violation(f"unknown epilogue {epilogue!r}; the epilogues are {GEMM_EPILOGUES}")
    if output not in ((0, 1) if epilogue in TWO_RESULTS else (0,)):
        raise shape_violation(f"the {epilogue} epilogue has no result {output}")
    if len(args) != 2 + bool(beta) + ("bias" in epilogue) + epilogue.startswith("dgelu"):
        raise shape_violation("gemm takes a, b, then c when beta is not 0, then bias when the epilogue adds one, "
                              "then the gelu argument when the epilogue is dgelu")
    if beta and epilogue.startswith("dgelu"):
        raise shape_violation("the dgelu epilogue scales the product alone: it takes no c")
    a, b, c, bias, aux = gemm_operands(args, beta, epilogue)
    if a.ndim < 2 or b.ndim < 2:
        raise shape_violation("gemm needs operands of rank 2 or more")
    if epilogue in TWO_RESULTS and (a.ndim, b.ndim) != (2, 2):
        raise shape_violation(f"the {epilogue} epilogue takes matrices, not batches of them")
    m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
    if k != k2:
        raise shape_violation(f"the contracted dimensions differ: {k} and {k2}")
    out = broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
    if c is not None and c.shape != out:
        raise shape_violation(f"c has shape {c.shape}, the product {out}")
    if bias is not None and bias.shape != (n,):
        raise shape_violation(f"the bias has shape {bias.shape}; it must be ({n},)")
    if aux is not None and aux.shape != out:
        raise shape_violation(f"the gelu argument has shape {aux.shape}, the product {out}")
    if output and epilogue in BIAS_GRADIENT_RESULTS:
        return (m,) if epilogue == "bgrad_a" else (n,)
    return out


def _gemm_normalize(args, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", output=0):
    return (bool(transpose_a), bool(transpose_b), float(alpha) + 0.0, float(beta) + 0.0, epilogue, int(output))  # no -0.0


def _gemm_dtype(args, *attrs):
    dtypes = {a.dtype for a in args}
    if len(dtypes) != 1 or not is_float(next(iter(dtypes))):
        raise dtype_violation("gemm needs operands of one floating dtype")
    return args[0].dtype


def _reference(xs, transpose_a, transpose_b, alpha, beta, epilogue, output):
    """What a gemm computes, with NumPy (the reference interpreter's; float16 and bfloat16 come in float32)."""
    a, b, c, bias, aux = gemm_operands(xs, beta, epilogue)
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    if output and epilogue in BIAS_GRADIENT_RESULTS:  # sums over the contracted axis, or of the product's columns
        summed = {"bgrad_a": (a, -1), "bgrad_b": (b, -2)}.get(epilogue)
        x, axis = summed or (_reference(xs, transpose_a, transpose_b, alpha, beta, epilogue, 0), -2)
        return np.sum(x, axis=axis, dtype=np.promote_types(x.dtype, np.float32)).astype(x.dtype)
    dtype = a.dtype.type
    out = np.matmul(a, b) * dtype(alpha)
    if c is not None:
        out = out + dtype(beta) * c
    if bias is not None:
        out = out + bias
    if output:  # the gelu's argument
        return out
    if "gelu" in epilogue:  # in float32 for float16 and bfloat16, as the gelu ops (and cuBLASLt's epilogues) take them
        if epilogue.startswith("dgelu"):
            return out * implementation(GELU_GRAD)([aux.astype(out.dtype)])
        return implementation(GELU)([out])
    return np.maximum(out, dtype(0)) if "relu" in epilogue else out


def _evaluate(xs, *attrs):
    return _reference([x.astype(np.float32) if is_narrow_float(x.dtype) else x for x in xs], *attrs)


GEMM = Op("gemm", None, ("transpose_a", "transpose_b", "alpha", "beta", "epilogue", "output"), _gemm_shape,
          _gemm_dtype, LOWERED, _gemm_normalize,
          results=lambda transpose_a, transpose_b, alpha, beta, epilogue, output: 2 if epilogue in TWO_RESULTS else 1,
          result_attr="output", evaluate=_evaluate)

GEMM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)) + ((BFLOAT16,) if BFLOAT16 else ())
# cuBLASLt's gelu epilogues were up to 5e-7 (relative) off in float64 on the H200: float64 keeps its own kernel
GELU_EPILOGUE_DTYPES = tuple(d for d in GEMM_DTYPES if d != np.float64)


def gemm(a, b, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", c=None, bias=None, aux=None,
         output=0):
    """The term ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)`` (``aux``: the dgelu epilogue's gelu argument),
    or with ``output=1`` its epilogue's second result (see ``ops.TWO_RESULTS``)."""
    args = (a, b) + ((c,) if beta else ()) + ((bias,) if bias is not None else ()) + ((aux,) if aux is not None else ())
    return make(GEMM, args, GEMM.normalize(args, transpose_a, transpose_b, alpha, beta, epilogue, output))


def _parts(g):
    """A gemm's attributes and operands as keywords of ``gemm``."""
    attrs = dict(zip(g.op.attr_names, g.attrs))
    a, b, c, bias, aux = gemm_operands(g.args, attrs["beta"], attrs["epilogue"])
    attrs.update(a=a, b=b, c=c, bias=bias, aux=aux)
    return attrs


def _batch_strideable(shape, batch):
    """Whether an operand's batch dimensions are all of ``batch`` or all broadcast: one batch stride."""
    own = shape[:-2]
    return own == batch or all(d == 1 for d in own)


def _matmul_to_gemm(b):
    x, y = b["_a"], b["_b"]
    if x.dtype != y.dtype or x.dtype not in GEMM_DTYPES or 0 in x.shape + y.shape:
        return None
    if x.ndim == 1 or y.ndim == 1:  # a vector is a one-row or one-column matrix
        rows = ct.reshape(x, (1, x.shape[0])) if x.ndim == 1 else x
        cols = ct.reshape(y, (y.shape[0], 1)) if y.ndim == 1 else y
        if rows.ndim > 2 or cols.ndim > 2:
            return None
        return ct.reshape(gemm(rows, cols), b.term.shape)
    if y.ndim == 2 and x.ndim > 2 and x.op not in (TRANSPOSE, BROADCAST_TO):
        # the batch folded into the rows: one matrix product, whose row epilogues (a bias, dgelu) apply (a permuted
        # or broadcast batch stays a strided batch, which cuBLASLt reads in place and a reshape would copy)
        rows = ct.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))
        return ct.reshape(gemm(rows, y), b.term.shape)
    batch = b.term.shape[:-2]
    if not (_batch_strideable(x.shape, batch) and _batch_strideable(y.shape, batch)):
        return None
    return gemm(x, y)


def _swaps_last_two(t):
    if t.op is not TRANSPOSE:
        return False
    axes = t.attr("axes")
    n = len(axes)
    return n >= 2 and axes == tuple(range(n - 2)) + (n - 1, n - 2)


def _fold_transposes(b):
    parts = _parts(b.term)
    changed = False
    for side in ("a", "b"):
        if _swaps_last_two(parts[side]):
            parts[side] = parts[side].args[0]
            parts[f"transpose_{side}"] = not parts[f"transpose_{side}"]
            changed = True
    return gemm(**parts) if changed else None


def _foldable(b, g):
    """A gemm this rule may rewrite: nothing else uses it (and it is a product, not a second result)."""
    return g.op is GEMM and g.attr("output") == 0 and not b.shared(g)


def _product(b, t):
    """``(gemm, wrap)``: the gemm ``t`` is, itself or with its rows reshaped (a batch folded into them), that this
    rule may rewrite, and the function giving a rebuilt gemm ``t``'s shape again; ``(None, None)`` if none."""
    if t.op is RESHAPE and t.ndim > 2 and t.args[0].ndim == 2 and t.shape[-1] == t.args[0].shape[-1] \
            and not b.shared(t):
        g = t.args[0]
        return (g, lambda rebuilt: ct.reshape(rebuilt, t.shape)) if _foldable(b, g) else (None, None)
    return (t, lambda rebuilt: rebuilt) if _foldable(b, t) else (None, None)


def _scalar(t):
    """The value of a constant of one value, else None."""
    if t.op is not CONST:
        return None
    scalar = t.attr("value").scalar
    return None if scalar is None else float(scalar)


def _gemm_and_other(b):
    """``(parts, wrap, other, first)`` of a binary term of a gemm (see ``_product``) and another operand."""
    for t, other, first in ((b["_x"], b["_y"], True), (b["_y"], b["_x"], False)):
        g, wrap = _product(b, t)
        if g is not None and t.shape == b.term.shape and g.dtype == b.term.dtype:
            return _parts(g), wrap, other, first
    return None, None, None, None


def _scale(b):
    parts, wrap, other, _ = _gemm_and_other(b)
    factor = None if parts is None else _scalar(other)
    if factor is None or parts["epilogue"] not in ("none", "dgelu") or not math.isfinite(factor):
        return None
    return wrap(gemm(**{**parts, "alpha": parts["alpha"] * factor, "beta": parts["beta"] * factor}))


def _negate(b):
    g, wrap = _product(b, b["_x"])
    if g is None:
        return None
    parts = _parts(g)
    if parts["epilogue"] not in ("none", "dgelu"):  # both linear in the product
        return None
    return wrap(gemm(**{**parts, "alpha": -parts["alpha"], "beta": -parts["beta"]}))


def _added(b, sign):
    """``g + other`` (sign 1) or, with ``g`` on either side, ``g - other`` / ``other - g`` (sign -1)."""
    parts, wrap, other, first = _gemm_and_other(b)
    if parts is None or parts["epilogue"] not in ("none", "bias") or other.dtype != b.term.dtype:
        return None
    if sign < 0 and not first:  # other - g: negate the product, which a bias cannot follow
        if parts["bias"] is not None:
            return None
        parts = {**parts, "alpha": -parts["alpha"], "beta": -parts["beta"]}
    other_sign = sign if first else 1.0
    if other.shape == b.term.shape and parts["c"] is None:
        rows = gemm(**parts).shape
        return wrap(gemm(**{**parts, "beta": other_sign, "c": other if other.shape == rows else ct.reshape(other, rows)}))
    n = b.term.shape[-1]
    if other.shape == (n,) and parts["a"].ndim == parts["b"].ndim == 2 and parts["bias"] is None and other_sign > 0:
        return wrap(gemm(**{**parts, "epilogue": "bias", "bias": other}))
    return None


def _activation(b, name):
    """``name(g)`` (relu or gelu) as the epilogue of ``g``, after its bias if it has one."""
    g, wrap = _product(b, b["_x"])
    if g is None or (name == "gelu" and g.dtype not in GELU_EPILOGUE_DTYPES):
        return None
    parts = _parts(g)
    if parts["epilogue"] not in ("none", "bias"):
        return None
    return wrap(gemm(**{**parts, "epilogue": name if parts["epilogue"] == "none" else f"bias_{name}"}))


def _gelu_backward(b):
    """``g * gelu_grad(z)``: a plain product (no c, no epilogue) times gelu's slope at ``z``, as the
    dgelu epilogue, which reads ``z`` as a matrix of the product's layout (``n`` a multiple of 8)."""
    for t, slope in ((b["_x"], b["_y"]), (b["_y"], b["_x"])):
        g, wrap = _product(b, t)
        if not (g is not None and slope.op is GELU_GRAD and t.shape == b.term.shape and g.ndim == 2
                and g.dtype in GELU_EPILOGUE_DTYPES):
            continue
        parts, z = _parts(g), slope.args[0]
        if parts["epilogue"] == "none" and parts["c"] is None and z.shape == t.shape and z.dtype == g.dtype \
                and g.shape[-1] % 8 == 0:
            return wrap(gemm(**{**parts, "epilogue": "dgelu", "aux": z if z.shape == g.shape else ct.reshape(z, g.shape)}))
    return None


rules = RuleSet([
    Rule("matmul-to-gemm", "matmul(_a, _b)", _matmul_to_gemm),
    Rule("gemm-transpose", "gemm(*_xs, transpose_a=_ta, transpose_b=_tb, alpha=_al, beta=_be, epilogue=_ep)",
         _fold_transposes),
    Rule("gemm-scale", "multiply(_x, _y)", _scale),
    Rule("gemm-negate", "negative(_x)", _negate),
    Rule("gemm-add", "add(_x, _y)", lambda b: _added(b, 1.0)),
    Rule("gemm-subtract", "subtract(_x, _y)", lambda b: _added(b, -1.0)),
    Rule("gemm-relu", "relu(_x)", lambda b: _activation(b, "relu")),
    Rule("gemm-gelu", "gelu(_x)", lambda b: _activation(b, "gelu")),
    Rule("gemm-dgelu", "multiply(_x, _y)", _gelu_backward),
], name="gemm lowering")


# -- bias gradients ---------------------------------------------------------------------------

BGRAD_DTYPES = GELU_EPILOGUE_DTYPES
# Past this many rows cuBLASLt's DGELU_BGRAD is slower than DGELU and a fused column sum after it (H100, bf16,
# 3072 columns over 768: 1024 rows 42 us against 33 for DGELU; 4096 rows 143 against 62; 8192 rows 261 against 106)
DGELU_BGRAD_MOST_ROWS = 1024


def _bias_gradient_sources(order):
    """``{matrix: (gemm, epilogue)}``: the column sums of a matrix that a gemm can compute on the side, with the
    epilogue that makes it do so. cuBLASLt (13, on the H200) sums an operand only where it reads it with the
    contracted axis first, as stored: ``b`` not transposed, ``a`` transposed (a weight gradient's ``x^T @ dy``)."""
    sources = {}
    for g in order:
        if g.op is not GEMM or g.ndim != 2 or g.dtype not in BGRAD_DTYPES:
            continue
        parts = _parts(g)
        if parts["output"] or parts["bias"] is not None:
            continue
        if parts["epilogue"] == "dgelu" and g.shape[0] <= DGELU_BGRAD_MOST_ROWS:
            sources.setdefault(g, (g, "dgelu_bgrad"))
        elif parts["epilogue"] == "none" and parts["a"].ndim == parts["b"].ndim == 2:
            for side, summed in (("b", not parts["transpose_b"]), ("a", parts["transpose_a"])):
                if summed:
                    sources.setdefault(_rows_of(parts[side]), (g, f"bgrad_{side}"))
    return sources


def _rows_of(t):
    """The value whose rows ``t`` is, through any reshapes that only merge or split leading axes (the last kept):
    the sums over all but the last axis of each of them are the same column sums, found under this one key."""
    while t.op is RESHAPE and t.ndim >= 2 and t.args[0].ndim >= 2 and t.args[0].shape[-1] == t.shape[-1]:
        t = t.args[0]
    return t


def _column_sum(s):
    """``(value, axes)`` of sum ``s`` as a sum of a matrix's columns where it is one: over axis 0 of a matrix, the
    rows of a transposed matrix, or all but the last axis of a value (of its matrix where it reshapes one)."""
    summed, axes = s.args[0], s.attr("axes")
    if summed.op is TRANSPOSE and summed.ndim == 2:  # the row sums of x^T are the column sums of x
        summed, axes = summed.args[0], tuple(1 - axis for axis in axes)
    if axes == tuple(range(summed.ndim - 1)):
        return _rows_of(summed), (0,)
    return summed, axes


def _gelu_of_a_kept_product(h, readers):
    """``(gemm, its reshape or None)`` where ``h`` is the gelu of a gemm's product (no epilogue, or a bias; its rows
    maybe reshaped) that other terms read too, as a training step's gelu backward does; else None."""
    t = h.args[0]
    reshaped = t if t.op is RESHAPE and t.ndim > 2 and t.args[0].ndim == 2 and t.shape[-1] == t.args[0].shape[-1] else None
    g = reshaped.args[0] if reshaped is not None else t
    if g.op is not GEMM or g.attr("output") or g.ndim != 2 or g.dtype not in GELU_EPILOGUE_DTYPES or g.shape[-1] % 8:
        return None
    parts = _parts(g)
    others = [r for r, _ in readers[g] if r is not reshaped]
    if reshaped is not None:
        others += [r for r, _ in readers[t] if r is not h]
    if parts["epilogue"] not in ("none", "bias") or parts["c"] is not None or not others:
        return None
    return g, reshaped


def _with_gelu_arguments(roots, trace):
    """``roots`` with each gelu of a gemm's product that other terms read too (``_gelu_of_a_kept_product``) and
    that product made by one gemm, which writes both (cuBLASLt's GELU_AUX epilogues: result 0 the gelu, result 1
    the product) instead of a product written, read back and written again as its gelu. A reader of the gelu
    (through reshapes) that must wait for another of its readers (a weight gradient, in the backward pass) reads the
    gelu of result 1 instead, computed where it runs, so that result 0 is not held until then."""
    order = post_order(roots)
    readers = users(order)
    found = {h: kept for h in order if h.op is GELU and (kept := _gelu_of_a_kept_product(h, readers)) is not None}
    if not found:
        return list(roots)
    late = {}  # a reader that waits for another: the gelu, or reshapes of it, that it reads
    for h in found:
        read = _read_through_reshapes(h, readers)
        for r, views in read.items():
            if any(o is not r and o in post_order([r]) for o in read):
                late[r] = views
    products, made, computed_late = {g: h for h, (g, _) in found.items()}, {}, {}

    def late_form(v):
        """``v`` (a gelu, or a reshape of one) as its late readers read it: the gelu of the gemm's result 1."""
        if v not in computed_late:
            computed_late[v] = v.rebuild((memo[v.args[0]] if v in found else late_form(v.args[0]),))
        return computed_late[v]

    def finish(original, rebuilt):
        if original in products:
            h = products[original]
            parts = {**_parts(rebuilt), "epilogue": "gelu_aux" if _parts(rebuilt)["bias"] is None else "bias_gelu_aux"}
            made[h] = gemm(**parts)
            if trace is not None:
                trace.append(Rewrite("gemm-gelu-argument", h, made[h]))
            return gemm(**{**parts, "output": 1})
        if original in found:
            return made[original] if found[original][1] is None else ct.reshape(made[original], original.shape)
        if original in late:
            swapped = {memo[v]: late_form(v) for v in late[original]}
            return rebuilt.rebuild(tuple(swapped.get(a, a) for a in rebuilt.args))
        return rebuilt

    memo = {}
    return [bottom_up(root, memo, finish) for root in roots]


def _read_through_reshapes(h, readers):
    """``{reader: the terms it reads among h and reshapes of h}``, looking through reshapes to what reads them."""
    read, frontier = {}, [h]
    while frontier:
        v = frontier.pop()
        for r, _ in readers[v]:
            if r.op is RESHAPE:
                frontier.append(r)
            else:
                read.setdefault(r, []).append(v)
    return read


def finish(roots, trace=None, keep=frozenset()):
    """``roots`` with the gelus of products read on their own too written by their gemms (``_with_gelu_arguments``)
    and each ``sum(x, axis=0)`` of a matrix that a gemm can compute on the side (a bias gradient) taken from that
    gemm's second result: cuBLASLt's BGRAD epilogues reduce an operand over the contracted axis as they read it,
    and DGELU_BGRAD the product's columns as it writes them. One sum per gemm; the sums in ``keep`` stay
    reductions (the compiler keeps those a gemm would hold at the memory peak)."""
    roots = _with_gelu_arguments(roots, trace)
    order = post_order(roots)
    sources = _bias_gradient_sources(order)
    epilogue, taken_by = {}, {}
    for s in order:
        if s.op is not SUM or s.ndim != 1 or s.args[0].ndim < 2 or s in keep:
            continue
        summed, axes = _column_sum(s)
        found = sources.get(summed) if axes == (0,) else None
        if found is not None and found[0] not in epilogue:
            epilogue[found[0]], taken_by[s] = found[1], found[0]
    if not epilogue:
        return list(roots)

    def finish(original, rebuilt):
        if original in epilogue:
            return gemm(**{**_parts(rebuilt), "epilogue": epilogue[original]})
        if original in taken_by:
            product = bottom_up(taken_by[original], memo, finish)
            result = gemm(**{**_parts(product), "output": 1})
            if trace is not None:
                trace.append(Rewrite("gemm-bias-gradient", original, result))
            return result
        return rebuilt

    memo = {}
    return [bottom_up(root, memo, finish) for root in roots]


def alternatives(planned):
    """The sums that gemms compute on the side (bias gradients) whose results are live where the arena holds
    the most (the gemm runs where every other buffer is live too), as the one variant worth planning:
    computed apart, such a sum can run earlier. ``planned`` is a ``backends.interface.PlannedStep``."""
    made_by = planned.made_by("lowering", "gemm-bias-gradient")
    if not made_by:
        return []
    plan = planned.plan
    live = live_bytes(plan.buffers, plan.steps)
    peaks = [i for i, total in enumerate(live) if total == max(live)]
    at_peak = frozenset(made_by[p.key] for p in plan.placements
                        if p.key in made_by and any(p.start <= i <= p.end for i in peaks))
    return [at_peak] if at_peak else []
