"""Lowering for a GPU: contractions into ``gemm`` calls, composite reductions into the primitives a
generated kernel computes.

``gemm_lowering`` turns ``matmul`` into cuBLASLt's form and then folds what surrounds it into the
one call: a transpose of an operand into the operation flags, a scalar factor into ``alpha``, an
added term of the product's shape into ``beta`` and ``c``, an added row into the bias epilogue, a
``relu`` or ``gelu`` of it all into that epilogue, and a product times ``gelu_grad(z)`` (gelu's
backward) into the dgelu epilogue, which reads ``z``. A product used more than once is not folded into its
users (each would compute it again). ``composites`` spells ``logsumexp``, ``softmax`` and
``log_softmax`` out as max, exp, sum and log with the reference's own shifting, so fusion can
make a reduction kernel of each pass, in float32 for float16 and bfloat16 as the reference
computes them (a stored float16 sum of 100,000 exponentials would be infinite); a ``matmul`` no
GEMM takes (integers, a batch broadcast no single stride describes) becomes a broadcast product
summed over the contracted axis.
``einsum_lowering`` comes first: an einsum of two operands becomes transposes and reshapes around
one matmul (so a GEMM), any other einsum one broadcast product summed over the labels the output
lacks (a fused reduction).

    lowered = gpu_lowering.run(roots, trace)
"""

import functools
import math

import numpy as np

from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import BFLOAT16, is_float
from ..exprgraph.einsum import LABELS, spelled_out
from ..exprgraph.ops import OPS, gemm_operands
from ..exprgraph.semantics import IN_FLOAT32
from ..exprgraph.term import make
from ..exprgraph.graph import post_order
from .engine import Chain, Fixpoint, Postwalk, Rewrite, Rule, RuleSet, bottom_up

GEMM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)) + ((BFLOAT16,) if BFLOAT16 else ())
# cuBLASLt's gelu epilogues were up to 5e-7 (relative) off in float64 on the H200: float64 keeps its own kernel
GELU_EPILOGUE_DTYPES = tuple(d for d in GEMM_DTYPES if d != np.float64)


def gemm(a, b, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", c=None, bias=None, aux=None,
         output=0):
    """The term ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)`` (``aux``: the dgelu epilogue's gelu argument),
    or with ``output=1`` its epilogue's second result (see ``ops.TWO_RESULTS``)."""
    args = (a, b) + ((c,) if beta else ()) + ((bias,) if bias is not None else ()) + ((aux,) if aux is not None else ())
    return make(OPS["gemm"], args, OPS["gemm"].normalize(args, transpose_a, transpose_b, alpha, beta, epilogue, output))


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
    batch = b.term.shape[:-2]
    if not (_batch_strideable(x.shape, batch) and _batch_strideable(y.shape, batch)):
        return None
    return gemm(x, y)


def _swaps_last_two(t):
    if t.op.name != "transpose":
        return False
    axes = t.attrs[0]
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
    return g.op.name == "gemm" and g.attrs[5] == 0 and not b.shared(g)


def _scalar(t):
    """The value of a constant of one value, else None."""
    if t.op.name != "const":
        return None
    scalar = t.attrs[0].scalar
    return None if scalar is None else float(scalar)


def _gemm_and_other(b):
    for g, other, first in ((b["_x"], b["_y"], True), (b["_y"], b["_x"], False)):
        if _foldable(b, g) and g.shape == b.term.shape and g.dtype == b.term.dtype:
            return _parts(g), other, first
    return None, None, None


def _scale(b):
    parts, other, _ = _gemm_and_other(b)
    factor = None if parts is None else _scalar(other)
    if factor is None or parts["epilogue"] not in ("none", "dgelu") or not math.isfinite(factor):
        return None
    return gemm(**{**parts, "alpha": parts["alpha"] * factor, "beta": parts["beta"] * factor})


def _negate(b):
    g = b["_x"]
    if not _foldable(b, g):
        return None
    parts = _parts(g)
    if parts["epilogue"] not in ("none", "dgelu"):  # both linear in the product
        return None
    return gemm(**{**parts, "alpha": -parts["alpha"], "beta": -parts["beta"]})


