"""Convolution and the window ops that pooling is written with.

``conv`` is one general convolution, XLA's ``conv_general_dilated`` in PyTorch's layout (``N C *spatial``
activations, ``O I/groups *kernel`` weights): per spatial axis a stride, low and high padding (negative:
cropping), an input dilation (``lhs_dilation``: zeros between input elements) and a weight dilation
(``rhs_dilation``), and feature groups. That generality is what makes every derivative of a convolution
a convolution again (``rules.derivatives``).

Pooling is a reduction over windows: ``windows`` views the sliding windows of the trailing axes (NumPy's
``sliding_window_view`` with strides and dilation), ``pad`` is NumPy's constant ``pad`` (negative widths
crop), and ``overlap_add`` (col2im) adds windows back into the tensor they came from. ``windows`` and
``overlap_add`` are each other's adjoints, ``pad`` with the opposite widths is ``pad``'s, so a pooling's
gradient is again made of these ops. ``flip`` is NumPy's.
"""

import numpy as np

from .. import windowing
from ..dtypes import is_narrow_float
from ..term import dtype_violation, shape_violation
from ..windowing import dilated_size, window_extent, windowed_size
from .base import LAYOUT, Op, int_tuple
from .contractions import matmul_dtype
from .layout import same_dtype

WINDOW = "window"  # moves elements between a tensor and its windows or border, adding or repeating some
CONVOLUTION = "convolution"


def conv_output_size(size, kernel, stride, padding, lhs_dilation, rhs_dilation):
    low, high = padding
    return windowed_size(dilated_size(size, lhs_dilation) + low + high, window_extent(kernel, rhs_dilation), stride)


def per_axis(value, count, what, minimum=1):
    """An int or ``count`` ints, each at least ``minimum``, as a tuple of ``count``."""
    values = int_tuple(value, what)
    if len(values) == 1:
        values *= count
    if len(values) != count:
        raise shape_violation(f"{what} needs 1 or {count} values (one per spatial axis), not {value!r}")
    if any(v < minimum for v in values):
        raise shape_violation(f"{what} must be at least {minimum}, not {value!r}")
    return values


def padding_pairs(padding, count, what="padding"):
    """``(low, high)`` per axis from an int, ``count`` ints (symmetric) or ``count`` pairs."""
    if isinstance(padding, (tuple, list)) and padding and all(isinstance(p, (tuple, list)) for p in padding):
        if len(padding) != count or any(len(p) != 2 for p in padding):
            raise shape_violation(f"{what} needs {count} (low, high) pairs, not {padding!r}")
        return tuple(tuple(int_tuple(p, what)) for p in padding)
    return tuple((p, p) for p in per_axis(padding, count, what, minimum=-2**62))


def _conv_normalize(args, strides=1, padding=0, lhs_dilation=1, rhs_dilation=1, groups=1):
    x, w = args
    if x.ndim < 3 or w.ndim != x.ndim:
        raise shape_violation(f"conv needs an input of shape (N, C, *spatial) and weights of shape "
                              f"(O, C/groups, *kernel) with as many spatial axes, not {x.shape} and {w.shape}")
    count = x.ndim - 2
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise shape_violation(f"groups must be a positive int, not {groups!r}")
    return (per_axis(strides, count, "strides"), padding_pairs(padding, count),
            per_axis(lhs_dilation, count, "lhs_dilation"), per_axis(rhs_dilation, count, "rhs_dilation"), groups)


def _conv_shape(args, strides, padding, lhs_dilation, rhs_dilation, groups):
    x, w = (a.shape for a in args)
    channels, outputs = x[1], w[0]
    if channels % groups or outputs % groups or w[1] * groups != channels:
        raise shape_violation(f"input {x} and weights {w} with groups={groups}: the input's {channels} channels "
                              f"and the {outputs} output channels must split into {groups} groups, and the weights' "
                              f"second axis must be {channels} / {groups}")
    if any(k < 1 for k in w[2:]):
        raise shape_violation(f"weights {w}: a kernel of {w[2:]} has an empty axis (each must be at least 1)")
    spatial = tuple(conv_output_size(*axis) for axis in zip(x[2:], w[2:], strides, padding, lhs_dilation, rhs_dilation))
    if any(s < 1 for s in spatial):
        raise shape_violation(f"input {x} and weights {w} with strides {strides}, padding {padding}, dilations "
                              f"{lhs_dilation} (input) and {rhs_dilation} (weights) leave an output of spatial "
                              f"shape {spatial}: the kernel is larger than the padded input")
    return (x[0], outputs) + spatial


def _windows_normalize(args, window_shape, strides=1, dilation=1):
    window = int_tuple(window_shape, "window_shape")
    if not window or len(window) > args[0].ndim or any(k < 1 for k in window):
        raise shape_violation(f"window_shape {window_shape!r} must be 1 to {args[0].ndim} positive sizes "
                              f"(for the trailing axes of {args[0].shape})")
    return window, per_axis(strides, len(window), "strides"), per_axis(dilation, len(window), "dilation")


