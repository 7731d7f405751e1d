"""The derivatives of attention, for ``rules.derivatives``.

``attention``'s VJP for each operand is a result of ``attention_grad`` (one kernel makes all three). The VJPs of
``attention_grad`` itself (a second derivative: a Hessian-vector product, a gradient penalty) are found by
differentiating its meaning spelled out in plain ops (``plain_attention_grad``) with the reverse walk, with stand-ins
(fused-body parameters) for the operands so that ``q`` and ``k`` being one term (self-attention on one tensor) still
gives each position its own VJP. The spelled-out gradient reads ``q``, ``k``, ``v`` and the adjoint only: the
forward's result ``out`` that ``attention_grad`` also reads is ``attention(q, k, v)`` by construction, so its VJP
is counted through ``q``, ``k`` and ``v`` and is 0 of its own.
"""

import numpy as np

from ..exprgraph import constructors as ct
from ..exprgraph.graph import schedule
from ..exprgraph.ops import ATTENTION, parameter
from .engine import substitute
from .reverse import backpropagate


def _swap_last(t):
    return ct.transpose(t, tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2))


def _computed(x):
    """``x`` in the dtype attention computes in: float32 for float16 and bfloat16 (``Op.computes_in_float32``)."""
    return ct.cast(x, "float32") if ATTENTION.computes_in_float32(x.dtype) else x


def probabilities(q, k, scale, causal):
    """``softmax(q @ k^T * scale)`` over the keys, masked where ``causal``: attention's ``Tq x Tk`` probabilities."""
    scores = (q @ _swap_last(k)) * scale
    if causal:
        scores = ct.where(ct.const(np.tril(np.ones(scores.shape[-2:], bool))), scores, -np.inf)
    return ct.softmax(scores, axis=-1)


def plain_attention(q, k, v, scale, causal):
    """``attention(q, k, v)`` as plain ops, computed as the op computes it."""
    result = probabilities(_computed(q), _computed(k), scale, causal) @ _computed(v)
    return ct.cast(result, q.dtype) if result.dtype != q.dtype else result


def plain_attention_grad(q, k, v, dout, scale, causal):
    """``(dq, dk, dv)`` of ``attention(q, k, v)`` for the adjoint ``dout``, as plain ops: with ``P`` the probabilities,
    ``dv = P^T dout``, ``dS = P * (dP - sum(dP * P))`` for ``dP = dout v^T``, ``dq = scale dS k``, ``dk = scale dS^T q``."""
    q32, k32, v32, g32 = map(_computed, (q, k, v, dout))
    p = probabilities(q32, k32, scale, causal)
    dp = g32 @ _swap_last(v32)
    ds = p * (dp - ct.sum(dp * p, axis=-1, keepdims=True)) * scale
    grads = (ds @ k32, _swap_last(ds) @ q32, _swap_last(p) @ g32)
    return tuple(ct.cast(g, q.dtype) if g.dtype != q.dtype else g for g in grads)


def attention_vjp(position):
    """The VJP for operand ``position`` (q, k, v) of an ``attention`` term: that result of its ``attention_grad``."""

    def vjp(b):
        term = b.term
        return ct.attention_grad(*term.args, b["_y"], b["_dy"], term.attr("scale"), term.attr("causal"), result=position)

    return vjp


def attention_grad_vjp(operand, rules):
    """The VJP for ``(q, k, v, dout)[operand]`` in an ``attention_grad`` term, by the reverse walk through
    ``plain_attention_grad`` with the derivative rules ``rules()`` (a function: the rules include this one)."""

    def vjp(b):
        term = b.term
        q, k, v, _, dout = term.args
        scale, causal, result = (term.attr(name) for name in ("scale", "causal", "result"))
        stand_ins = [parameter(i, x) for i, x in enumerate((q, k, v, dout))]
        spelled = plain_attention_grad(*stand_ins, scale, causal)[result]
        wanted = stand_ins[operand]
        adjoints = backpropagate(schedule([spelled]), [spelled], [b["_dy"]], [wanted], rules())
        if wanted not in adjoints:
            return 0
        return substitute(adjoints[wanted], dict(zip(stand_ins, (q, k, v, dout))))

    return vjp
