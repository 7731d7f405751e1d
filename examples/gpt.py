"""Train a small GPT on Shakespeare, character by character, built from ``cortado.nn`` and ``cortado.optim``: token and
position embeddings, pre-norm blocks of causal self-attention and a gelu MLP, a head tied to the token embeddings,
AdamW. The layers write the plain expressions one would write by hand (``examples/gpt_by_hand.py`` is that
model, and compiles to the same kernels); ``ct.grad`` differentiates it and ``ct.compile`` makes the training step,
optimizer included, one program.

    python examples/gpt.py [--steps 1500] [--layers 2] [--width 64] [--heads 4] [--kv-heads 4] [--context 64]
                           [--batch 16] [--backend numpy|cupy] [--sample 300] [--dtype float32|bfloat16|float8]
                           [--checkpoint run.safetensors [--resume]] [--plot loss.png]

It shows the training's progress (the loss of the last steps, as a progress bar where tqdm is installed), the loss
on held-out text at the end, and text sampled from the trained model. The defaults train in 6 to 10 s on two CPU
cores (4 to 5 ms a step; longer in a busy machine's slow spells) to a held-out loss of 1.96; ``--backend cupy``
compiles the same step for the GPU.
``--dtype float8`` computes in bfloat16 with every linear layer's product in float8 (``nn.Linear(...,
float8=True)``: delayed power-of-two scales, gradients rounded to e5m2), on the GPU's float8 tensor cores.
``--checkpoint`` saves the program's state (weights, AdamW's moments, its step count) and the data generator's
position at the end; ``--resume`` starts from them, so a run of 1500 steps and one of 750 resumed for 750 more end
with the same weights, bit for bit. ``--plot`` draws the loss curve (matplotlib). The text
(``examples/data/shakespeare.txt``) is the first 330 KB of the "tiny Shakespeare" corpus of Karpathy's char-rnn,
drawn from Project Gutenberg's public-domain works.
"""

import argparse
import json
import math
import os
import time

import numpy as np

