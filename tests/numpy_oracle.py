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


OVERRIDES = {
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "softplus": lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
    "gelu": _gelu,
    "gelu_grad": _gelu_grad,
    "logsumexp": _logsumexp,
    "softmax": _softmax,
    "log_softmax": lambda x, axis=-1: x - _logsumexp(x, axis=axis, keepdims=True),
    "cast": lambda x, dtype: np.asarray(x).astype(dtype),
    "reshape": lambda x, shape: np.reshape(x, shape),
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
