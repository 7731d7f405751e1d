"""The GPT example's training step on the CPU: cortado against PyTorch's CPU eager mode.

    python benchmarks/bench_gpt_cpu.py [--repeats 50] [--out benchmarks/results/gpt_cpu.json]

The model is examples/gpt.py's at its defaults (2 layers, width 64, 4 heads, context 64, batch 16,
float32), built from cortado.nn; torch's is the same model written with torch.nn.functional over the
same weights by the same names (cortado's Linear stores (out, in), as torch's does), with
torch.optim.AdamW at the example's settings (decay on the matrices only). Each contestant runs in a
process of its own, one after the other; each takes the same first weights and the same batch, their
first losses must agree, and the median of ``repeats`` steps after a warm-up is compared. Where torch
is not installed, its row says so. Our model's build, compile and first call are timed twice more
(``compile_s``): in a process whose cache of compiled C is empty, then in one after it was filled.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)

import gpt  # noqa: E402
from versus_torch import compare, torch_training_step  # noqa: E402

import cortado as ct  # noqa: E402
from cortado import nn, optim  # noqa: E402

CONFIG = dict(context=64, width=64, heads=4, layers=2)
BATCH, LEARNING_RATE = 16, 3e-3


def case():
    """The model, its first weights by name, and one batch: the same in every process."""
    text = open(gpt.TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    data = np.array([alphabet.index(c) for c in text[:200_000]], np.int32)
    model = gpt.GPT(len(alphabet), **CONFIG)
    values = {v.name: a for v, a in model.initial_values(0).items()}
    tokens, labels = gpt.windows(data, BATCH, CONFIG["context"], np.random.default_rng(0))
    return model, values, tokens, labels


def cortado_step():
    model, values, tokens, labels = case()
    x = ct.var("tokens_in", tokens.shape, "int32")
    y = ct.var("labels", labels.shape, "int32")
    loss = nn.cross_entropy(model(x), y)
    params = model.parameters()
    adamw = optim.AdamW(LEARNING_RATE, betas=gpt.BETAS, weight_decay=gpt.WEIGHT_DECAY, decay=lambda n, p: p.ndim == 2)
    state, updates = adamw.updates(params, ct.grad(loss, list(params.values())))
    step = ct.compile([loss], inputs=[x, y], updates=updates,
                      state={**{v: values[name] for name, v in params.items()}, **state})
    return lambda: float(step(tokens_in=tokens, labels=labels)[0])


def torch_step():
    import torch
    import torch.nn.functional as F

    model, values, tokens, labels = case()
    w = {name: torch.tensor(value, requires_grad=True) for name, value in values.items()}
    x, y = torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))
    width, heads = CONFIG["width"], CONFIG["heads"]

    def linear(h, name):
        return F.linear(h, w[f"{name}.weight"], w[f"{name}.bias"])

    def norm(h, name):
        return F.layer_norm(h, (width,), w[f"{name}.weight"], w[f"{name}.bias"], eps=1e-5)

    def loss_of():
        batch, time_ = x.shape
        h = F.embedding(x, w["wte.weight"]) + w["wpe.weight"]
        for layer in range(CONFIG["layers"]):
            p = f"h.{layer}"
            q, k, v = linear(norm(h, f"{p}.ln_1"), f"{p}.attn.qkv").split(width, dim=-1)
            q, k, v = (t.view(batch, time_, heads, width // heads).transpose(1, 2) for t in (q, k, v))
            mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, time_, width)
            h = h + linear(mixed, f"{p}.attn.proj")
            h = h + linear(F.gelu(linear(norm(h, f"{p}.ln_2"), f"{p}.mlp.0"), approximate="tanh"), f"{p}.mlp.2")
        logits = norm(h, "ln_f") @ w["wte.weight"].t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))

    matrices = [p for p in w.values() if p.ndim == 2]
    others = [p for p in w.values() if p.ndim != 2]
    adamw = torch.optim.AdamW([{"params": matrices, "weight_decay": gpt.WEIGHT_DECAY},
                               {"params": others, "weight_decay": 0.0}], lr=LEARNING_RATE, betas=gpt.BETAS)
    return torch_training_step(loss_of, adamw)


CONTESTANTS = {"cortado": cortado_step, "torch": torch_step}


def main():
    compare(__doc__, __file__, CONTESTANTS, "gpt_cpu", 50, os.path.join(HERE, "results", "gpt_cpu.json"),
            {"config": CONFIG, "batch": BATCH})


if __name__ == "__main__":
    main()
