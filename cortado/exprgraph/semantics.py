"""What each op computes, written with NumPy: the meaning of the IR.

The reference interpreter evaluates terms with these functions, and constant folding (rules)
folds with them too, so a folded constant is exactly what evaluating the term would give.
Each entry takes the list of operand arrays and the op's attributes; its result is cast to the
term's dtype by the caller.

bfloat16 (ml_dtypes') has elementwise loops that compute in float32 and round once, but nothing
that accumulates well: its sums add in bfloat16 and its einsum fails. So the ops in
``ACCUMULATING`` take bfloat16 operands in float32 and round their result once (as PyTorch, JAX
and cuBLAS do), and the NumPy backend does the same.
"""

import numpy as np

from .dtypes import is_bfloat16, is_float
from .ops import UFUNC_OPS, gemm_operands, ufunc_loop

ACCUMULATING = ("sum", "mean", "logsumexp", "softmax", "log_softmax", "matmul", "gemm", "einsum")


def _floating(x):
    """``x`` in the floating dtype NumPy's exp would compute it in (ints and bools widen)."""
    return x if is_float(x.dtype) else x.astype(ufunc_loop(np.exp, (x.dtype,))[-1])


def _accumulating(implementation):
    """``implementation`` taking its bfloat16 operands as float32 (the caller rounds the result)."""
    return lambda xs, *attrs: implementation([x.astype(np.float32) if is_bfloat16(x.dtype) else x for x in xs], *attrs)


def _sigmoid(x):
    x = _floating(x)
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _shifted(x, axes):
    """``x - max(x)`` over ``axes`` and the max, with infinite maxima replaced by 0."""
    x = _floating(x)
    peak = np.max(x, axis=axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    return x - peak, peak


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


def _gemm(xs, transpose_a, transpose_b, alpha, beta, epilogue):
    a, b, c, bias = gemm_operands(xs, beta, epilogue)
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    dtype = a.dtype.type
    out = np.matmul(a, b) * dtype(alpha)
    if c is not None:
        out = out + dtype(beta) * c
    if bias is not None:
        out = out + bias
    return np.maximum(out, dtype(0)) if "relu" in epilogue else out


def _ufunc_implementation(ufunc):
    return lambda xs: ufunc(*xs)


IMPLEMENTATIONS = {name: _ufunc_implementation(ufunc) for name, ufunc in UFUNC_OPS.items()}
IMPLEMENTATIONS.update({
    "sigmoid": lambda xs: _sigmoid(xs[0]),
    "relu": lambda xs: np.maximum(xs[0], 0),
    "softplus": lambda xs: np.logaddexp(0, _floating(xs[0])),
    "where": lambda xs: np.where(*xs),
    "cast": lambda xs, dtype: xs[0].astype(dtype),
    "sum": lambda xs, axes, keepdims: np.sum(xs[0], axis=axes, keepdims=keepdims),
    "mean": lambda xs, axes, keepdims: np.mean(xs[0], axis=axes, keepdims=keepdims),
    "max": lambda xs, axes, keepdims: np.max(xs[0], axis=axes, keepdims=keepdims),
    "logsumexp": lambda xs, axes, keepdims: _logsumexp(xs[0], axes, keepdims),
    "softmax": lambda xs, axes: _softmax(xs[0], axes),
    "log_softmax": lambda xs, axes: _log_softmax(xs[0], axes),
    "matmul": lambda xs: np.matmul(*xs),
    "gemm": _gemm,
    "einsum": lambda xs, subscripts: np.einsum(subscripts, *xs),
    "transpose": lambda xs, axes: np.transpose(xs[0], axes),
    "reshape": lambda xs, shape: np.reshape(xs[0], shape),
    "broadcast_to": lambda xs, shape: np.broadcast_to(xs[0], shape),
})
IMPLEMENTATIONS.update({name: _accumulating(IMPLEMENTATIONS[name]) for name in ACCUMULATING})
