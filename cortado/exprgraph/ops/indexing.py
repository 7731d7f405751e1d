"""The ops that gather by index terms, ``take`` and ``take_along_axis``, with NumPy's names and semantics, and
``add_at``, ``take``'s adjoint, which adds rows back at the places they were taken from (NumPy's ``np.add.at`` into
zeros). The indices are a term of an integer dtype, so which elements are read or written is known only when the
program runs; an index outside its axis is an error there on the CPU (``gathering``) and is clamped into the axis
on the GPU, which never reads or writes out of bounds. Slicing, ``concatenate`` and ``split`` need no ops of their
own (``exprgraph.slicing``).
"""

import math

from ...errors import IndexRangeError
from .. import gathering
from ..gathering import checked
from ..term import RuleViolation, dtype_violation, shape_violation
from ..dtypes import is_float8, is_narrow_float
from .base import INDEXING, Op, broadcast_shapes
from .layout import same_dtype
from .leaves import CONST
from .reductions import one_axis


def _integer_indices(args, op):
    indices = args[1]
    if indices.dtype.kind not in "iu":
        raise dtype_violation(f"{op} needs indices of an integer dtype, not {indices.dtype.name} "
                              f"(cast them: ct.cast(indices, 'int32'))")


def _constant_indices_in_range(args, axis, size=None):
    """Indices known now (a constant) are checked now, where the user built the term."""
    indices = args[1]
    if indices.op is CONST:
        try:
            checked(indices.attrs.value.array, args[0].shape[axis] if size is None else size, None, axis)
        except IndexRangeError as error:
            raise RuleViolation(str(error), IndexRangeError) from None


def _nothing_to_take(args, axis, shape, op):
    """An empty axis can give only an empty result (NumPy's rule)."""
    if args[0].shape[axis] == 0 and math.prod(shape):
        raise shape_violation(f"{op}: axis {axis} has size 0, so no index can be taken from it")


def _take_normalize(args, axis):
    _integer_indices(args, "take")
    if args[0].ndim == 0:
        raise shape_violation("take needs an operand of at least one axis (a 0-d one has nothing to index)")
    axis = one_axis(axis, args[0].ndim)
    _nothing_to_take(args, axis, _take_shape(args, axis), "take")
    _constant_indices_in_range(args, axis)
    return (axis,)


def _take_shape(args, axis):
    a, indices = args
    return a.shape[:axis] + indices.shape + a.shape[axis + 1:]


def _along_axis_normalize(args, axis):
    _integer_indices(args, "take_along_axis")
    a, indices = args
    if a.ndim == 0 or indices.ndim != a.ndim:
        raise shape_violation(f"take_along_axis needs indices with as many axes as the operand "
                              f"(shapes {a.shape} and {indices.shape})")
    axis = one_axis(axis, a.ndim)
    _nothing_to_take(args, axis, _along_axis_shape(args, axis), "take_along_axis")
    _constant_indices_in_range(args, axis)
    return (axis,)


def _along_axis_shape(args, axis):
    """The operand's and the indices' shapes broadcast against each other off ``axis``; the indices' size on it."""
    a, indices = args
    off = broadcast_shapes(a.shape[:axis] + (1,) + a.shape[axis + 1:],
                           indices.shape[:axis] + (1,) + indices.shape[axis + 1:])
    return off[:axis] + (indices.shape[axis],) + off[axis + 1:]


def _add_at_normalize(args, axis, size):
    """``axis``: where the result's axis of ``size`` lies; the values hold the indices' axes there."""
    _integer_indices(args, "add_at")
    values, indices = args
    if values.dtype.kind == "b" or is_float8(values.dtype):
        raise dtype_violation(f"add_at adds numbers, not {values.dtype.name} values (cast them first)")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise shape_violation(f"add_at needs a size that is an int >= 0, not {size!r}")
    if values.ndim < indices.ndim:
        raise shape_violation(f"add_at: the values {values.shape} need the indices' axes {indices.shape}")
    axis = one_axis(axis, values.ndim - indices.ndim + 1)
    if values.shape[axis:axis + indices.ndim] != indices.shape:
        raise shape_violation(f"add_at: the values' axes {axis} .. {axis + indices.ndim - 1} must have the indices' "
                              f"shape {indices.shape}, not {values.shape[axis:axis + indices.ndim]} (values "
                              f"{values.shape})")
    if size == 0 and indices.size:
        raise shape_violation("add_at: the result's axis has size 0, so no index can be added into it")
    _constant_indices_in_range((None, indices), axis, size)
    return axis, size


def _add_at_shape(args, axis, size):
    values, indices = args
    return values.shape[:axis] + (size,) + values.shape[axis + indices.ndim:]


TAKE = Op("take", 2, ("axis",), _take_shape, same_dtype, INDEXING, _take_normalize, positions=(1,),
          evaluate=lambda xs, axis: gathering.take(*xs, axis))
TAKE_ALONG_AXIS = Op("take_along_axis", 2, ("axis",), _along_axis_shape, same_dtype, INDEXING, _along_axis_normalize,
                     positions=(1,), evaluate=lambda xs, axis: gathering.take_along_axis(*xs, axis))

# sums of a float16 or bfloat16 axis are taken in float32 and rounded once, as a GPU kernel takes them
ADD_AT = Op("add_at", 2, ("axis", "size"), _add_at_shape, same_dtype, INDEXING, _add_at_normalize, positions=(1,),
            evaluate=lambda xs, axis, size: gathering.add_at(*xs, axis, size), computes_in_float32=is_narrow_float)

FAMILY = (TAKE, TAKE_ALONG_AXIS, ADD_AT)


def reads_unchecked_indices(t):
    """Whether ``t`` gathers (or adds) at indices known only when a program runs, so that an index outside the axis meets it
    there (a constant's are checked when the term is built)."""
    return t.op in FAMILY and t.args[1].op is not CONST
