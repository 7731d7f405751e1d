"""A row max of a kernel's result joining that kernel (``rules.row_epilogues``): which join, and that every value is
as before (the stored value's rounding included)."""

import ml_dtypes
import numpy as np

import cortado as ct
from cortado import compiler, nn, optim
from cortado.backends.cupy import backend as gpu_backend
from cortado.exprgraph.graph import post_order


def _row_maxima_apart(roots):
    """The fused reductions that are one max over the last axis of another kernel's result."""
    return [t for t in post_order(roots) if t.op.name == "fused" and t.attr("kernel") == "reduction"
            and any(o.op.name == "max" and o.attr("axes") == (o.args[0].ndim - 1,) for o in t.attr("outputs"))]


def test_a_float8_training_steps_amax_row_maxima_join_the_kernels_that_make_their_rows(monkeypatch):
    """The float8 MLP's step as the GPU plans it: the row maxima of each layer's input, weight and gradient (an
    amax's first stage) are computed by the kernels that make those rows, and the loss and every update are the
    bits of the same program planned without joining them."""
    model = nn.MLP(64, 128, 64, activation=ct.gelu, float8=True).compute_in("bfloat16")
    x, y = ct.var("x", (4, 256, 64), "bfloat16"), ct.var("y", (4, 256, 64))
    loss = ct.mean((ct.cast(model(x), "float32") - y) ** 2)
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    traces = {}
    roots = compiler._rewrite([loss, *updates.values()], gpu_backend, traces)
    monkeypatch.setattr(compiler, "into_producers", lambda roots, trace: tuple(roots))
    apart = compiler._rewrite([loss, *updates.values()], gpu_backend, {})
    joined = sum(r.rule == "row-reduction-into-producer" for r in traces["fusion"])
    assert joined >= 2 and len(_row_maxima_apart(roots)) == len(_row_maxima_apart(apart)) - joined
    values = {v.name: np.asarray(a) for v, a in {**model.initial_values(seed=0), **state}.items()}
    rng = np.random.default_rng(4)
    history = {name: np.abs(rng.standard_normal(16)).astype(np.float32) for name in values if name.endswith("amax")}
    feeds = {**values, **history, "x": rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16),
             "y": rng.standard_normal(y.shape).astype(np.float32)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate(apart, feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))


def test_a_row_sum_of_a_kernels_result_stays_a_kernel_of_its_own():
    """Only a max joins: a sum added in another order (a row kernel's lanes against a reduction's) is other bits."""
    x = ct.var("x", (512, 256))
    y = ct.exp(x) * 2.0
    outputs = [y, ct.sum(ct.sum(y, axis=-1, keepdims=True))]
    traces = {}
    compiler._rewrite(outputs, gpu_backend, traces)
    assert not any(r.rule == "row-reduction-into-producer" for r in traces["fusion"])