def _added(b, sign):
    """``g + other`` (sign 1) or, with ``g`` on either side, ``g - other`` / ``other - g`` (sign -1)."""
    parts, other, first = _gemm_and_other(b)
    if parts is None or parts["epilogue"] not in ("none", "bias") or other.dtype != b.term.dtype:
        return None
    if sign < 0 and not first:  # other - g: negate the product, which a bias cannot follow
        if parts["bias"] is not None:
            return None
        parts = {**parts, "alpha": -parts["alpha"], "beta": -parts["beta"]}
    other_sign = sign if first else 1.0
    if other.shape == b.term.shape and parts["c"] is None:
        return gemm(**{**parts, "beta": other_sign, "c": other})
    n = b.term.shape[-1]
    if other.shape == (n,) and b.term.ndim == 2 and parts["bias"] is None and other_sign > 0:
        return gemm(**{**parts, "epilogue": "bias", "bias": other})
    return None


def _activation(b, name):
    """``name(g)`` (relu or gelu) as the epilogue of ``g``, after its bias if it has one."""
    g = b["_x"]
    if not _foldable(b, g) or (name == "gelu" and g.dtype not in GELU_EPILOGUE_DTYPES):
        return None
    parts = _parts(g)
    if parts["epilogue"] not in ("none", "bias"):
        return None
    return gemm(**{**parts, "epilogue": name if parts["epilogue"] == "none" else f"bias_{name}"})


def _gelu_backward(b):
    """``g * gelu_grad(z)``: a plain product (no c, no epilogue) times gelu's slope at ``z``, as the
    dgelu epilogue, which reads ``z`` as a matrix of the product's layout (``n`` a multiple of 8)."""
    for g, slope in ((b["_x"], b["_y"]), (b["_y"], b["_x"])):
        if not (_foldable(b, g) and slope.op.name == "gelu_grad" and g.shape == b.term.shape and g.ndim == 2
                and g.dtype in GELU_EPILOGUE_DTYPES):
            continue
        parts, z = _parts(g), slope.args[0]
        if parts["epilogue"] == "none" and parts["c"] is None and z.shape == g.shape and z.dtype == g.dtype \
                and g.shape[-1] % 8 == 0:
            return gemm(**{**parts, "epilogue": "dgelu", "aux": z})
    return None


