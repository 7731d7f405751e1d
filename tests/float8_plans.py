"""The float8 MLP's training step that the plan tests rewrite two ways, the check that both ways compute the
same bits on the reference interpreter, and a one-layer float8 GPT trained on the GPU, for the same check there."""

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import cortado as ct
from cortado import nn, optim
from reference_checks import host


def float8_mlp_step(sizes, batch, gradient_scaling="current"):
    """``(outputs, values, x, y)``: the loss and updates of an AdamW step of a gelu MLP of ``sizes`` with float8
    layers (their gradients' scales ``gradient_scaling``), computing in bfloat16, on ``x`` of shape
    ``batch + (sizes[0],)``; its state's initial values."""
    layers = [nn.Linear(n_in, n_out, float8=True, gradient_scaling=gradient_scaling)
              for n_in, n_out in zip(sizes, sizes[1:])]
    between = [[layer, nn.Function(ct.gelu)] for layer in layers[:-1]]
    model = nn.Sequential(*[m for pair in between for m in pair], layers[-1]).compute_in("bfloat16")
    x, y = ct.var("x", batch + sizes[:1], "bfloat16"), ct.var("y", batch + sizes[-1:])
    loss = ct.mean((ct.cast(model(x), "float32") - y) ** 2)
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    return [loss, *updates.values()], {**model.initial_values(seed=0), **state}, x, y


def assert_same_bits(roots, others, values, x, y):
    """``roots`` and ``others`` (two plans of one step) give the same bits, fed ``values``, random amax histories
    and random ``x`` and ``y``."""
    values = {v.name: np.asarray(a) for v, a in values.items()}
    rng = np.random.default_rng(3)
    history = {name: np.abs(rng.standard_normal(16)).astype(np.float32) for name in values if name.endswith("amax")}
    feeds = {**values, **history, "x": rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16),
             "y": rng.standard_normal(y.shape).astype(np.float32)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate(others, feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))


def float8_gpt_trained(steps=3):
    """``(kernel terms, losses, state)`` of a one-layer float8 GPT (examples/gpt.py) after ``steps`` AdamW steps on the GPU,
    planned without recomputation (a copy of a kernel made again after the peak may contract its multiply-adds
    otherwise than the kernel did, which would hide whether a pass under test changed a bit)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from gpt import BETAS, GPT, WEIGHT_DECAY, windows

    model = GPT(65, 256, 256, 4, None, 1, True).compute_in("bfloat16")
    tokens, labels = ct.var("tokens_in", (4, 256), "int32"), ct.var("labels", (4, 256), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    adamw = optim.AdamW(lr=3e-3, betas=BETAS, weight_decay=WEIGHT_DECAY, decay=lambda name, p: p.ndim == 2)
    state, updates = adamw.updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    step = ct.compile([loss], inputs=[tokens, labels], backend="cupy", updates=updates,
                      state={**model.initial_values(0), **state}, recompute=False)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 65, 100000).astype(np.int32)
    losses = [float(host(step(tokens_in=x, labels=y)[0])) for x, y in (windows(data, 4, 256, rng)
                                                                      for _ in range(steps))]
    return [k.term for k in step.kernels], losses, {k: np.asarray(host(v)) for k, v in step.state.items()}


def assert_same_training(ours, theirs):
    """Two ``float8_gpt_trained`` results: the same losses and state, bit for bit."""
    assert ours[1] == theirs[1]
    for name, value in theirs[2].items():
        np.testing.assert_array_equal(ours[2][name], value, err_msg=name)
