"""Attention as one op: ``attention(q, k, v)`` is ``softmax(q @ k^T * scale, axis=-1) @ v``, with the scores of a
query on the keys after it ``-inf`` where ``causal`` (the top-left aligned mask ``tril(ones((Tq, Tk)))``), and
``attention_grad(q, k, v, out, dout)`` its three gradients, one kernel of three results (``dq``, ``dk``, ``dv``).

Users never build them: the rules recognise the plain expressions (``rules.attention``) and the derivative rules
write the gradient, so a backend may compute attention without storing its ``Tq x Tk`` scores (blockwise on the
CPU, cuDNN's flash attention on the GPU). ``q`` is ``(..., Tq, D)``, ``k`` ``(..., Tk, D)``, ``v`` ``(..., Tk, Dv)``,
the leading axes the same for all three, one floating dtype. ``attention_grad`` reads ``out`` (the forward's
result) and ``dout`` (its adjoint) as flash attention's backward pass does; its meaning is that of the gradient
of ``attention(q, k, v)``, whatever ``out`` holds.
"""

import math

from .. import attending
from ..dtypes import is_float, is_narrow_float
from ..term import dtype_violation, shape_violation
from .layout import same_dtype
from .base import Op

ATTENTION_KIND = "attention"  # a softmax of products, multiplied out, that no kernel needs to store


def _operands(q, k, v):
    if not all(x.ndim >= 2 for x in (q, k, v)):
        raise shape_violation(f"attention needs q, k and v of at least 2 axes, not {q.shape}, {k.shape}, {v.shape}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise shape_violation(f"attention needs the same leading axes on q, k and v, not {q.shape}, {k.shape}, "
                              f"{v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise shape_violation(f"attention needs q (..., Tq, D), k (..., Tk, D) and v (..., Tk, Dv), not {q.shape}, "
                              f"{k.shape}, {v.shape}")
    if not is_float(q.dtype) or not q.dtype == k.dtype == v.dtype:
        raise dtype_violation(f"attention needs q, k and v of one floating dtype, not {q.dtype}, {k.dtype}, "
                              f"{v.dtype}")


def _scale_and_mask(scale, causal):
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise shape_violation(f"attention's scale must be a positive finite number, not {scale!r}")
    return scale, bool(causal)


def _attention_normalize(args, scale, causal):
    _operands(*args)
    return _scale_and_mask(scale, causal)


def _attention_shape(args, scale, causal):
    q, _, v = args
    return q.shape[:-1] + v.shape[-1:]


def _grad_normalize(args, scale, causal, result):
    q, k, v, out, dout = args
    _operands(q, k, v)
    expected = _attention_shape((q, k, v), scale, causal)
    if out.shape != expected or dout.shape != expected:
        raise shape_violation(f"attention_grad needs the forward's result and its adjoint of shape {expected}, "
                              f"not {out.shape} and {dout.shape}")
    if not q.dtype == out.dtype == dout.dtype:
        raise dtype_violation(f"attention_grad needs the forward's result and its adjoint in {q.dtype}, "
                              f"not {out.dtype} and {dout.dtype}")
    if result not in (0, 1, 2):
        raise shape_violation(f"attention_grad has 3 results (dq, dk, dv), not a result {result!r}")
    return _scale_and_mask(scale, causal) + (result,)


ATTENTION = Op("attention", 3, ("scale", "causal"), _attention_shape, same_dtype, ATTENTION_KIND, _attention_normalize,
                  evaluate=lambda xs, *attrs: attending.attention(*xs, *attrs), computes_in_float32=is_narrow_float)
ATTENTION_GRAD = Op("attention_grad", 5, ("scale", "causal", "result"),
                    lambda args, scale, causal, result: args[result].shape, same_dtype, ATTENTION_KIND, _grad_normalize,
                    results=lambda scale, causal, result: 3, result_attr="result",
                    evaluate=lambda xs, *attrs: attending.attention_grad(*xs, *attrs),
                    computes_in_float32=is_narrow_float)

FAMILY = (ATTENTION, ATTENTION_GRAD)
