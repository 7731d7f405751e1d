"""Target-free decompositions: what no kernel computes as written, spelled out in ops that some do.

``composites`` spells ``logsumexp``, ``softmax`` and ``log_softmax`` out as max, exp, sum and log
with the reference's own shifting, so fusion can make a reduction kernel of each pass, in float32
for float16 and bfloat16 as the reference computes them (a stored float16 sum of 100,000
exponentials would be infinite); a ``matmul`` no target took (integers, a batch broadcast no single
stride describes) becomes a broadcast product summed over the contracted axis. ``einsum_lowering``
comes before any target's rules: an einsum of two floating operands becomes transposes and reshapes
around one matmul (for a GEMM to take), any other einsum one broadcast product summed over the
labels the output lacks (a fused reduction). A backend's lowering (``backends/<name>/lowering``)
runs them around its own targets' rules.
"""

import functools
import math

import numpy as np

from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float, is_float8, is_narrow_float
from ..exprgraph.einsum import LABELS, spelled_out
from ..exprgraph.ops import CONST, RESHAPE, SOFTMAX
from ..exprgraph.numerics import shifted
from .engine import Rule, RuleSet


# -- composites ------------------------------------------------------------------------------


def cast_to(x, dtype):
    """``x`` in ``dtype``: itself where it has it already, else cast."""
    return x if x.dtype == dtype else ct.cast(x, dtype)


def _computed(x):
    """``x`` in the dtype the softmax family computes in: float32 where ``Op.computes_in_float32`` says so, else
    the float exp computes in."""
    if SOFTMAX.computes_in_float32(x.dtype):
        return ct.cast(x, "float32")
    return x if is_float(x.dtype) else ct.cast(x, ct.exp(x).dtype)


def _shifted(x, axes):
    """``(x - peak, peak)`` as the reference shifts (``numerics.shifted``), in the dtype the family computes in."""
    return shifted(_computed(x), axes, ct)


def _logsumexp(b):
    x, axes = b["_x"], b.term.attr("axes")
    shifted, peak = _shifted(x, axes)
    total = ct.add(ct.log(ct.sum(ct.exp(shifted), axis=axes, keepdims=True)), peak)
    return cast_to(ct.reshape(total, b.term.shape), b.term.dtype)


def _softmax(b):
    shifted, _ = _shifted(b["_x"], b.term.attr("axes"))
    e = ct.exp(shifted)
    return cast_to(ct.divide(e, ct.sum(e, axis=b.term.attr("axes"), keepdims=True)), b.term.dtype)


def _log_softmax(b):
    axes = b.term.attr("axes")
    shifted, _ = _shifted(b["_x"], axes)
    return cast_to(ct.subtract(shifted, ct.log(ct.sum(ct.exp(shifted), axis=axes, keepdims=True))), b.term.dtype)


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

# -- large maxima in two stages ----------------------------------------------------------------

MAXIMUM_SPLIT = (1 << 16, 256)  # a max of this many elements into one value, over at least this many rows, splits


def _max_by_rows(b):
    """The max of every element of a large value (a float8 scale's amax) as the max of its rows' maxima: one block
    a row, then one for the rows, where one block for all its elements took milliseconds. The same value: max is
    associative and commutative, and NaN wins in both stages."""
    x, term = b["_x"], b.term
    if x.ndim < 2 or term.size != 1 or x.size < MAXIMUM_SPLIT[0] or x.size // x.shape[-1] < MAXIMUM_SPLIT[1]:
        return None
    stages = ct.max(ct.max(x, axis=-1, keepdims=True))
    return stages if stages.shape == term.shape else ct.reshape(stages, term.shape)


maxima_in_two_stages = RuleSet([Rule("max-by-rows", "max(_x, axis=_a, keepdims=_k)", _max_by_rows)],
                               name="maxima in two stages")

# -- gathers of one place a row ----------------------------------------------------------------


def taken_places(indices, size):
    """The places along an axis of ``size`` that ``indices`` name, found as a gather finds them: by a ``take`` from
    ``0 .. size - 1``. So a negative index counts from the end, one out of range is the same error on the CPU, and
    the GPU clamps it to the place its gathers read."""
    dtype = np.int32 if size <= np.iinfo(np.int32).max else np.int64
    return ct.take(places(size, dtype), indices, axis=0)


