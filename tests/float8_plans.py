"""The float8 MLP's training step that the plan tests rewrite two ways, and the check that both ways compute the
same bits on the reference interpreter."""

import ml_dtypes
import numpy as np

import cortado as ct
from cortado import nn, optim


def float8_mlp_step(sizes, batch):
    """``(outputs, values, x, y)``: the loss and updates of an AdamW step of a gelu MLP of ``sizes`` with float8
    layers, computing in bfloat16, on ``x`` of shape ``batch + (sizes[0],)``; its state's initial values."""
    model = nn.MLP(*sizes, activation=ct.gelu, float8=True).compute_in("bfloat16")
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
