"""NumPy's ``min``, ``clip``, ``argmax`` and ``argmin``, written with ops that already exist (as ``slicing`` is), so
that each has reference semantics, gradients and CPU and GPU kernels for free.

``min`` is ``max`` of ``x`` mapped exactly and in reverse order (``_reversed_order``: a float negated, a signed
integer's bits inverted), mapped back: NaN propagates, and its gradient splits a tie evenly, as ``max``'s does.
``clip`` is NumPy's ``minimum(maximum(x, low), high)``. ``argmax`` and ``argmin`` take the extreme of the axis, then
the first index holding it, as the largest of ``-index`` over the places that hold it (``-n`` elsewhere). A NaN
counts as the extreme, as in NumPy: where the extreme is NaN no element equals it, so the places that hold it are
the NaNs. The index is int64, as NumPy's; it has no gradient (an integer).

    ct.mean(ct.cast(ct.equal(ct.argmax(logits, axis=-1), labels), "float32"))   # a batch's accuracy
"""

import numpy as np

from ..errors import ShapeError
from . import constructors as ct
from .dtypes import is_float

__all__ = ["min", "clip", "argmax", "argmin"]


@ct._as_written
def min(x, axis=None, keepdims=False):  # noqa: A001 (NumPy's name)
    """The smallest element along ``axis`` (all of them where None), NaN where the slice holds one, as NumPy's."""
    x = ct.as_term(x)
    smallest = _reversed_order(ct.max(_reversed_order(x), axis=axis, keepdims=keepdims))
    return ct.cast(smallest, x.dtype) if smallest.dtype != x.dtype else smallest  # a bool's, through int8


@ct._as_written
def clip(x, low, high):
    """NumPy's ``clip``: ``minimum(maximum(x, low), high)``, a bound of None left out (not both)."""
    if low is None and high is None:
        raise ShapeError("clip: give low, high or both (NumPy's clip refuses neither)")
    x = ct.as_term(x)
    if low is not None:
        x = ct.maximum(x, low)
    return x if high is None else ct.minimum(x, high)


@ct._as_written
def argmax(x, axis=None, keepdims=False):
    """The index of the first largest element along ``axis`` (of the flattened ``x`` where None), a NaN counted
    largest; int64."""
    return _first_extreme("argmax", ct.as_term(x), axis, keepdims, largest=True)


@ct._as_written
def argmin(x, axis=None, keepdims=False):
    """The index of the first smallest element along ``axis`` (of the flattened ``x`` where None), a NaN counted
    smallest; int64."""
    return _first_extreme("argmin", ct.as_term(x), axis, keepdims, largest=False)


def _first_extreme(name, x, axis, keepdims, largest):
    if axis is not None and (not isinstance(axis, (int, np.integer)) or isinstance(axis, (bool, np.bool_))):
        raise ShapeError(f"{name}: axis is one int, or None for the flattened value (NumPy's), not {axis!r}")
    shape = x.shape
    if axis is None:
        x, axis = ct.reshape(x, (x.size,)), 0
    ordered = x if largest else _reversed_order(x)
    extreme = ct.max(ordered, axis=axis, keepdims=True)
    axis = axis % x.ndim  # (max has checked it)
    holds = ct.equal(ordered, extreme)
    if is_float(x.dtype):
        holds = ct.where(ct.not_equal(x, x), True, holds)
    n = x.shape[axis]
    places = np.arange(n, dtype=np.int64).reshape([n if a == axis else 1 for a in range(x.ndim)])
    first = ct.negative(ct.max(ct.where(holds, ct.const(-places), np.int64(-n)), axis=axis, keepdims=keepdims))
    if keepdims and len(shape) != x.ndim:  # a flattened x's index, with every axis of x kept
        first = ct.reshape(first, (1,) * len(shape))
    return first


def _reversed_order(x):
    """``x`` mapped, exactly and in reverse order, so that the largest of the result is where the smallest of ``x``
    is: a float negated; a signed integer as ``-1 - x`` (its bits inverted: the smallest becomes the largest, where
    negating it would overflow); an unsigned one subtracted from its type's largest; a bool as an int8."""
    if x.dtype == np.bool_:
        x = ct.cast(x, "int8")
    if is_float(x.dtype):
        return ct.negative(x)
    if x.dtype.kind == "u":
        return ct.subtract(ct.const(np.iinfo(x.dtype).max, x.dtype), x)
    return ct.subtract(ct.const(-1, x.dtype), x)

