"""``attention``: the rule that reads ``softmax(q @ k^T * scale + mask, axis=-1) @ v`` as one ``attention`` op.

Written as plain expressions, attention stores its ``Tq x Tk`` scores and probabilities, and its gradient more; as
one op a backend computes it blockwise (the CPU) or as flash attention (cuDNN on the GPU) and stores none of them.
The rule runs with the stability rules, before differentiation, so ``ct.grad`` and ``compile`` both see the op
(its gradient is ``attention_grad``, ``rules.derivatives``).

It takes the scores in the forms people write them: the product ``q @ k^T`` (``k^T`` a transpose of the last two
axes of ``k``, or any matrix, which is then transposed back) scaled by a positive constant (``* c``, ``c *``, ``/ c``)
and masked causally, before or after the scaling, by ``where(tril, s, -inf)``, ``where(triu, -inf, s)`` or an added
constant of zeros on and below the diagonal and ``-inf`` above it. The mask is aligned at the top left, as
``torch``'s ``is_causal`` is. It declines, leaving the plain expressions to run as written, where the probabilities
have another reader (they would be stored anyway), the softmax is over another axis, the operands broadcast
against each other or differ in dtype, or a mask has any other shape (a padding mask, a bottom-right causal mask):
those are not attention's meaning.

The op computes as flash attention does, which differs from the plain expressions only where they are not finite:
a masked score is dropped, so a NaN or infinite score there (a key holding one) leaves the rows that mask it finite,
where an added mask's ``-inf`` meets it as NaN; and float16 and bfloat16 attention computes in float32 with one
rounding (``Op.computes_in_float32``), so scores past float16's range do not overflow as the rounded plain scores would.
"""

import numpy as np

from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float
from ..exprgraph.ops import ADD, CONST, DIVIDE, MATMUL, MULTIPLY, SOFTMAX, TRANSPOSE, WHERE
from ..exprgraph.term import Term
from .engine import Rule, RuleSet


def _constant(t):
    return t.op is CONST


def _positive_scalar(t):
    """The value of ``t`` if it is a constant of one positive finite value that broadcasts to nothing larger than a
    scalar would; else None."""
    if not _constant(t) or any(d != 1 for d in t.shape):
        return None
    value = float(t.attr("value").array.reshape(-1)[0])
    return value if np.isfinite(value) and value > 0 else None


def _unscaled(s):
    """``(x, c)`` for ``s`` = ``x * c``, ``c * x`` or ``x / c`` with a positive constant ``c`` (``c`` as a factor);
    ``(s, 1.0)`` otherwise."""
    if s.op is MULTIPLY:
        for x, c in (s.args, reversed(s.args)):
            value = _positive_scalar(c)
            if value is not None and x.shape == s.shape:
                return x, value
    if s.op is DIVIDE and s.args[0].shape == s.shape:
        value = _positive_scalar(s.args[1])
        if value is not None:
            return s.args[0], 1 / value
    return s, 1.0


def _is_negative_infinity(t):
    return _constant(t) and t.attr("value").scalar is not None and t.attr("value").scalar[()] == -np.inf


def _causal_or_none(kept, shape):
    """Whether the constant boolean array ``kept`` says which scores of ``shape`` the top-left causal mask keeps
    (True), keeps all (False), or something else (None)."""
    if kept.ndim > len(shape):
        return None
    wanted = np.tril(np.ones(shape[-2:], bool))
    full = np.broadcast_shapes(kept.shape, wanted.shape)
    if np.array_equal(np.broadcast_to(kept, full), np.broadcast_to(wanted, full)):
        return True
    return False if kept.all() else None


def _unmasked(s):
    """``(x, causal)`` for ``s`` the scores ``x`` under a mask (causal: True; all kept: False); ``(s, False)`` where
    ``s`` is no mask; None for a mask that is not causal."""
    if s.op is WHERE and _constant(s.args[0]):
        condition, kept, dropped = s.args
        array = condition.attr("value").array.astype(bool)
        if _is_negative_infinity(kept) and dropped.shape == s.shape:
            kept, dropped, array = dropped, kept, ~array
        if _is_negative_infinity(dropped) and kept.shape == s.shape:
            causal = _causal_or_none(array, s.shape)
            return None if causal is None else (kept, causal)
    if s.op is ADD:
        for x, mask in (s.args, reversed(s.args)):
            if _constant(mask) and x.shape == s.shape and x.dtype == s.dtype:
                array = mask.attr("value").array
                if not np.all((array == 0) | (array == -np.inf)):
                    return None
                causal = _causal_or_none(array == 0, s.shape)
                return None if causal is None else (x, causal)
    return s, False


def _scores(s):
    """``(q, k^T, scale, causal)`` of the scores ``s``: a product, scaled and masked in either order; None if ``s`` is
    not such scores."""
    s, outer = _unscaled(s)
    found = _unmasked(s)
    if found is None:
        return None
    s, causal = found
    s, inner = _unscaled(s)
    if s.op is not MATMUL:
        return None
    q, kt = s.args
    return q, kt, outer * inner, causal


def _keys(kt):
    """``k`` of ``k^T``: ``kt`` with its last two axes swapped back, one transpose composed with the one that made
    ``kt`` (simplify merges ``transpose(transpose(x))``, so the gradient's ``k`` and the compiled model's agree)."""
    swap = tuple(range(kt.ndim - 2)) + (kt.ndim - 1, kt.ndim - 2)
    if kt.op is not TRANSPOSE:
        return ct.transpose(kt, swap)
    axes = tuple(kt.attr("axes")[i] for i in swap)
    return kt.args[0] if axes == tuple(range(kt.ndim)) else ct.transpose(kt.args[0], axes)


def _attention(b):
    p, v, term = b["_p"], b["_v"], b.term
    if not isinstance(term, Term) or p.op is not SOFTMAX or b.shared(p) or p.attr("axes") != (p.ndim - 1,):
        return None
    found = _scores(p.args[0])
    if found is None:
        return None
    q, kt, scale, causal = found
    if min(q.ndim, kt.ndim, v.ndim) < 2 or not is_float(term.dtype) or not 0 < scale < np.inf:
        return None
    k = _keys(kt)
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.dtype == k.dtype == v.dtype == p.dtype == term.dtype):
        return None
    return ct.attention(q, k, v, scale=scale, causal=causal)


attention = RuleSet([Rule("attention", "_p @ _v", _attention)], name="attention")
