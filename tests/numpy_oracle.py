"""The functions of cortado's recipes computed directly with NumPy: the tests' independent oracle.

Where NumPy has a function of the same name it is used as is; the few functions NumPy lacks are
written here from their textbook definitions.
"""

import math

import numpy as np


def _logsumexp(x, axis=None, keepdims=False):
    peak = np.max(x, axis=axis, keepdims=True)
    total = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return total if keepdims else np.squeeze(total, axis=axis)


def _softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _gelu_tanh(x):
    return np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))


def _gelu(x):
    return 0.5 * x * (1 + _gelu_tanh(x))


def _gelu_grad(x):
    t = _gelu_tanh(x)
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)


def _pad(x, pad_width, constant_values=0):
    """Grown by the positive widths, then cropped by the negative ones."""
    x = np.asarray(x)
    grown = np.pad(x, [(max(low, 0), max(high, 0)) for low, high in pad_width], constant_values=constant_values)
    return grown[tuple(slice(max(-low, 0), n - max(-high, 0)) for n, (low, high) in zip(grown.shape, pad_width))]


def _dilated(x, dilations):
    """Zeros between neighbours along each trailing axis: ``dilation - 1`` of them."""
    lead = x.ndim - len(dilations)
    out = np.zeros(x.shape[:lead] + tuple((n - 1) * d + 1 for n, d in zip(x.shape[lead:], dilations)), x.dtype)
    out[(...,) + tuple(slice(None, None, d) for d in dilations)] = x
    return out


def _conv(x, w, strides, padding, lhs_dilation, rhs_dilation, groups):
    """A convolution element by element: each output a sum over its group's channels and its window's taps."""
    full = _pad(_dilated(np.asarray(x, np.float64), lhs_dilation), ((0, 0), (0, 0)) + tuple(padding))
    kernel = w.shape[2:]
    sizes = [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(full.shape[2:], kernel, rhs_dilation, strides)]
    out = np.zeros(x.shape[:1] + w.shape[:1] + tuple(sizes))
    per_group, outputs_per_group = x.shape[1] // groups, w.shape[0] // groups
    for n, o in np.ndindex(*out.shape[:2]):
        first = o // outputs_per_group * per_group
        for position in np.ndindex(*sizes):
            for c, tap in np.ndindex(per_group, math.prod(kernel)):
                tap = np.unravel_index(tap, kernel)
                at = tuple(p * s + t * d for p, s, t, d in zip(position, strides, tap, rhs_dilation))
                out[(n, o) + position] += full[(n, first + c) + at] * w[(o, c) + tap]
    return out.astype(np.result_type(x, w))


def _add_at(x, indices, values, axis):
    """NumPy's ``np.add.at`` along ``axis``, out of place: each place's values summed first, then added to ``x``."""
    x, values = np.asarray(x), np.asarray(values)
    sums = np.zeros_like(x)
    np.add.at(np.moveaxis(sums, axis, 0), np.asarray(indices), np.moveaxis(values, axis, 0))
    return x + sums


def _windows(x, window_shape, strides, dilation):
    """Each window gathered element by element."""
    x = np.asarray(x)
    count = len(window_shape)
    spatial = x.shape[x.ndim - count:]
    counts = [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(spatial, window_shape, dilation, strides)]
    out = np.empty(x.shape[:x.ndim - count] + tuple(counts) + tuple(window_shape), x.dtype)
    for position in np.ndindex(*counts):
        for tap in np.ndindex(*window_shape):
            at = tuple(p * s + t * d for p, s, t, d in zip(position, strides, tap, dilation))
            out[(...,) + position + tap] = x[(...,) + at]
    return out


def _overlap_add(x, shape, strides, dilation):
    """Each window's elements added back one by one where ``windows`` took them."""
    x = np.asarray(x)
    count = len(shape)
    counts, window = x.shape[x.ndim - 2 * count:x.ndim - count], x.shape[x.ndim - count:]
    out = np.zeros(x.shape[:x.ndim - 2 * count] + tuple(shape), x.dtype)
    for position in np.ndindex(*counts):
        for tap in np.ndindex(*window):
            at = tuple(p * s + t * d for p, s, t, d in zip(position, strides, tap, dilation))
            out[(...,) + at] += x[(...,) + position + tap]
    return out


OVERRIDES = {
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "softplus": lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
    "gelu": _gelu,
    "gelu_grad": _gelu_grad,
    "silu": lambda x: x / (1 + np.exp(-x)),
    "logsumexp": _logsumexp,
    "softmax": _softmax,
    "log_softmax": lambda x, axis=-1: x - _logsumexp(x, axis=axis, keepdims=True),
    "cast": lambda x, dtype: np.asarray(x).astype(dtype),
    "reshape": lambda x, shape: np.reshape(x, shape),
    "pad": _pad,
    "conv": _conv,
    "windows": _windows,
    "overlap_add": _overlap_add,
    "add_at": _add_at,
    "take_along_axis": lambda x, indices, axis: np.take_along_axis(np.asarray(x), np.asarray(indices), axis=axis),
}


class NumpyNamespace(dict):
    def __missing__(self, name):
        return getattr(np, name)


NUMPY = NumpyNamespace(OVERRIDES)
# Every floating value in float64: a cast between floating dtypes is then the identity.
NUMPY_FLOAT64 = NumpyNamespace(OVERRIDES, cast=lambda x, dtype: np.asarray(x).astype(
    np.float64 if np.dtype(dtype).kind == "f" else dtype))


def replay_numpy(graph, feeds, namespace=NUMPY):
    with np.errstate(all="ignore"):
        return [np.asarray(v) for v in graph.replay(namespace, feeds)]
