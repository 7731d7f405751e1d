"""The reductions: ``sum``, ``mean``, ``max`` and ``logsumexp`` over some axes, and ``softmax`` and
``log_softmax``, which normalise over their axes and keep the shape.
"""

import functools

import numpy as np

from .. import numerics
from ..dtypes import is_narrow_float
from ..term import shape_violation
from .base import REDUCTION, Op, float_result, floating, int_tuple, narrow_once_floating


def normalize_axes(axis, ndim):
    """Axes as a sorted tuple of non-negative ints; None means every axis."""
    if axis is None:
        return tuple(range(ndim))
    result = []
    for a in int_tuple(axis, "axis (when not None)"):
        if not -ndim <= a < ndim:
            raise shape_violation(f"axis {a} is out of range for a tensor of rank {ndim}")
        if a % ndim in result:
            raise shape_violation(f"axis {axis!r} repeats axis {a % ndim}")
        result.append(a % ndim)
    return tuple(sorted(result))


def one_axis(axis, ndim):
    """A single axis (an int, negative from the end) as a non-negative int; a tuple or None is refused."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise shape_violation(f"axis must be an int, not {axis!r}")
    (axis,) = normalize_axes(axis, ndim)
    return axis


@functools.cache
def _reduced_dtype(reduction, dtype):
    return getattr(np, reduction)(np.zeros(1, dtype)).dtype


def _reduce_normalize(args, axis=None, keepdims=False):
    return (normalize_axes(axis, args[0].ndim), bool(keepdims))


def _reduce_shape(args, axes, keepdims):
    shape = args[0].shape
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _nonempty_reduce_shape(args, axes, keepdims):
    empty = [a for a in axes if args[0].shape[a] == 0]
    if empty:
        raise shape_violation(f"cannot reduce over axis {empty[0]}, which has size 0 (no identity)")
    return _reduce_shape(args, axes, keepdims)


def _softmax_normalize(args, axis=-1):
    return (normalize_axes(axis, args[0].ndim),)


def _softmax_shape(args, axes):
    _nonempty_reduce_shape(args, axes, True)  # only to reject empty axes
    return args[0].shape


def _logsumexp(xs, axes, keepdims):
    shifted, peak = numerics.shifted(floating(xs[0]), axes, np)
    result = np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True)) + peak
    return result if keepdims else np.squeeze(result, axis=axes)


def _softmax(xs, axes):
    shifted, _ = numerics.shifted(floating(xs[0]), axes, np)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axes, keepdims=True)


def _log_softmax(xs, axes):
    shifted, _ = numerics.shifted(floating(xs[0]), axes, np)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))


SUM = Op("sum", 1, ("axes", "keepdims"), _reduce_shape,
         lambda args, axes, keepdims: _reduced_dtype("sum", args[0].dtype), REDUCTION, _reduce_normalize,
         evaluate=lambda xs, axes, keepdims: np.sum(xs[0], axis=axes, keepdims=keepdims),
         computes_in_float32=is_narrow_float)
MEAN = Op("mean", 1, ("axes", "keepdims"), _reduce_shape,
          lambda args, axes, keepdims: _reduced_dtype("mean", args[0].dtype), REDUCTION, _reduce_normalize,
          evaluate=lambda xs, axes, keepdims: np.mean(xs[0], axis=axes, keepdims=keepdims),
          computes_in_float32=is_narrow_float)
MAX = Op("max", 1, ("axes", "keepdims"), _nonempty_reduce_shape,
         lambda args, axes, keepdims: args[0].dtype, REDUCTION, _reduce_normalize,
         evaluate=lambda xs, axes, keepdims: np.max(xs[0], axis=axes, keepdims=keepdims))
LOGSUMEXP = Op("logsumexp", 1, ("axes", "keepdims"), _nonempty_reduce_shape,
               lambda args, axes, keepdims: float_result(args), REDUCTION, _reduce_normalize, evaluate=_logsumexp,
               computes_in_float32=narrow_once_floating)
SOFTMAX = Op("softmax", 1, ("axes",), _softmax_shape, lambda args, axes: float_result(args), REDUCTION,
             _softmax_normalize, evaluate=_softmax, computes_in_float32=narrow_once_floating)
LOG_SOFTMAX = Op("log_softmax", 1, ("axes",), _softmax_shape, lambda args, axes: float_result(args), REDUCTION,
                 _softmax_normalize, evaluate=_log_softmax, computes_in_float32=narrow_once_floating)

FAMILY = (SUM, MEAN, MAX, LOGSUMEXP, SOFTMAX, LOG_SOFTMAX)
