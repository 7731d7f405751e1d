"""The attention target: ``attention`` and ``attention_grad`` as cuDNN's flash attention (``sdpa`` and
``sdpa_backward`` through nvidia-cudnn-frontend), which never stores the ``Tq x Tk`` scores.

cuDNN's backward pass needs the forward's softmax statistics (each query's ``logsumexp`` of its scaled, masked
scores, float32), so the forward becomes ``dnn_attention``, of two results (the output and the statistics), and the
gradient ``dnn_attention_grad``, of three (``dq``, ``dk``, ``dv``), which reads the statistics of the forward on the
same operands: one term, so one kernel computes both. cuDNN takes float16 and bfloat16 operands with a head
dimension that is a multiple of 8 up to ``MAX_HEAD``, the same for ``q``, ``k`` and ``v``; any other attention
(float32, float64, other head sizes) runs as the plain expressions it means (``rules.attention_vjps``), which the
other targets then lower (its products become GEMMs). ``calls.cudnn_attention`` runs the lowered ops.
"""

import numpy as np

from ....exprgraph.dtypes import BFLOAT16
from ....exprgraph.ops import ATTENTION, ATTENTION_GRAD, LOWERED, Op
from ....exprgraph.semantics import implementation
from ....exprgraph.term import make
from ....rules.attention_vjps import plain_attention, plain_attention_grad
from ....rules.engine import Rule, RuleSet

FLASH_DTYPES = (np.dtype(np.float16),) + ((BFLOAT16,) if BFLOAT16 else ())
MAX_HEAD = 128


def flash_fits(q, k, v):
    """Whether cuDNN's flash attention takes these operands."""
    head = q.shape[-1]
    return (q.dtype in FLASH_DTYPES and head == v.shape[-1] and head % 8 == 0 and 0 < head <= MAX_HEAD
            and q.shape[-2] > 0 and k.shape[-2] > 0)


def statistics(q, k, scale, causal):
    """Each query's ``logsumexp`` of its scaled, masked scores, as cuDNN's forward pass leaves it (float32)."""
    s = np.matmul(q.astype(np.float32), np.swapaxes(k.astype(np.float32), -1, -2)) * np.float32(scale)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    peak = s.max(axis=-1, keepdims=True)
    return np.log(np.exp(s - peak).sum(axis=-1, keepdims=True)) + peak


def _forward_shape(args, scale, causal, result):
    q, _, v = args
    return q.shape[:-1] + (v.shape[-1] if result == 0 else 1,)


def _forward_evaluate(xs, scale, causal, result):
    if result == 0:
        return implementation(ATTENTION)(xs, scale, causal)
    return statistics(*xs[:2], scale, causal)


DNN_ATTENTION = Op("dnn_attention", 3, ("scale", "causal", "result"), _forward_shape,
                   lambda args, scale, causal, result: args[0].dtype if result == 0 else np.dtype(np.float32),
                   LOWERED, results=lambda scale, causal, result: 2, result_attr="result", evaluate=_forward_evaluate)

DNN_ATTENTION_GRAD = Op("dnn_attention_grad", 6, ("scale", "causal", "result"),
                        lambda args, scale, causal, result: args[result].shape,
                        lambda args, scale, causal, result: args[0].dtype, LOWERED,
                        results=lambda scale, causal, result: 3, result_attr="result",
                        evaluate=lambda xs, *attrs: implementation(ATTENTION_GRAD)(xs[:5], *attrs))


def dnn_attention(q, k, v, scale, causal, result):
    return make(DNN_ATTENTION, (q, k, v), (scale, causal, result))


def _attention(b):
    q, k, v = b["_q"], b["_k"], b["_v"]
    scale, causal = b.term.attrs.scale, b.term.attrs.causal
    if flash_fits(q, k, v):
        return dnn_attention(q, k, v, scale, causal, 0)
    return plain_attention(q, k, v, scale, causal)


def _attention_grad(b):
    q, k, v, out, dout = (b[name] for name in ("_q", "_k", "_v", "_o", "_g"))
    attrs = b.term.attrs
    scale, causal, result = attrs.scale, attrs.causal, attrs.result
    if flash_fits(q, k, v):
        stats = dnn_attention(q, k, v, scale, causal, 1)
        return make(DNN_ATTENTION_GRAD, (q, k, v, out, dout, stats), (scale, causal, result))
    return plain_attention_grad(q, k, v, dout, scale, causal)[result]


rules = RuleSet([
    Rule("flash-attention", "attention(_q, _k, _v, scale=_s, causal=_c)", _attention),
    Rule("flash-attention-grad", "attention_grad(_q, _k, _v, _o, _g, scale=_s, causal=_c, result=_r)",
         _attention_grad),
], name="attention")


def finish(roots, trace=None, keep=frozenset()):
    """Nothing spans the graph here: each attention is lowered where it stands."""
    return list(roots)


def alternatives(planned):
    """No variant of this target is worth planning apart."""
    return []

