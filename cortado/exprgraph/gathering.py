"""What ``take`` and ``take_along_axis`` compute, with NumPy, for the reference interpreter, constant folding and
the CPU backend alike: NumPy's ``take`` and ``take_along_axis``, whose indices may count from the end (``-1`` is the
last element), and an index outside ``[-n, n)`` refused with an error that names the op, the index and the axis
(NumPy's ``take_along_axis`` would wrap some silently, and its ``IndexError`` names neither)."""

import numpy as np

from ..errors import IndexRangeError


def checked(indices, size, op, axis):
    """``indices`` with negative ones counted from the end of an axis of ``size``; an error if any falls outside
    (its message starts with ``op``, where that is not None)."""
    indices = np.asarray(indices)
    if indices.dtype.kind == "u":
        outside = indices >= size
    else:
        indices = indices.astype(np.int64)  # an int8's -1 + 1000 must not wrap
        outside = (indices < -size) | (indices >= size)
    if outside.any():
        raise IndexRangeError(f"{op + ': ' if op else ''}index {indices[outside].flat[0]} is out of range for axis "
                              f"{axis} of size {size} (indices must lie in [{-size}, {size}))")
    return indices if indices.dtype.kind == "u" else np.where(indices < 0, indices + size, indices)


def take(a, indices, axis):
    return np.take(a, checked(indices, a.shape[axis], "take", axis), axis=axis)


def take_along_axis(a, indices, axis):
    """NumPy's ``take_along_axis``, ``a`` and ``indices`` broadcast against each other off ``axis``."""
    indices = checked(indices, a.shape[axis], "take_along_axis", axis)
    lead = np.broadcast_shapes(_without(a.shape, axis), _without(indices.shape, axis))
    a = np.broadcast_to(a, _with(lead, axis, a.shape[axis]))
    indices = np.broadcast_to(indices, _with(lead, axis, indices.shape[axis]))
    return np.take_along_axis(a, indices, axis=axis)


def take_into(out, a, indices, axis):
    np.take(a, checked(indices, a.shape[axis], "take", axis), axis=axis, out=out)


def take_along_axis_into(out, a, indices, axis):
    out[...] = take_along_axis(a, indices, axis)


def _without(shape, axis):
    return shape[:axis] + (1,) + shape[axis + 1:]


def _with(shape, axis, size):
    return shape[:axis] + (size,) + shape[axis + 1:]
