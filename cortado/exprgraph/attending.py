"""What ``attention`` and ``attention_grad`` compute, with NumPy, for the reference interpreter and the CPU backend
alike: blockwise over the queries, so that at most ``BLOCK_ELEMENTS`` scores exist at a time, never all
``Tq x Tk``. Every block reads every key, masked or not, so a value that is not finite reaches the rows it reaches in
the plain expressions (``0 * inf`` is NaN there too), whatever the blocks; each row is shifted by its max as
``softmax`` shifts (``numerics.shifted``: not where the max is infinite), so a row holding ``+inf`` is NaN where the
plain expressions make it NaN and 0 at its masked keys, as they do. The gradient recomputes each block's
probabilities (as flash attention's backward pass does) and takes a row's ``sum(dP * P)`` from them, not from the
forward's stored result, so it is as exact as the plain expressions' gradient. Where the queries are one block, the
forward's probabilities may be kept instead (``attention_keeping``) and read by the gradient
(``attention_grad_given``): they are the very values it would make again.

The ``_into`` forms write into given arrays and take their scratch as flat arrays of the computing dtype, sized by
``scratch_sizes``; they compute in the dtype of their outputs.
"""

import math

import numpy as np

from .numerics import finite_peak

BLOCK_ELEMENTS = 1 << 20  # scores held at once: 4 MiB of float32