import cortado as ct
from cortado import nn, optim

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shakespeare.txt")
BETAS, WEIGHT_DECAY = (0.9, 0.99), 0.01


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, width, heads, kv_heads, float8=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.CausalSelfAttention(width, heads, kv_heads, float8=float8)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.MLP(width, 4 * width, width, activation=ct.gelu, float8=float8)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final layer norm and a head tied to the token embeddings;
    GPT-2's initialisation: normal(0, 0.02) weights, the residual projections' scaled by 1/sqrt(2 layers), zero
    biases, unit norm gains; the blocks' linear layers in float8 with ``float8=True``."""

    def __init__(self, vocabulary, context=64, width=64, heads=4, kv_heads=None, layers=2, float8=False):
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocabulary, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList([Block(width, heads, kv_heads or heads, float8) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        for name, parameter in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                parameter.init = nn.init.normal(0.02 / math.sqrt(2 * layers))
            elif name.endswith("bias"):
                parameter.init = nn.init.zeros
            elif not name.split(".")[-2].startswith("ln"):
                parameter.init = nn.init.normal(0.02)

    def forward(self, tokens):
        """The logits (float32) of the next character after each of ``tokens`` ``(batch, context)``."""
        x = self.wte(tokens) + self.wpe.weight
        for block in self.h:
            x = block(x)
        return ct.cast(self.ln_f(x) @ ct.transpose(self.wte.weight), "float32")


def windows(data, batch, context, rng):
    """``batch`` random windows of the text and, for each character, the one after it."""
    starts = rng.integers(0, len(data) - context - 1, batch)
    tokens = np.stack([data[s:s + context] for s in starts])
    return tokens, np.stack([data[s + 1:s + context + 1] for s in starts])


def host(value):
    return value.get() if hasattr(value, "get") else np.asarray(value)


def progress(steps, log):
    """The step numbers 1..steps, shown as a progress bar where tqdm is installed (else ``log`` reports them)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return range(1, steps + 1), None
    bar = tqdm(range(1, steps + 1), unit="step", dynamic_ncols=True, leave=log is print)
    return bar, bar


def sample(model, weights, start, length, rng, backend, temperature=0.8):
    """``length`` characters after the ``context`` ones of ``start``, each drawn from the model's next-character
    distribution (the last position's logits, at ``temperature``)."""
    tokens = ct.var("tokens_in", (1, model.context), "int32")
    values = {**model.parameters(), **model.buffers()}
    predict = ct.compile([model(tokens)[:, -1]], inputs=[tokens, *values.values()], backend=backend)
    window, drawn = list(start), []
    for _ in range(length):
        (scores,) = predict(tokens_in=np.array([window[-model.context:]], np.int32), **weights)
        scores = host(scores)[0].astype(np.float64) / temperature
        probabilities = np.exp(scores - scores.max())
        drawn.append(int(rng.choice(len(probabilities), p=probabilities / probabilities.sum())))
        window.append(drawn[-1])
    return drawn


def train(steps=1500, layers=2, width=64, heads=4, kv_heads=None, context=64, batch=16, learning_rate=3e-3, seed=0,
          backend=None, sample_length=300, dtype="float32", checkpoint=None, resume=False, plot=None, log=print):
    """Train; return ``(losses of the steps taken, held-out loss, sampled text)``."""
    from cortado.backends import gpu_visible

    backend = backend or ("cupy" if gpu_visible() else "numpy")
    text = open(TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    data = np.array([alphabet.index(c) for c in text], np.int32)
    split = len(data) * 9 // 10
    float8 = dtype == "float8"
    model = GPT(len(alphabet), context, width, heads, kv_heads, layers, float8)
    model.compute_in("bfloat16" if float8 else dtype)
    tokens = ct.var("tokens_in", (batch, context), "int32")
    labels = ct.var("labels", (batch, context), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    gradients = ct.grad(loss, list(params.values()))
    adamw = optim.AdamW(lr=learning_rate, betas=BETAS, weight_decay=WEIGHT_DECAY, decay=lambda name, p: p.ndim == 2)
    optimizer_state, updates = adamw.updates(params, gradients)
    updates.update(model.state_updates(loss))  # float8 layers' amax histories
    started = time.perf_counter()
    step = ct.compile([loss], inputs=[tokens, labels], backend=backend, updates=updates,
                      state={**model.initial_values(seed), **optimizer_state})
    rng = np.random.default_rng(seed)
    if resume:
        ct.load(step, checkpoint)
        with open(checkpoint + ".json") as file:
            rng.bit_generator.state = json.load(file)["data_generator"]
        log(f"resumed from {checkpoint} after step {int(host(step.state[adamw.name + '.step']))}")
    count = sum(p.size for p in params.values())
    log(f"a GPT of {layers} layers, width {width}, {heads} heads, context {context}, {count:,} parameters, computing "
        f"in {dtype}, on {len(data):,} characters of {len(alphabet)} kinds; its step compiled for {backend} in "
        f"{time.perf_counter() - started:.1f} s: {step.kernels_run} kernels, {step.memory.summary()}")
    losses, started = [], time.perf_counter()
    numbers, bar = progress(steps, log)
    every = max(1, steps // 10)
    for k in numbers:
        x, y = windows(data[:split], batch, context, rng)
        losses.append(float(host(step(tokens_in=x, labels=y)[0])))
        if bar is not None:
            bar.set_postfix(loss=f"{np.mean(losses[-every:]):.3f}", refresh=False)
        elif k % every == 0 or k == 1:
            log(f"step {k:5}  loss {np.mean(losses[-every:]):.3f}  "
                f"({(time.perf_counter() - started) / k * 1e3:.0f} ms a step)")
    if bar is not None:
        bar.close()
    log(f"{steps} steps in {time.perf_counter() - started:.1f} s ({(time.perf_counter() - started) / steps * 1e3:.0f} "
        f"ms a step): loss {losses[0]:.3f} at the first, {np.mean(losses[-every:]):.3f} over the last {every}")
    if checkpoint:
        ct.save(step, checkpoint, {"steps": int(host(step.state[f"{adamw.name}.step"]))})
        with open(checkpoint + ".json", "w") as file:
            json.dump({"data_generator": rng.bit_generator.state}, file)
        log(f"saved the program's state to {checkpoint}")
    if plot:
        _plot(losses, plot, log)
    model.eval()
    weights = {name: host(step.state[name]) for name in {**params, **model.buffers()}}
    eval_tokens = ct.var("tokens_in", (batch, context), "int32")
    eval_labels = ct.var("labels", (batch, context), "int32")
    held_out_loss = nn.cross_entropy(model(eval_tokens), eval_labels)
    evaluate = ct.compile([held_out_loss], inputs=[eval_tokens, eval_labels, *params.values(), *model.buffers().values()],
                          backend=backend)
    held_out = np.mean([float(host(evaluate(tokens_in=x, labels=y, **weights)[0]))
                        for x, y in (windows(data[split:], batch, context, rng) for _ in range(8))])
    log(f"held-out loss {held_out:.3f} (a uniform guess: {math.log(len(alphabet)):.3f})")
    if not sample_length:
        return losses, held_out, ""
    start = data[split:split + context]
    drawn = sample(model, weights, start, sample_length, rng, backend)
    text = "".join(alphabet[i] for i in start) + "".join(alphabet[i] for i in drawn)
    log("sampled, after a held-out prompt:\n" + text)
    return losses, held_out, text


def _plot(losses, path, log):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"no loss curve: matplotlib is not installed (pip install -e \".[plot]\"), so {path} is not drawn")
        return
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(np.arange(1, len(losses) + 1), losses, linewidth=0.6, alpha=0.5, label="each step")
    window = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    axes.plot(np.arange(window, len(losses) + 1), smooth, label=f"mean of {window}")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    log(f"drew the loss curve to {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, help="key and value heads (grouped-query attention); default: --heads")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["numpy", "cupy"], help="default: cupy where a GPU is visible")
    parser.add_argument("--sample", type=int, default=300, help="characters to sample at the end")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float8"], default="float32",
                        help="what the model computes in (the parameters and AdamW's moments stay float32); float8: "
                             "bfloat16, with the linear layers' products in float8")
    parser.add_argument("--checkpoint", help="save the program's state here at the end (safetensors)")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint's state")
    parser.add_argument("--plot", help="draw the loss curve to this image (matplotlib)")
    args = parser.parse_args(argv)
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint")
    train(args.steps, args.layers, args.width, args.heads, args.kv_heads, args.context, args.batch, args.learning_rate,
          args.seed, args.backend, args.sample, args.dtype, args.checkpoint, args.resume, args.plot)


if __name__ == "__main__":
    main()
