"""What each op computes, written with NumPy: the meaning of the IR.

The reference interpreter evaluates terms with these functions, and constant folding (rules)
folds with them too, so a folded constant is exactly what evaluating the term would give.
Each entry takes the list of operand arrays and the op's attributes; its result is cast to the
term's dtype by the caller.

Some ops take float16 and bfloat16 in float32 and round their result once (``IN_FLOAT32``, which
every backend follows). NumPy adds float16 in float16 along any axis but a contiguous last one
(3000 times 0.1 sums to 256), and a softmax's sum over 100,000 ones overflows it; ml_dtypes'
bfloat16 adds in bfloat16 everywhere and its einsum fails. So sums, means, the softmax family,
products of both and attention (a softmax between two products) are computed in float32, as
PyTorch, JAX and cuBLAS do; so are ``gelu`` and ``gelu_grad``, as NumPy computes float16's exp.
gelu's constants and the softmax family's shift are every backend's, so they are defined in ``numerics``.
"""

import numpy as np

from . import attending, gathering, windowing
from .dtypes import is_float, is_narrow_float
from .numerics import gelu_argument, gelu_slope, shifted
from .ops import UFUNC_OPS, ufunc_loop


def _narrow_once_floating(dtype):
    """Whether ``dtype`` is narrow in the float exp computes it in (int8, uint8 and bool: float16)."""
    return is_narrow_float(dtype if is_float(dtype) else ufunc_loop(np.exp, (dtype,))[-1])


IN_FLOAT32 = {  # op name -> which operand dtypes it computes in float32
    **dict.fromkeys(("sum", "mean", "matmul", "einsum", "conv", "overlap_add", "gelu", "gelu_grad", "attention",
                     "attention_grad"), is_narrow_float),
    **dict.fromkeys(("logsumexp", "softmax", "log_softmax"), _narrow_once_floating),
}


def _floating(x):
    """``x`` in the floating dtype NumPy's exp would compute it in (ints and bools widen)."""
    return x if is_float(x.dtype) else x.astype(ufunc_loop(np.exp, (x.dtype,))[-1])


def _in_float32(implementation, narrow):
    """``implementation`` taking its operands of the dtypes ``narrow`` accepts as float32 (the caller rounds)."""
    return lambda xs, *attrs: implementation([x.astype(np.float32) if narrow(x.dtype) else x for x in xs], *attrs)


def _sigmoid(x):
    x = _floating(x)
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _gelu(x):
    return x * _sigmoid(gelu_argument(x))


def _gelu_grad(x):
    """``sigmoid(z) + x sigmoid(z) sigmoid(-z) z'``, the sigmoids' product as ``e / (1 + e)^2`` with
    ``e = exp(-|z|)``, which neither overflows nor cancels; it is 0 far out, where it multiplies
    ``x`` before ``z'`` does, so the result is finite wherever ``x * x`` is."""
    z = gelu_argument(x)
    e = np.exp(-np.abs(z))
    return _sigmoid(z) + x * (e / ((1 + e) * (1 + e))) * gelu_slope(x)


def _shifted(x, axes):
    """``numerics.shifted`` of ``x`` in the float exp computes it in."""
    return shifted(_floating(x), axes, np)


def _logsumexp(x, axes, keepdims):
    shifted, peak = _shifted(x, axes)
    result = np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True)) + peak
    return result if keepdims else np.squeeze(result, axis=axes)


def _softmax(x, axes):
    shifted, _ = _shifted(x, axes)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axes, keepdims=True)


def _log_softmax(x, axes):
    shifted, _ = _shifted(x, axes)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))


def _ufunc_implementation(ufunc):
    return lambda xs: ufunc(*xs)


IMPLEMENTATIONS = {name: _ufunc_implementation(ufunc) for name, ufunc in UFUNC_OPS.items()}
IMPLEMENTATIONS.update({
    "sigmoid": lambda xs: _sigmoid(xs[0]),
    "relu": lambda xs: np.maximum(xs[0], 0),
    "softplus": lambda xs: np.logaddexp(0, _floating(xs[0])),
    "gelu": lambda xs: _gelu(xs[0]),
    "gelu_grad": lambda xs: _gelu_grad(xs[0]),
    "where": lambda xs: np.where(*xs),
    "stop_gradient": lambda xs: np.array(xs[0], copy=True),
    "cast": lambda xs, dtype: xs[0].astype(dtype),
    "sum": lambda xs, axes, keepdims: np.sum(xs[0], axis=axes, keepdims=keepdims),
    "mean": lambda xs, axes, keepdims: np.mean(xs[0], axis=axes, keepdims=keepdims),
    "max": lambda xs, axes, keepdims: np.max(xs[0], axis=axes, keepdims=keepdims),
    "logsumexp": lambda xs, axes, keepdims: _logsumexp(xs[0], axes, keepdims),
    "softmax": lambda xs, axes: _softmax(xs[0], axes),
    "log_softmax": lambda xs, axes: _log_softmax(xs[0], axes),
    "matmul": lambda xs: np.matmul(*xs),
    "einsum": lambda xs, subscripts: np.einsum(subscripts, *xs),
    "transpose": lambda xs, axes: np.transpose(xs[0], axes),
    "reshape": lambda xs, shape: np.reshape(xs[0], shape),
    "broadcast_to": lambda xs, shape: np.broadcast_to(xs[0], shape),
    "conv": lambda xs, *attrs: windowing.conv(*xs, *attrs),
    "windows": lambda xs, window, strides, dilation: windowing.window_view(xs[0], window, strides, dilation),
    "overlap_add": lambda xs, shape, strides, dilation: windowing.overlapped_add(xs[0], shape, strides, dilation),
    "pad": lambda xs, widths, value: windowing.padded(xs[0], widths, value),
    "flip": lambda xs, axes: np.flip(xs[0], axes),
    "take": lambda xs, axis: gathering.take(*xs, axis),
    "take_along_axis": lambda xs, axis: gathering.take_along_axis(*xs, axis),
    "attention": lambda xs, scale, causal: attending.attention(*xs, scale, causal),
    "attention_grad": lambda xs, *attrs: attending.attention_grad(*xs, *attrs),
})
IMPLEMENTATIONS.update({name: _in_float32(IMPLEMENTATIONS[name], narrow) for name, narrow in IN_FLOAT32.items()})


def implementation(op):
    """The reference semantics of ``op``: the table's, or those a backend's own op carries (``Op.evaluate``)."""
    return IMPLEMENTATIONS.get(op.name) or op.evaluate