def wrapped_places(indices, size):
    """The places along an axis of ``size`` that the GPU's gathers read for ``indices``: a negative index counts from
    the end, one still out of range is clamped into the axis. Elementwise, so a kernel computes them from the
    indices it reads instead of a gather kernel storing them (``taken_places`` on the GPU, where a gather never
    raises)."""
    zero, last = ct.const(0, indices.dtype), ct.const(size - 1, indices.dtype)
    wrapped = ct.where(ct.less(indices, zero), indices + ct.const(size, indices.dtype), indices)
    return ct.minimum(ct.maximum(wrapped, zero), last)


def _places_wrapped(b):
    """``take(places(n), i, axis=0)``, ``taken_places``, as ``wrapped_places``: a cross-entropy's gradient kernel
    compares each label with its row's places itself."""
    table, indices = b["_t"], b["_z"]
    if table.op is not CONST or table.ndim != 1 or b.term.attr("axis") != 0:
        return None
    if table.shape[0] > np.iinfo(indices.dtype).max or indices.dtype.itemsize > table.dtype.itemsize:
        return None  # an index type that cannot count the places; a wider index keeps its gather
    if not np.array_equal(table.attr("value").array, np.arange(table.shape[0])):
        return None
    wrapped = wrapped_places(indices, table.shape[0])  # clamped into the places, so it fits their type too
    return wrapped if wrapped.dtype == table.dtype else ct.cast(wrapped, table.dtype)


def places(size, dtype, trailing=0):
    """The places ``0 .. size - 1`` of an axis, as a constant of ``dtype`` with ``trailing`` axes of size 1 after."""
    return ct.const(np.arange(size, dtype=dtype).reshape((size,) + (1,) * trailing))


def _row_pick(b):
    """``take_along_axis(x, i, axis=-1)`` with one index a row, where ``x`` is read elsewhere too, as the row's sum
    of ``x`` where its place is the index's: a reduction of the row, which a row kernel computes beside the row's
    others (a cross-entropy's label logit beside its logsumexp) instead of a gather reading the row back."""
    x, indices, axis = b["_x"], b["_z"], b.term.attr("axis")
    if x.ndim == 0 or axis != x.ndim - 1 or indices.shape != x.shape[:-1] + (1,) or x.shape[-1] < 2:
        return None
    if not b.shared(x):  # read by nothing else: a gather reads one element a row, a reduction the whole row
        return None
    if x.shape[-1] > np.iinfo(indices.dtype).max:
        return None  # a row longer than the index type counts
    spread = wrapped_places(indices, x.shape[-1])
    kept = ct.where(ct.equal(spread, places(x.shape[-1], spread.dtype)), x, ct.const(0, x.dtype))
    return ct.sum(kept, axis=-1, keepdims=True)


def _reshape_after(b):
    """``f(reshape(a), reshape(b))`` of ``a`` and ``b`` of one shape as ``reshape(f(a, b))``: the two values meet
    in the shape they were computed in, so one kernel can compute both and ``f`` (a per-row loss, each row's
    logsumexp less its label's logit)."""
    x, y = b["_x"], b["_y"]
    if not (x.op is RESHAPE and y.op is RESHAPE and x.args[0].shape == y.args[0].shape and x.shape == y.shape):
        return None
    return ct.reshape(b.term.rebuild([x.args[0], y.args[0]]), b.term.shape)


row_gathers = RuleSet([
    Rule("pick-by-row", "take_along_axis(_x, _z, axis=_a)", _row_pick),
    Rule("places-wrapped", "take(_t, _z, axis=_a)", _places_wrapped),
    *(Rule(f"{name}-before-reshape", f"{name}(_x, _y)", _reshape_after) for name in ("add", "subtract")),
], name="row gathers")

# -- einsum ---------------------------------------------------------------------------------


def reshaped(term, shape):
    """``term`` in ``shape`` (itself if it has it already)."""
    return term if term.shape == tuple(shape) else ct.reshape(term, shape)


