"""Train a small GPT on Shakespeare, character by character: token and position embeddings, pre-norm blocks of
causal self-attention and a gelu MLP, a head tied to the token embeddings, AdamW. Every piece is a plain
expression: layer norm is ``(x - mean) / sqrt(var + eps) * g + b``, attention ``softmax(q @ k^T * scale + mask) @ v``,
the loss ``logsumexp(logits) - take_along_axis(logits, labels)``, AdamW's moments and bias corrections updates of
the step's state. ``ct.grad`` differentiates it and ``ct.compile`` makes the training step one program.

    python examples/gpt.py [--steps 1500] [--layers 2] [--width 64] [--heads 4] [--context 64] [--batch 16]
                           [--backend numpy|cupy] [--sample 300] [--dtype float32|bfloat16]

It prints the loss every few steps (from log(63) = 4.14, a uniform guess over the text's characters), the loss on
held-out text at the end, and text sampled from the trained model. The defaults train in about 40 s on two CPU
cores (24 ms a step) to a held-out loss of 1.96; ``--backend cupy`` compiles the same step for the GPU (about 1 ms a
step on an H100). The attention and its gradient run as one op each (``rules.attention``). The text
(``examples/data/shakespeare.txt``) is the first 330 KB of the "tiny Shakespeare" corpus of Karpathy's char-rnn,
drawn from Project Gutenberg's public-domain works.
"""

import argparse
import math
import os
import time
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
    return centered / ct.sqrt(variance + eps) * gain + bias


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


def host(value):
    return value.get() if hasattr(value, "get") else np.asarray(value)


def sample(config, params, state, start, length, rng, backend, dtype, temperature=0.8):
    """``length`` characters after the ``context`` ones of ``start``, each drawn from the model's next-character
    distribution (the last position's logits, at ``temperature``)."""
    _, logits, tokens, _ = gpt(config, 1, params, dtype)
    predict = ct.compile([logits[:, -1]], inputs=[tokens, *params.values()], backend=backend)
    weights = {name: state[name] for name in params}
    window, drawn = list(start), []
    for _ in range(length):
        (scores,) = predict(tokens_in=np.array([window[-config.context:]], np.int32), **weights)
        scores = host(scores)[0].astype(np.float64) / temperature
        probabilities = np.exp(scores - scores.max())
        drawn.append(int(rng.choice(len(probabilities), p=probabilities / probabilities.sum())))
        window.append(drawn[-1])
    return drawn


def train(steps=1500, layers=2, width=64, heads=4, context=64, batch=16, learning_rate=3e-3, seed=0, backend=None,
          sample_length=300, dtype="float32", log=print):
    """Train; return ``(losses every step, held-out loss, sampled text)``."""
    from cortado.backends import gpu_visible

    backend = backend or ("cupy" if gpu_visible() else "numpy")
    text = open(TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    data = np.array([alphabet.index(c) for c in text], np.int32)
    split = len(data) * 9 // 10
    config = Config(len(alphabet), context, width, heads, layers)
    rng = np.random.default_rng(seed)
    params = parameters(config)
    loss, _, tokens, labels = gpt(config, batch, params, dtype)
    gradients = ct.grad(loss, list(params.values()))
    optimizer_state, updates = adamw(list(params.values()), gradients, learning_rate)
    started = time.perf_counter()
    step = ct.compile([loss], inputs=[tokens, labels], backend=backend, updates=updates,
                      state={**{p: v for p, v in zip(params.values(), initial_values(config, params, rng).values())},
                             **optimizer_state})
    count = sum(p.size for p in params.values())
    log(f"a GPT of {layers} layers, width {width}, {heads} heads, context {context}, {count:,} parameters, computing "
        f"in {dtype}, on {len(data):,} characters of {len(alphabet)} kinds; its step compiled for {backend} in "
        f"{time.perf_counter() - started:.1f} s: {len(step.kernels)} kernels, {step.memory.summary()}")
    losses, started = [], time.perf_counter()
    for k in range(1, steps + 1):
        x, y = windows(data[:split], batch, context, rng)
        losses.append(float(host(step(tokens_in=x, labels=y)[0])))
        if k % max(1, steps // 10) == 0 or k == 1:
            log(f"step {k:5}  loss {np.mean(losses[-max(1, steps // 10):]):.3f}  "
                f"({(time.perf_counter() - started) / k * 1e3:.0f} ms a step)")
    weights = {name: host(step.state[name]) for name in params}
    held_out_loss, _, eval_tokens, eval_labels = gpt(config, batch, params, dtype)
    evaluate = ct.compile([held_out_loss], inputs=[eval_tokens, eval_labels, *params.values()], backend=backend)
    held_out = np.mean([float(host(evaluate(tokens_in=x, labels=y, **weights)[0]))
                        for x, y in (windows(data[split:], batch, context, rng) for _ in range(8))])
    log(f"held-out loss {held_out:.3f} (a uniform guess: {math.log(len(alphabet)):.3f})")
    start = data[split:split + context]
    drawn = sample(config, params, weights, start, sample_length, rng, backend, dtype)
    text = "".join(alphabet[i] for i in start) + "".join(alphabet[i] for i in drawn)
    log("sampled, after a held-out prompt:\n" + text)
    return losses, held_out, text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["numpy", "cupy"], help="default: cupy where a GPU is visible")
    parser.add_argument("--sample", type=int, default=300, help="characters to sample at the end")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="what the model computes in (the parameters and AdamW's moments stay float32)")
    args = parser.parse_args(argv)
    train(args.steps, args.layers, args.width, args.heads, args.context, args.batch, args.learning_rate, args.seed,
          args.backend, args.sample, args.dtype)


if __name__ == "__main__":
    main()
