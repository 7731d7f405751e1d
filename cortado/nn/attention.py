"""Causal self-attention, multi-head or grouped-query, written as the expression a user would write:
``softmax(where(causal, q @ k^T * scale, -inf)) @ v``, which the attention rules recognise and the GPU runs as
flash attention."""

import math

import numpy as np

from ..errors import ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.slicing import split
from .layers import Linear
from .module import Module, size, term


class CausalSelfAttention(Module):
    """Self-attention of ``(batch, time, width)`` inputs over ``heads`` heads of ``width / heads`` features, each
    position attending to itself and those before it; ``kv_heads`` (dividing ``heads``) keys and values shared by
    groups of query heads (grouped-query attention; ``kv_heads = heads`` is multi-head attention). One projection
    makes the queries, keys and values (``qkv``), another mixes the heads' outputs (``proj``); both in float8 with
    ``float8=True`` (``Linear``; the attention itself stays in the input's dtype)."""

    def __init__(self, width, heads, kv_heads=None, bias=True, dtype="float32", float8=False):
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        width, heads, kv_heads = (size("CausalSelfAttention", name, value) for name, value in
                                  (("width", width), ("heads", heads), ("kv_heads", kv_heads)))
        if width % heads or heads % kv_heads:
            raise ShapeError(f"CausalSelfAttention: {heads} heads must divide the width {width}, and {kv_heads} key "
                             f"and value heads must divide the {heads} heads")
        self.width, self.heads, self.kv_heads, self.size = width, heads, kv_heads, width // heads
        self.qkv = Linear(width, (heads + 2 * kv_heads) * self.size, bias, dtype=dtype, float8=float8)
        self.proj = Linear(width, width, bias, dtype=dtype, float8=float8)

    def forward(self, x):
        if term("CausalSelfAttention", x).ndim != 3 or x.shape[-1] != self.width:
            raise ShapeError(f"CausalSelfAttention({self.width}, ...) takes (batch, time, {self.width}), not {x.shape}")
        batch, time, width = x.shape
        heads, groups, size = self.heads, self.kv_heads, self.size
        causal = ct.const(np.tril(np.ones((time, time), bool)))
        scale = 1 / math.sqrt(size)
        projected = self.qkv(x)
        if groups == heads:
            q, k, v = (ct.transpose(ct.reshape(t, (batch, time, heads, size)), (0, 2, 1, 3))
                       for t in split(projected, 3, axis=-1))
            scores = ct.where(causal, q @ ct.transpose(k, (0, 1, 3, 2)) * scale, -np.inf)
            mixed = ct.transpose(ct.softmax(scores, axis=-1) @ v, (0, 2, 1, 3))
        else:  # the query heads of a group beside each other: (batch, kv heads, group, time, size)
            q, k, v = split(projected, [heads * size, (heads + groups) * size], axis=-1)
            q = ct.transpose(ct.reshape(q, (batch, time, groups, heads // groups, size)), (0, 2, 3, 1, 4))
            k, v = (ct.reshape(ct.transpose(ct.reshape(t, (batch, time, groups, size)), (0, 2, 1, 3)),
                               (batch, groups, 1, time, size)) for t in (k, v))
            scores = ct.where(causal, q @ ct.transpose(k, (0, 1, 2, 4, 3)) * scale, -np.inf)
            mixed = ct.transpose(ct.softmax(scores, axis=-1) @ v, (0, 3, 1, 2, 4))
        return self.proj(ct.reshape(mixed, (batch, time, width)))
