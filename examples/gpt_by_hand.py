"""The GPT of ``examples/gpt.py`` written by hand, every piece a plain expression: layer norm is ``(x - mean) /
sqrt(var + eps) * g + b``, attention ``softmax(q @ k^T * scale + mask) @ v``, the loss ``logsumexp(logits) -
take_along_axis(logits, labels)``, AdamW's moments and bias corrections updates of the step's state. ``gpt.py``
builds the same model from ``cortado.nn`` and ``cortado.optim``, and compiles to the same kernels
(``tests/test_nn.py``); the GPU benchmarks time this one against torch and jax, whose models load its weights by
these names.
"""

import math
import os
from dataclasses import dataclass

import numpy as np

import cortado as ct

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shakespeare.txt")
BETAS, EPSILON, WEIGHT_DECAY = (0.9, 0.99), 1e-8, 0.01


@dataclass(frozen=True)
class Config:
    vocabulary: int
    context: int = 64
    width: int = 64
    heads: int = 4
    layers: int = 2


def layer_norm(x, gain, bias, eps=1e-5):
    mean = ct.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = ct.mean(centered * centered, axis=-1, keepdims=True)
    return centered * (1 / ct.sqrt(variance + eps)) * gain + bias


def attention(h, p, heads, causal):
    """Causal self-attention of ``h`` (batch, time, width) with ``heads`` heads: the scores of a position on those
    after it are -inf before the softmax."""
    batch, time, width = h.shape
    size = width // heads
    q, k, v = ct.split(h @ p["qkv"] + p["qkv_bias"], 3, axis=-1)

    def heads_first(t):  # (batch, heads, time, size)
        return ct.transpose(ct.reshape(t, (batch, time, heads, size)), (0, 2, 1, 3))

    q, k, v = map(heads_first, (q, k, v))
    scores = ct.where(causal, q @ ct.transpose(k, (0, 1, 3, 2)) * (1 / math.sqrt(size)), -np.inf)
    mixed = ct.transpose(ct.softmax(scores, axis=-1) @ v, (0, 2, 1, 3))
    return ct.reshape(mixed, (batch, time, width)) @ p["proj"] + p["proj_bias"]


def mlp(h, p):
    return ct.gelu(h @ p["fc"] + p["fc_bias"]) @ p["out"] + p["out_bias"]


def parameters(config):
    """The model's variables by name: embeddings, each block's, the final norm's."""
    c = config.width
    shapes = {"tokens": (config.vocabulary, c), "positions": (config.context, c), "norm_gain": (c,), "norm_bias": (c,)}
    for layer in range(config.layers):
        shapes.update({f"{layer}.{name}": shape for name, shape in (
            ("norm1_gain", (c,)), ("norm1_bias", (c,)), ("qkv", (c, 3 * c)), ("qkv_bias", (3 * c,)),
            ("proj", (c, c)), ("proj_bias", (c,)), ("norm2_gain", (c,)), ("norm2_bias", (c,)),
            ("fc", (c, 4 * c)), ("fc_bias", (4 * c,)), ("out", (4 * c, c)), ("out_bias", (c,)))})
    return {name: ct.var(name, shape) for name, shape in shapes.items()}


def gpt(config, batch, params, dtype="float32"):
    """``(loss, logits, tokens, labels)`` of the model on ``batch`` windows of ``context`` characters, each label the
    character after its token. The parameters are float32; with another ``dtype`` (bfloat16) the model computes in
    it, each parameter cast where it is read, as mixed precision does, and the loss is taken in float32."""
    tokens = ct.var("tokens_in", (batch, config.context), "int32")
    labels = ct.var("labels", (batch, config.context), "int32")
    causal = ct.const(np.tril(np.ones((config.context, config.context), bool)))
    params = {name: p if p.dtype == np.dtype(dtype) else ct.cast(p, dtype) for name, p in params.items()}
    x = ct.take(params["tokens"], tokens, axis=0) + params["positions"]
    for layer in range(config.layers):
        p = {name.split(".", 1)[1]: v for name, v in params.items() if name.startswith(f"{layer}.")}
        x = x + attention(layer_norm(x, p["norm1_gain"], p["norm1_bias"]), p, config.heads, causal)
        x = x + mlp(layer_norm(x, p["norm2_gain"], p["norm2_bias"]), p)
    logits = layer_norm(x, params["norm_gain"], params["norm_bias"]) @ ct.transpose(params["tokens"])  # tied head
    logits = ct.cast(logits, "float32")
    picked = ct.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return ct.mean(ct.logsumexp(logits, axis=-1) - picked), logits, tokens, labels


def initial_values(config, params, rng):
    """GPT-2's: normal(0, 0.02) weights, the residual projections' scaled by 1/sqrt(2 layers), zero biases, unit
    gains."""
    values = {}
    for name, p in params.items():
        if name.endswith("gain"):
            values[name] = np.ones(p.shape, np.float32)
        elif name.endswith("bias"):
            values[name] = np.zeros(p.shape, np.float32)
        else:
            scale = 0.02 / math.sqrt(2 * config.layers) if name.endswith(("proj", "out")) else 0.02
            values[name] = (rng.standard_normal(p.shape) * scale).astype(np.float32)
    return values


def adamw(params, gradients, learning_rate):
    """AdamW as state and updates: two moments a parameter and a step count; decay on the matrices only."""
    count = ct.var("adam_step", ())
    step = count + 1
    corrected = learning_rate * ct.sqrt(1 - BETAS[1] ** step) / (1 - BETAS[0] ** step)
    state, updates = {count: np.zeros((), np.float32)}, {count: step}
    for p, g in zip(params, gradients):
        m, v = ct.var(f"m.{p.name}", p.shape), ct.var(f"v.{p.name}", p.shape)
        m_new = BETAS[0] * m + (1 - BETAS[0]) * g
        v_new = BETAS[1] * v + (1 - BETAS[1]) * g * g
        decay = WEIGHT_DECAY * learning_rate * p if p.ndim == 2 else 0
        updates.update({m: m_new, v: v_new, p: p - corrected * m_new / (ct.sqrt(v_new) + EPSILON) - decay})
        state.update({m: np.zeros(p.shape, np.float32), v: np.zeros(p.shape, np.float32)})
    return state, updates


def windows(data, batch, context, rng):
    """``batch`` random windows of the text and, for each character, the one after it."""
    starts = rng.integers(0, len(data) - context - 1, batch)
    tokens = np.stack([data[s:s + context] for s in starts])
    return tokens, np.stack([data[s + 1:s + context + 1] for s in starts])