gemm_lowering = RuleSet([
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


# -- composites ------------------------------------------------------------------------------


def _as(x, dtype):
    return x if x.dtype == dtype else ct.cast(x, dtype)


def _computed(x):
    """``x`` in the dtype the softmax family computes in: float32 where ``IN_FLOAT32`` says so, else
    the float exp computes in."""
    if IN_FLOAT32["softmax"](x.dtype):
        return ct.cast(x, "float32")
    return x if is_float(x.dtype) else ct.cast(x, ct.exp(x).dtype)


def _shifted(x, axes):
    """``(x - peak, peak)`` with the max over ``axes`` kept, infinite maxima replaced by 0 (as the reference)."""
    x = _computed(x)
    peak = ct.max(x, axis=axes, keepdims=True)
    peak = ct.where(ct.less(ct.abs(peak), np.inf), peak, 0.0)
    return ct.subtract(x, peak), peak


def _logsumexp(b):
    x, axes = b["_x"], b.term.attrs[0]
    shifted, peak = _shifted(x, axes)
    total = ct.add(ct.log(ct.sum(ct.exp(shifted), axis=axes, keepdims=True)), peak)
    return _as(ct.reshape(total, b.term.shape), b.term.dtype)


def _softmax(b):
    shifted, _ = _shifted(b["_x"], b.term.attrs[0])
    e = ct.exp(shifted)
    return _as(ct.divide(e, ct.sum(e, axis=b.term.attrs[0], keepdims=True)), b.term.dtype)


def _log_softmax(b):
    axes = b.term.attrs[0]
    shifted, _ = _shifted(b["_x"], axes)
    return _as(ct.subtract(shifted, ct.log(ct.sum(ct.exp(shifted), axis=axes, keepdims=True))), b.term.dtype)


def _matmul_as_reduction(b):
    """``sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)``: any matmul, as one fused reduction."""
    x, y, term = b["_a"], b["_b"], b.term
    rows = ct.reshape(x, (1, x.shape[0])) if x.ndim == 1 else x
    cols = ct.reshape(y, (y.shape[0], 1)) if y.ndim == 1 else y
    product = ct.multiply(ct.reshape(rows, rows.shape + (1,)), ct.reshape(cols, cols.shape[:-2] + (1,) + cols.shape[-2:]))
    total = ct.sum(product, axis=-2)
    return ct.reshape(ct.cast(total, term.dtype), term.shape)


composites = RuleSet([
    Rule("expand-logsumexp", "logsumexp(_x, axis=_a, keepdims=_k)", _logsumexp),
    Rule("expand-softmax", "softmax(_x, axis=_a)", _softmax),
    Rule("expand-log-softmax", "log_softmax(_x, axis=_a)", _log_softmax),
    Rule("matmul-as-reduction", "matmul(_a, _b)", _matmul_as_reduction),
], name="composites")

# -- einsum ---------------------------------------------------------------------------------


def _reordered(labels, x, order):
    """``x``, whose axes ``labels`` name, with its axes in ``order`` (a permutation of ``labels``)."""
    order = list(order)
    return x if order == list(labels) else ct.transpose(x, tuple(labels.index(label) for label in order))


def _einsum_as_matmul(b):
    """Two operands of the result's GEMM dtype, no diagonal, no broadcast label: batch, free and
    contracted labels gathered into the three axes of one matmul."""
    xs, term = b["_xs"], b.term
    if len(xs) != 2 or term.dtype not in GEMM_DTYPES or any(x.dtype != term.dtype for x in xs) or term.size == 0:
        return None
    inputs, output = spelled_out(b["_s"], [x.shape for x in xs])
    sizes = {}
    for labels, x in zip(inputs, xs):
        if len(set(labels)) != len(labels) or any(sizes.setdefault(label, d) != d for label, d in zip(labels, x.shape)):
            return None
    operands = []
    for labels, other, x in zip(inputs, inputs[::-1], xs):
        alone = [i for i, label in enumerate(labels) if label not in other and label not in output]
        if alone:  # summed away by this operand alone: summed first
            x, labels = ct.sum(x, axis=tuple(alone)), "".join(label for i, label in enumerate(labels) if i not in alone)
        operands.append((labels, x))
    (la, a), (lb, y) = operands
    batch = [label for label in output if label in la and label in lb]
    left = [label for label in output if label in la and label not in lb]
    right = [label for label in output if label in lb and label not in la]
    contracted = [label for label in la if label in lb and label not in output]
    lead = (math.prod(sizes[label] for label in batch),) if batch else ()

    def gathered(labels, x, first, second):
        sides = (math.prod(sizes[label] for label in first), math.prod(sizes[label] for label in second))
        return ct.reshape(_reordered(labels, x, batch + first + second), lead + sides)

    product = ct.matmul(gathered(la, a, left, contracted), gathered(lb, y, contracted, right))
    product = ct.reshape(product, tuple(sizes[label] for label in batch + left + right))
    return _reordered(batch + left + right, product, output)


def _distinct(inputs, operands, dtype):
    """``(labels, operand)`` pairs with no label repeated within one: a repeat (a diagonal) becomes a
    fresh label tied to the first by an identity matrix."""
    fresh = iter(label for label in LABELS if label not in "".join(inputs))
    terms = []
    for labels, x in zip(inputs, operands):
        own = ""
        for label, size in zip(labels, x.shape):
            if label in own:
                twin = next(fresh)
                terms.append((label + twin, ct.const(np.eye(size, dtype=dtype))))
                label = twin
            own += label
        terms.append((own, x))
    return terms


def _einsum_as_product(b):
    """Any einsum: the product of its operands, each aligned to one order of all labels (the output's
    first), summed over the labels the output lacks."""
    term = b.term
    inputs, output = spelled_out(b["_s"], [x.shape for x in b["_xs"]])
    terms = _distinct(inputs, [_as(x, term.dtype) for x in b["_xs"]], term.dtype)
    order = output + "".join(sorted({label for labels, _ in terms for label in labels} - set(output)))
    aligned = []
    for labels, x in terms:
        mine = [label for label in order if label in labels]
        x = _reordered(labels, x, mine)
        aligned.append(ct.reshape(x, tuple(x.shape[mine.index(label)] if label in labels else 1 for label in order)))
    product = functools.reduce(ct.multiply, aligned)
    if len(order) > len(output):
        product = ct.sum(product, axis=tuple(range(len(output), len(order))))
    return ct.broadcast_to(_as(product, term.dtype), term.shape)


einsum_lowering = RuleSet([
    Rule("einsum-as-matmul", "einsum(*_xs, subscripts=_s)", _einsum_as_matmul),
    Rule("einsum-as-product", "einsum(*_xs, subscripts=_s)", _einsum_as_product),
], name="einsum lowering")

# -- bias gradients ---------------------------------------------------------------------------

BGRAD_DTYPES = GELU_EPILOGUE_DTYPES


def _bias_gradient_sources(order):
    """``{matrix: (gemm, epilogue)}``: the column sums of a matrix that a gemm can compute on the side, with the
    epilogue that makes it do so. cuBLASLt (13, on the H200) sums an operand only where it reads it with the
    contracted axis first, as stored: ``b`` not transposed, ``a`` transposed (a weight gradient's ``x^T @ dy``)."""
    sources = {}
    for g in order:
        if g.op.name != "gemm" or g.ndim != 2 or g.dtype not in BGRAD_DTYPES:
            continue
        parts = _parts(g)
        if parts["output"] or parts["bias"] is not None:
            continue
        if parts["epilogue"] == "dgelu":
            sources.setdefault(g, (g, "dgelu_bgrad"))
        elif parts["epilogue"] == "none" and parts["a"].ndim == parts["b"].ndim == 2:
            if not parts["transpose_b"]:
                sources.setdefault(parts["b"], (g, "bgrad_b"))
            if parts["transpose_a"]:
                sources.setdefault(parts["a"], (g, "bgrad_a"))
    return sources


def bias_gradients(roots, trace=None, keep=frozenset()):
    """``roots`` with each ``sum(x, axis=0)`` of a matrix that a gemm can compute on the side (a bias gradient)
    taken from that gemm's second result: cuBLASLt's BGRAD epilogues reduce an operand over the contracted
    axis as they read it, and DGELU_BGRAD the product's columns as it writes them. One sum per gemm; the
    sums in ``keep`` stay reductions (the compiler keeps those a gemm would hold at the memory peak)."""
    order = post_order(roots)
    sources = _bias_gradient_sources(order)
    epilogue, taken_by = {}, {}
    for s in order:
        if s.op.name != "sum" or s.ndim != 1 or s.args[0].ndim != 2 or s in keep:
            continue
        summed, axes = s.args[0], s.attrs[0]
        if summed.op.name == "transpose":  # the row sums of x^T are the column sums of x
            summed, axes = summed.args[0], tuple(1 - axis for axis in axes)
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


class GpuLowering:
    """Lowering for a GPU: einsum into matmuls and products, then gemm everywhere (what is left of matmul
    becomes a reduction), then the bias gradients the gemms compute on the side (a pass over all roots at
    once: the sum and the gemm that can take it over are apart in the graph)."""

    local = Chain(Postwalk(einsum_lowering), Fixpoint(Postwalk(gemm_lowering)), Postwalk(composites))

    def run(self, roots, trace=None, keep_sums=frozenset()):
        return bias_gradients(self.local.run(list(roots), trace), trace, keep_sums)


gpu_lowering = GpuLowering()