def block_rows(q, k):
    """How many queries one block takes: as many as keep the block's scores within ``BLOCK_ELEMENTS``."""
    lead, keys = math.prod(q.shape[:-2]), k.shape[-2]
    return max(1, min(q.shape[-2], BLOCK_ELEMENTS // max(1, lead * keys)))


def scratch_sizes(q, k, v):
    """The elements of each flat scratch array: the block's scores (twice for the gradient: probabilities and their
    adjoint), and a block's partial sum of a key's or value's gradient."""
    lead = math.prod(q.shape[:-2])
    scores = lead * block_rows(q, k) * k.shape[-2]
    return scores, scores, lead * k.shape[-2] * max(q.shape[-1], v.shape[-1])


def _carved(flat, shape):
    """A C-ordered array of ``shape`` from the start of the flat scratch ``flat``."""
    return flat[:math.prod(shape)].reshape(shape)


def blocks(q, k):
    """``(first query, last query + 1)`` of each block."""
    queries, rows = q.shape[-2], block_rows(q, k)
    for start in range(0, queries, rows):
        yield start, min(start + rows, queries)


def block_scores(flat, q, k, start, stop):
    """The block's scores as ``flat`` holds them: ``lead + (queries of the block, keys)``, C order."""
    return _carved(flat, q.shape[:-2] + (stop - start, k.shape[-2]))


def _probabilities(flat, q, k, scale, causal, start, stop, shifts=None):
    """The block's softmax of ``q @ k^T * scale`` over the keys, masked where causal, in ``flat``; ``shifts``: for a
    block's first query, a call doing ``shift_scores`` on its scores in its own way (the CPU's C), where given."""
    s = block_scores(flat, q, k, start, stop)
    np.matmul(q[..., start:stop, :], np.swapaxes(k, -1, -2), out=s)
    if shifts is None:
        shift_scores(s, scale, causal, start)
    else:
        shifts[start]()
    np.exp(s, out=s)
    s /= _row_sums(s)
    return s


def _row_sums(s):
    """The sums of the last axis of C-ordered ``s``, keeping it: one matrix-vector product over all its rows (NumPy's
    sum over a last axis of 64 took twice as long, a row at a time)."""
    rows = s.reshape(-1, s.shape[-1])
    return np.matmul(rows, np.ones((rows.shape[1], 1), s.dtype)).reshape(s.shape[:-1] + (1,))


def shift_scores(s, scale, causal, start):
    """A block's scores ``s`` (its first query ``start``) scaled, masked where causal, and shifted by each row's max
    (softmax's shift, as in the plain form: 0 where the max is not finite), in place."""
    s *= scale
    if causal:
        np.copyto(s, -np.inf, where=np.arange(s.shape[-1]) > np.arange(start, start + s.shape[-2])[:, None])
    s -= finite_peak(np.max(s, axis=-1, keepdims=True), np)


def attention_into(out, q, k, v, scale, causal, scores, shifts=None):
    if k.shape[-2] == 0:
        out[...] = 0
        return
    for start, stop in blocks(q, k):
        p = _probabilities(scores, q, k, scale, causal, start, stop, shifts)
        np.matmul(p, v, out=out[..., start:stop, :])


def one_block(q, k):
    """Whether every query is in the first block: the scores' block is then all of the probabilities."""
    return block_rows(q, k) >= q.shape[-2]


def attention_grad_into(dq, dk, dv, q, k, v, dout, scale, causal, scores, adjoints, partial, shifts=None,
                        given=False):
    """``given``: ``scores`` holds the probabilities already (the forward's, of one block), not scratch."""
    dq[...], dk[...], dv[...] = 0, 0, 0
    if k.shape[-2] == 0:
        return
    lead, keys = q.shape[:-2], k.shape[-2]
    for start, stop in blocks(q, k):
        if given:
            p = block_scores(scores, q, k, start, stop)
        else:
            p = _probabilities(scores, q, k, scale, causal, start, stop, shifts)
        g, rows = dout[..., start:stop, :], q[..., start:stop, :]
        part = _carved(partial, lead + (keys, v.shape[-1]))
        np.matmul(np.swapaxes(p, -1, -2), g, out=part)
        dv += part
        ds = _carved(adjoints, lead + (stop - start, keys))
        np.matmul(g, np.swapaxes(v, -1, -2), out=ds)  # dP
        ds -= np.einsum("...ij,...ij->...i", ds, p)[..., None]
        ds *= p
        ds *= scale
        np.matmul(ds, k, out=dq[..., start:stop, :])
        part = _carved(partial, lead + (keys, q.shape[-1]))
        np.matmul(np.swapaxes(ds, -1, -2), rows, out=part)
        dk += part


def _scratch(q, k, v, dtype):
    return [np.empty(n, dtype) for n in scratch_sizes(q, k, v)]


def attention(q, k, v, scale, causal):
    out = np.empty(q.shape[:-1] + v.shape[-1:], np.result_type(q, k, v))
    attention_into(out, q, k, v, scale, causal, _scratch(q, k, v, out.dtype)[0])
    return out


def attention_keeping(q, k, v, scale, causal, result):
    """``attention``'s output (``result`` 0) or its probabilities, ``lead + (Tq, Tk)`` (1), of one block of queries."""
    out = np.empty(q.shape[:-1] + v.shape[-1:], np.result_type(q, k, v))
    probabilities = np.zeros(q.shape[:-1] + k.shape[-2:], out.dtype)
    attention_into(out, q, k, v, scale, causal, probabilities.reshape(-1))
    return (out, probabilities)[result]


def attention_grad_given(q, k, v, probabilities, dout, scale, causal, result):
    """``attention_grad`` from the forward's ``probabilities`` (``attention_keeping``), not made again."""
    return _gradient(q, k, v, dout, scale, causal, result, probabilities)


def attention_grad(q, k, v, out, dout, scale, causal, result):
    return _gradient(q, k, v, dout, scale, causal, result)


def _gradient(q, k, v, dout, scale, causal, result, probabilities=None):
    """dq, dk or dv (``result``): from ``probabilities`` where given, else making them in scratch."""
    dtype = np.result_type(q, k, v, dout)
    grads = [np.empty(x.shape, dtype) for x in (q, k, v)]
    scores, adjoints, partial = _scratch(q, k, v, dtype)
    if probabilities is not None:
        scores = np.ascontiguousarray(probabilities, dtype).reshape(-1)
    attention_grad_into(*grads, q, k, v, dout, scale, causal, scores, adjoints, partial,
                        given=probabilities is not None)
    return grads[result]
