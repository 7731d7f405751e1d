"""Reductions of one-value constants in closed form, so folding them costs nothing however large they are.

A gradient is full of them: ``ct.grad(sum(broadcast_to(s, (10**6, 10**6))), s)`` sums 10**12 ones. Summed
element by element that takes minutes (it did); in closed form it is one multiplication. The results are
NumPy's where NumPy's are exact (max, integer sums, which wrap as NumPy's do) and the exact value rounded
once to the result's dtype where NumPy's own float sum would round on the way.
"""

import math

import numpy as np

from ..exprgraph.dtypes import is_float
from ..exprgraph.ops import LOG_SOFTMAX, LOGSUMEXP, MAX, MEAN, SOFTMAX, SUM

REDUCTIONS = frozenset({SUM, MEAN, MAX, LOGSUMEXP, SOFTMAX, LOG_SOFTMAX})


def splat_reduction(term, value):
    """``term``, a reduction of a constant whose every element is ``value`` (a 0-d array), as a 0-d array of
    the result's dtype (its one value); None where ``term`` is no such reduction."""
    op = term.op
    if op not in REDUCTIONS:
        return None
    count = math.prod(term.args[0].shape[a] for a in term.attrs.axes)
    if op is MAX and count:
        return np.asarray(value).astype(term.dtype)
    if op is MEAN and count and is_float(term.dtype):  # the sum, as the reference takes it (overflowing where it does)
        wide = np.dtype(np.float32) if term.dtype.itemsize < 4 else term.dtype
        with np.errstate(all="ignore"):
            return np.asarray(_sum(value, count, wide) / wide.type(count)).astype(term.dtype)
    if op is SUM:
        return _sum(value, count, term.dtype)
    if not is_float(term.dtype) or not count:
        return None  # on no elements the reference's own rules decide (a mean of nothing is NaN)
    wide = float(value)
    closed = {
        LOGSUMEXP: wide + math.log(count) if math.isfinite(wide) else wide,
        SOFTMAX: 1.0 / count if math.isfinite(wide) else math.nan,
        LOG_SOFTMAX: -math.log(count) if math.isfinite(wide) else math.nan,
    }[op]
    return np.asarray(closed).astype(term.dtype)


def _sum(value, count, dtype):
    if not count:
        return np.zeros((), dtype)
    if is_float(dtype):
        with np.errstate(all="ignore"):  # overflow to inf, as the element-by-element sum would
            return np.asarray(float(value) * count).astype(dtype)
    total = int(value) * count % 2 ** (8 * dtype.itemsize)  # integers wrap, as NumPy's sums do
    return np.asarray(total, dtype=f"u{dtype.itemsize}").astype(dtype)
