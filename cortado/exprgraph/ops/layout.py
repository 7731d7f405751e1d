"""The layout ops: ``transpose``, ``reshape`` and ``broadcast_to``, which move or repeat elements
without computing new ones.
"""

import functools
import operator

import numpy as np

from ..term import shape_violation
from .base import LAYOUT, Op, as_shape, int_tuple


def _size(shape):
    return functools.reduce(operator.mul, shape, 1)


def same_dtype(args, *attrs):
    return args[0].dtype


def _transpose_normalize(args, axes=None):
    ndim = args[0].ndim
    if axes is None:
        return (tuple(range(ndim))[::-1],)
    given = int_tuple(axes, "axes")
    perm = tuple(a % ndim if -ndim <= a < ndim else -1 for a in given)
    if sorted(perm) != list(range(ndim)):
        raise shape_violation(f"axes {given} are not a permutation of range({ndim})")
    return (perm,)


def _reshape_normalize(args, shape):
    dims = list(int_tuple(shape, "a shape"))
    size = args[0].size
    if dims.count(-1) > 1:
        raise shape_violation(f"shape {tuple(dims)} has more than one -1")
    if -1 in dims:
        known = _size(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise shape_violation(f"cannot reshape {size} elements into {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    dims = as_shape(dims)
    if _size(dims) != size:
        raise shape_violation(f"cannot reshape {size} elements into {dims}")
    return (dims,)


def _broadcast_to_normalize(args, shape):
    shape = as_shape(shape)
    source = args[0].shape
    lead = len(shape) - len(source)
    if lead < 0 or any(d not in (1, t) for d, t in zip(source, shape[lead:])):
        raise shape_violation(f"cannot broadcast {source} to {shape}")
    return (shape,)


TRANSPOSE = Op("transpose", 1, ("axes",), lambda args, axes: tuple(args[0].shape[a] for a in axes), same_dtype, LAYOUT,
               _transpose_normalize, evaluate=lambda xs, axes: np.transpose(xs[0], axes))
RESHAPE = Op("reshape", 1, ("shape",), lambda args, shape: shape, same_dtype, LAYOUT, _reshape_normalize,
             evaluate=lambda xs, shape: np.reshape(xs[0], shape))
BROADCAST_TO = Op("broadcast_to", 1, ("shape",), lambda args, shape: shape, same_dtype, LAYOUT, _broadcast_to_normalize,
                  evaluate=lambda xs, shape: np.broadcast_to(xs[0], shape))

FAMILY = (TRANSPOSE, RESHAPE, BROADCAST_TO)