def _reordered(labels, x, order):
    """``x``, whose axes ``labels`` name, with its axes in ``order`` (a permutation of ``labels``): a reshape where
    only axes of size 1 move (its elements stay in their order, so no copy is made of them), else a transpose."""
    order = list(order)
    if order == list(labels):
        return x
    axes = tuple(labels.index(label) for label in order)
    if [a for a in axes if x.shape[a] != 1] == [a for a in range(x.ndim) if x.shape[a] != 1]:
        return ct.reshape(x, tuple(x.shape[a] for a in axes))
    return ct.transpose(x, axes)


def _einsum_as_matmul(b):
    """Two operands of the result's floating dtype (or float8, whose products a matmul makes in it), no diagonal,
    no broadcast label: batch, free and contracted labels gathered into the three axes of one matmul. Not where a
    label of one operand alone is summed away: summed before the product, it would multiply sums instead of adding
    products (``(-inf + 1) * (-inf + 1)`` is inf where the einsum is NaN, and a sum can overflow where no product
    does), and as a free axis of the product, summed after it, it would write out a product that many times larger
    (two vectors' ``i,j->``: their outer product); the other einsum rules sum such products as they make them."""
    xs, term = b["_xs"], b.term
    if len(xs) != 2 or not is_float(term.dtype) or any(x.dtype != term.dtype and not is_float8(x.dtype) for x in xs) \
            or term.size == 0:
        return None
    inputs, output = spelled_out(b["_s"], [x.shape for x in xs])
    sizes = {}
    for labels, x in zip(inputs, xs):
        if len(set(labels)) != len(labels) or any(sizes.setdefault(label, d) != d for label, d in zip(labels, x.shape)):
            return None
    (la, a), (lb, y) = zip(inputs, xs)
    if any((label in la) != (label in lb) and label not in output for label in la + lb):
        return None
    batch = [label for label in output if label in la and label in lb]
    left = [label for label in output if label in la and label not in lb]
    right = [label for label in output if label in lb and label not in la]
    contracted = [label for label in la if label in lb and label not in output]
    lead = (math.prod(sizes[label] for label in batch),) if batch else ()

    def gathered(labels, x, first, second):
        sides = (math.prod(sizes[label] for label in first), math.prod(sizes[label] for label in second))
        return reshaped(_reordered(labels, x, batch + first + second), lead + sides)

    product = ct.matmul(gathered(la, a, left, contracted), gathered(lb, y, contracted, right))
    product = reshaped(product, tuple(sizes[label] for label in batch + left + right))
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
    first), summed over the labels the output lacks; of float16 or bfloat16 operands, in float32 and rounded once,
    as the einsum adds its products (each rounded to float16, ``300 * 300`` would be inf)."""
    term = b.term
    inputs, output = spelled_out(b["_s"], [x.shape for x in b["_xs"]])
    wide = np.dtype(np.float32) if is_narrow_float(term.dtype) else term.dtype
    terms = _distinct(inputs, [cast_to(x, wide) for x in b["_xs"]], wide)
    order = output + "".join(sorted({label for labels, _ in terms for label in labels} - set(output)))
    aligned = []
    for labels, x in terms:
        mine = [label for label in order if label in labels]
        x = _reordered(labels, x, mine)
        aligned.append(ct.reshape(x, tuple(x.shape[mine.index(label)] if label in labels else 1 for label in order)))
    product = functools.reduce(ct.multiply, aligned)
    if len(order) > len(output):
        product = ct.sum(product, axis=tuple(range(len(output), len(order))))
    return ct.broadcast_to(cast_to(product, term.dtype), term.shape)


EINSUM_AS_MATMUL = Rule("einsum-as-matmul", "einsum(*_xs, subscripts=_s)", _einsum_as_matmul)
einsum_lowering = RuleSet([
    EINSUM_AS_MATMUL,
    Rule("einsum-as-product", "einsum(*_xs, subscripts=_s)", _einsum_as_product),
], name="einsum lowering")
einsums_as_matmuls = RuleSet([EINSUM_AS_MATMUL], name="einsums as matmuls")  # the CPU's: np.einsum takes the rest