def _windows_shape(args, window, strides, dilation):
    shape = args[0].shape
    spatial = shape[len(shape) - len(window):]
    counts = tuple(windowed_size(n, window_extent(k, d), s) for n, k, s, d in zip(spatial, window, strides, dilation))
    if any(c < 1 for c in counts):
        raise shape_violation(f"windows of {window} (dilation {dilation}) do not fit the trailing axes {spatial}")
    return shape[:len(shape) - len(window)] + counts + window


def _overlap_add_normalize(args, shape, strides=1, dilation=1):
    spatial = int_tuple(shape, "shape")
    count = len(spatial)
    if not spatial or 2 * count > args[0].ndim:
        raise shape_violation(f"overlap_add of windows {args[0].shape} into the trailing axes {spatial}: the "
                              f"operand needs {count} window-count axes and then {count} window axes")
    return spatial, per_axis(strides, count, "strides"), per_axis(dilation, count, "dilation")


def _overlap_add_shape(args, shape, strides, dilation):
    given = args[0].shape
    count = len(shape)
    counts, window = given[len(given) - 2 * count:len(given) - count], given[len(given) - count:]
    fitting = tuple(windowed_size(n, window_extent(k, d), s) for n, k, s, d in zip(shape, window, strides, dilation))
    if counts != fitting:
        raise shape_violation(f"windows {window} with strides {strides} and dilation {dilation} fit {fitting} times "
                              f"into {shape}, but the operand {given} has {counts} of them")
    return given[:len(given) - 2 * count] + shape


def _pad_normalize(args, pad_width, constant_values=0):
    x = args[0]
    if isinstance(pad_width, (tuple, list)) and len(pad_width) == 1 and isinstance(pad_width[0], (tuple, list)):
        pad_width = pad_width[0]  # NumPy's ((before, after),): the same for every axis
    if isinstance(pad_width, (tuple, list)) and len(pad_width) == 2 and not isinstance(pad_width[0], (tuple, list)):
        widths = (tuple(int_tuple(pad_width, "pad_width")),) * x.ndim  # NumPy's (before, after)
    else:
        widths = padding_pairs(pad_width, x.ndim, "pad_width")
    if isinstance(constant_values, bool) or not isinstance(constant_values, (int, float)):
        raise shape_violation(f"constant_values must be one Python number, not {constant_values!r}")
    if x.dtype.kind in "iub" and not float(constant_values).is_integer():
        raise shape_violation(f"an integer tensor cannot be padded with {constant_values!r}")
    if x.dtype.kind in "iu" and not np.iinfo(x.dtype).min <= constant_values <= np.iinfo(x.dtype).max:
        raise dtype_violation(f"{constant_values!r} is out of the range of {x.dtype.name}, whose tensor it would pad "
                              f"(NumPy's pad would wrap it)")
    if x.dtype.kind == "b" and constant_values not in (0, 1):
        raise dtype_violation(f"a bool tensor is padded with 0 or 1, not {constant_values!r}")
    return widths, constant_values


def _pad_shape(args, pad_width, constant_values):
    shape = tuple(n + low + high for n, (low, high) in zip(args[0].shape, pad_width))
    if any(n < 0 for n in shape):
        raise shape_violation(f"pad_width {pad_width} crops more than {args[0].shape} holds")
    return shape


def _flip_normalize(args, axis=None):
    from .reductions import normalize_axes

    return (normalize_axes(axis, args[0].ndim),)


CONV = Op("conv", 2, ("strides", "padding", "lhs_dilation", "rhs_dilation", "groups"), _conv_shape,
          lambda args, *attrs: matmul_dtype(args), CONVOLUTION, _conv_normalize,
          evaluate=lambda xs, *attrs: windowing.conv(*xs, *attrs), computes_in_float32=is_narrow_float)
WINDOWS = Op("windows", 1, ("window_shape", "strides", "dilation"), _windows_shape, same_dtype, LAYOUT,
             _windows_normalize, evaluate=lambda xs, *attrs: windowing.window_view(xs[0], *attrs))
OVERLAP_ADD = Op("overlap_add", 1, ("shape", "strides", "dilation"), _overlap_add_shape, same_dtype, WINDOW,
                 _overlap_add_normalize, evaluate=lambda xs, *attrs: windowing.overlapped_add(xs[0], *attrs),
                 computes_in_float32=is_narrow_float)
PAD = Op("pad", 1, ("pad_width", "constant_values"), _pad_shape, same_dtype, WINDOW, _pad_normalize,
         evaluate=lambda xs, widths, value: windowing.padded(xs[0], widths, value), takes_float8=True)  # (slices)
FLIP = Op("flip", 1, ("axes",), lambda args, axes: args[0].shape, same_dtype, LAYOUT, _flip_normalize,
          evaluate=lambda xs, axes: np.flip(xs[0], axes))

FAMILY = (CONV, WINDOWS, OVERLAP_ADD, PAD, FLIP)
