"""The CPU's lowering. An einsum of two floating operands is transposes and reshapes around one matmul
(``rules.decompositions.einsums_as_matmuls``): ``np.einsum`` contracts without BLAS. An attention whose queries are
one block (``attending.one_block``: its probabilities at most ``attending.BLOCK_ELEMENTS``) keeps them for its
gradient: the forward becomes ``attention_keeping`` (the output and the probabilities, which it computes anyway) and
the gradient ``attention_grad_given``, which reads them instead of making the scores, their shift, exponentials and
sums again, the same values (the GPT example's gradient, a call on one thread: 0.45 ms against 0.71). The two terms
share their operands, so both keep one kernel of the forward. Float32 and float64 only: narrower attentions compute
in float32 (``computes_in_float32``), their probabilities too.
"""

import numpy as np

from ...exprgraph import attending
from ...exprgraph.ops import LOWERED, Op
from ...exprgraph.term import make
from ...rules.decompositions import einsums_as_matmuls
from ...rules.engine import Postwalk, Rule, RuleSet

KEPT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _keeping_shape(args, scale, causal, result):
    q, k, v = args
    return q.shape[:-1] + (v.shape[-1] if result == 0 else k.shape[-2],)


# ``attention_keeping(q, k, v, result=0)`` is ``attention(q, k, v)``; ``result=1`` its probabilities, lead + (Tq, Tk)
ATTENTION_KEEPING = Op("attention_keeping", 3, ("scale", "causal", "result"), _keeping_shape,
                       lambda args, scale, causal, result: args[0].dtype, LOWERED,
                       results=lambda scale, causal, result: 2, result_attr="result",
                       evaluate=lambda xs, *attrs: attending.attention_keeping(*xs, *attrs))

# ``attention_grad_given(q, k, v, probabilities, dout)``: ``attention_grad``'s dq, dk, dv (``result`` 0, 1, 2)
ATTENTION_GRAD_GIVEN = Op("attention_grad_given", 5, ("scale", "causal", "result"),
                          lambda args, scale, causal, result: args[result].shape,
                          lambda args, scale, causal, result: args[0].dtype, LOWERED,
                          results=lambda scale, causal, result: 3, result_attr="result",
                          evaluate=lambda xs, *attrs: attending.attention_grad_given(*xs, *attrs))


def _keeps(q, k, v):
    """Whether an attention on these operands keeps its probabilities."""
    return (q.dtype in KEPT_DTYPES and q.dtype == k.dtype == v.dtype and q.shape[-2] > 0 and k.shape[-2] > 0
            and attending.one_block(q, k))


def _forward(b):
    q, k, v = b["_q"], b["_k"], b["_v"]
    if not _keeps(q, k, v):
        return None
    return make(ATTENTION_KEEPING, (q, k, v), (b.term.attrs.scale, b.term.attrs.causal, 0))


def _gradient(b):
    q, k, v, dout = b["_q"], b["_k"], b["_v"], b["_g"]
    attrs = b.term.attrs
    if not _keeps(q, k, v) or dout.dtype != q.dtype:
        return None
    probabilities = make(ATTENTION_KEEPING, (q, k, v), (attrs.scale, attrs.causal, 1))
    return make(ATTENTION_GRAD_GIVEN, (q, k, v, probabilities, dout), (attrs.scale, attrs.causal, attrs.result))


kept_probabilities = RuleSet([
    Rule("keep-attention-probabilities", "attention(_q, _k, _v, scale=_s, causal=_c)", _forward),
    Rule("attention-grad-from-kept", "attention_grad(_q, _k, _v, _o, _g, scale=_s, causal=_c, result=_r)", _gradient),
], name="kept-probabilities")


class Lowering:
    """The CPU's lowering: ``einsums_as_matmuls``, then ``kept_probabilities``, over the whole graph."""

    passes = (Postwalk(einsums_as_matmuls), Postwalk(kept_probabilities))

    def run(self, roots, trace=None, variant=None):
        roots = list(roots)
        for rewrite in self.passes:
            roots = rewrite.run(roots, trace)
        return roots
