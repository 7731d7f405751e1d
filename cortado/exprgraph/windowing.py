"""Convolution and its window ops written with NumPy, on given arrays: the reference semantics
(``semantics``) and the CPU kernels (``backends.numpy.kernels``) both call these, so they agree.

Windows are strided views, never copies; a convolution is one batched matrix product over a copy of
its windows (im2col), with no Python loop over pixels. Only ``overlap_add`` loops, once per tap of the
window.
"""

import numpy as np

from .dtypes import as_strided


def window_extent(size, dilation):
    """How many elements a window of ``size`` taps spans with ``dilation``."""
    return (size - 1) * dilation + 1


def windowed_size(size, extent, stride):
    """How many windows of ``extent`` fit ``size`` elements, ``stride`` apart (negative: none fit)."""
    return (size - extent) // stride + 1


def dilated_size(size, dilation):
    """The length of ``size`` elements with ``dilation - 1`` zeros between neighbours."""
    return (size - 1) * dilation + 1 if size else 0


def _placement(size, low, dilation, target):
    """Where ``size`` elements go in an axis of ``target`` elements when placed ``dilation`` apart from
    ``low`` (negative: the first ones fall off): (source slice, destination slice), or None if none land."""
    first = (-low + dilation - 1) // dilation if low < 0 else 0
    last = min(size - 1, (target - 1 - low) // dilation)
    if first > last:
        return None
    return slice(first, last + 1), slice(low + first * dilation, low + last * dilation + 1, dilation)


def place_into(out, x, lows, dilations, fill):
    """``out`` filled with ``fill``, and ``x``'s elements written ``dilations`` apart from ``lows`` along
    each axis (a negative low crops): NumPy's constant ``pad`` with interior padding, into ``out``."""
    out.fill(fill)
    views = placed(out, x, lows, dilations)
    if views is not None:
        np.copyto(*views, casting="unsafe")


def placed(out, x, lows, dilations):
    """``(out's view, x's view)``: where ``place_into`` writes ``x``'s elements, and those of them it writes; None
    where it writes none."""
    source, target = [], []
    for size, low, dilation, length in zip(x.shape, lows, dilations, out.shape):
        placement = _placement(size, low, dilation, length)
        if placement is None:
            return None
        source.append(placement[0])
        target.append(placement[1])
    return out[tuple(target)], x[tuple(source)]


def padded(x, pad_width, value, dilations=None):
    """``x`` padded (and cropped, by negative widths) as ``pad``, optionally dilated first."""
    dilations = dilations or (1,) * x.ndim
    shape = tuple(dilated_size(n, d) + low + high for n, d, (low, high) in zip(x.shape, dilations, pad_width))
    out = np.empty(shape, x.dtype)
    place_into(out, x, [low for low, _ in pad_width], dilations, value)
    return out


def window_view(x, window_shape, strides, dilation):
    """The windows of ``x``'s trailing axes, as a read-only strided view: ``lead + counts + window_shape``."""
    count = len(window_shape)
    lead, spatial = x.shape[:x.ndim - count], x.shape[x.ndim - count:]
    steps = x.strides[x.ndim - count:]
    counts = tuple(windowed_size(n, window_extent(k, d), s)
                   for n, k, s, d in zip(spatial, window_shape, strides, dilation))
    return as_strided(
        x, lead + counts + tuple(window_shape),
        x.strides[:x.ndim - count] + tuple(t * s for t, s in zip(steps, strides)) + tuple(t * d for t, d in zip(steps, dilation)),
        writeable=False)


def overlap_add_into(out, x, strides, dilation):
    """``out`` = the windows ``x`` (``lead + counts + window``) added back where ``window_view`` took them."""
    out.fill(0)
    for target, windows in overlap_taps(out, x, strides, dilation):
        np.add(target, windows, out=target)


def conv_columns_shape(x_shape, w_shape, out_shape, groups):
    """The shape of a convolution's window copy: ``(N, groups, C/groups * kernel size, output pixels)``."""
    columns = w_shape[1] * int(np.prod(w_shape[2:]))
    return (x_shape[0], groups, columns, int(np.prod(out_shape[2:])))


def conv_windows(xp, w_shape, out_shape, strides, rhs_dilation, groups):
    """The windows of the padded, dilated input ``xp`` arranged as ``conv_columns_shape`` (a view)."""
    view = window_view(xp, w_shape[2:], strides, rhs_dilation)  # N, C, *out, *kernel
    count = len(w_shape) - 2
    axes = (0, 1) + tuple(range(2 + count, 2 + 2 * count)) + tuple(range(2, 2 + count))
    view = view.transpose(axes)  # N, C, *kernel, *out
    return view.reshape((xp.shape[0], groups, w_shape[1]) + view.shape[2:])


def conv_into(out, xp, w, strides, rhs_dilation, groups, columns):
    """``out`` = the convolution of the padded, dilated input ``xp`` with ``w``: the windows copied into
    ``columns`` (``conv_columns_shape``), then one batched matrix product per group (``conv_product``)."""
    windows = conv_windows(xp, w.shape, out.shape, strides, rhs_dilation, groups)
    np.copyto(columns.reshape(windows.shape), windows)
    conv_product(out, w, columns, groups)


def conv_stacks(out, w, columns, groups):
    """``(weights, columns, out)``: the stacks of matrices ``conv_product`` multiplies, weights by windows into
    results, a product per image and group."""
    weights = w.reshape(groups, w.shape[0] // groups, columns.shape[2])
    return weights, columns, out.reshape(out.shape[0], groups, w.shape[0] // groups, columns.shape[3])


def conv_product(out, w, columns, groups):
    """``out`` = the weights ``w`` times the windows copied into ``columns``, one batched product per group."""
    weights, columns, results = conv_stacks(out, w, columns, groups)
    np.matmul(weights, columns, out=results)


def overlap_taps(out, x, strides, dilation):
    """``(place in out, windows)`` of each tap of a window, in order: ``overlap_add_into`` adds each window element
    ``x[..., tap]`` into ``out`` at its place."""
    count = len(strides)
    counts, window = x.shape[x.ndim - 2 * count:x.ndim - count], x.shape[x.ndim - count:]
    return [(out[(Ellipsis,) + tuple(slice(t * d, t * d + (n - 1) * s + 1, s)
                                     for t, d, n, s in zip(tap, dilation, counts, strides))], x[(Ellipsis,) + tap])
            for tap in np.ndindex(*window)]


def conv(x, w, strides, padding, lhs_dilation, rhs_dilation, groups):
    """The convolution ``conv`` as the reference computes it."""
    xp = padded(x, ((0, 0), (0, 0)) + tuple(padding), 0, (1, 1) + tuple(lhs_dilation))
    out_shape = (x.shape[0], w.shape[0]) + tuple(
        windowed_size(n, window_extent(k, d), s) for n, k, d, s in zip(xp.shape[2:], w.shape[2:], rhs_dilation, strides))
    out = np.empty(out_shape, np.result_type(x, w))
    columns = np.empty(conv_columns_shape(x.shape, w.shape, out_shape, groups), out.dtype)
    conv_into(out, xp, np.ascontiguousarray(w, out.dtype), strides, rhs_dilation, groups, columns)
    return out


def overlapped_add(x, shape, strides, dilation):
    out = np.empty(x.shape[:x.ndim - 2 * len(shape)] + tuple(shape), x.dtype)
    overlap_add_into(out, x, strides, dilation)
    return out
