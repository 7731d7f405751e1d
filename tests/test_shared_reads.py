"""An elementwise kernel joining another that reads all it reads (``rules.shared_reads``), and the gelu layer's
backward that makes one: which join, where a join would hold a result longer, and that every value is as before."""

import ml_dtypes
import numpy as np

import cortado as ct
from cortado.backends.cupy import sources
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.backends.cupy.lowering import lowering as gpu_lowering
from cortado.exprgraph.graph import post_order
from cortado.rules.engine import Trace
from gpu_rewrites import rewritten_for_the_gpu


def _planned(outputs, monkeypatch=None):
    """The GPU's rewritten program and its traces; without the join where ``monkeypatch`` is given."""
    return rewritten_for_the_gpu(outputs, monkeypatch, "into_readers")


def _fused(roots):
    return {t.attr("outputs"): t for t in post_order(roots) if t.op.name == "fused"}


def _assert_same_bits(roots, expected_roots, feeds):
    for ours, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate(list(expected_roots), feeds)):
        np.testing.assert_array_equal(ours, expected)


def _gelu_layer_step():
    """A bfloat16 gelu layer's loss and gradients, its output's gradient read after its output (so the weight
    gradient runs in the backward pass, where it reads gelu computed again), over (batch, time) rows."""
    x, t = ct.var("x", (2, 64, 32), "bfloat16"), ct.var("t", (2, 64, 32), "bfloat16")
    W1, b1 = ct.var("W1", (32, 128), "bfloat16"), ct.var("b1", (128,), "bfloat16")
    W2 = ct.var("W2", (128, 32), "bfloat16")
    y = ct.gelu(x @ W1 + b1) @ W2
    loss = ct.sum(ct.cast(y * y * t, "float32"))
    rng = np.random.default_rng(5)
    feeds = {v.name: rng.standard_normal(v.shape).astype(ml_dtypes.bfloat16) for v in (x, t, W1, b1, W2)}
    return [loss, *ct.grad(loss, [W1, b1, W2])], feeds


def _assert_close(roots, outputs, feeds):
    for ours, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate(outputs, feeds)):
        ours, expected = np.asarray(ours, np.float32), np.asarray(expected, np.float32)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=2 ** -6 * np.abs(expected).max())


def test_a_gelu_layers_backward_and_its_gelu_made_again_are_one_kernel_computing_the_sigmoid_once():
    """The dgelu product whose gelu argument a weight gradient reads gelu of again is a plain product times gelu's
    slope, and that product's kernel also writes the gelu the weight gradient reads: one kernel reads the argument
    once and computes gelu's sigmoid (one exp) for both. Its values are those of the program as written."""
    outputs, feeds = _gelu_layer_step()
    roots, traces = _planned(outputs)
    assert traces["lowering"].counts()["gemm-dgelu-beside-gelu"] == 1
    assert traces["fusion"].counts()["elementwise-into-reader"] == 1
    assert not any(t.op.name == "gemm" and t.attr("epilogue") == "dgelu" for t in post_order(roots))
    (joined,) = [t for body, t in _fused(roots).items() if len(body) == 2 and all(o.shape == (2, 64, 128) for o in body)]
    operands = [Operand(a.shape, a.dtype, contiguous_strides(a.shape)) for a in joined.args]
    (source,) = sources.kernel_sources(joined.attr("outputs"), operands, (), None, joined.attr("kernel"))
    assert source.text.count("expf(") == 1, source.text
    _assert_close(roots, outputs, feeds)


def test_a_dgelu_gemm_the_compiler_keeps_keeps_its_epilogue():
    """The gemm variant naming a dgelu gemm (the compiler plans it where the plain product would be live at the memory
    peak) leaves that gemm's epilogue as it was."""
    outputs, feeds = _gelu_layer_step()
    trace = Trace()
    gpu_lowering.run(list(outputs), trace)
    (made,) = [r for r in trace if r.rule == "gemm-dgelu-beside-gelu"]
    trace = Trace()
    kept = gpu_lowering.run(list(outputs), trace, {"gemm": frozenset({made.before})})
    assert "gemm-dgelu-beside-gelu" not in trace.counts()
    assert any(t.op.name == "gemm" and t.attr("epilogue").startswith("dgelu") for t in post_order(kept))
    _assert_close(kept, outputs, feeds)


def test_a_scaled_gelu_backward_keeps_its_epilogue_so_the_scale_is_not_applied_before_rounding():
    """``3 * (p * gelu_grad(h))`` folds the 3 into the dgelu gemm's alpha, applied before the epilogue's one rounding;
    as a plain product it would scale ``p`` before ``p`` is rounded to float16, where ``3 p`` overflows (p near 30000)
    and the program as written does not. Such a product keeps its epilogue; one scaled by 1 or -1 (exact) does not,
    and its values are the program's."""
    x, t = ct.var("x", (2, 64, 32), "float16"), ct.var("t", (2, 64, 32), "float16")
    W1, W2 = ct.var("W1", (32, 128), "float16"), ct.var("W2", (128, 32), "float16")
    h = x @ W1
    a = ct.gelu(h)
    y = a @ W2
    dy = y * t
    late = ct.transpose(ct.reshape(a, (128, 128))) @ ct.reshape(dy, (128, 32))  # waits for y: reads gelu again
    feeds = {"x": np.full(x.shape, -3 / 32, np.float16), "W1": np.ones(W1.shape, np.float16),
             "W2": np.ones(W2.shape, np.float16), "t": np.full(t.shape, -1800, np.float16)}
    for factor, unfolded in ((3.0, False), (-1.0, True), (1.0, True)):
        outputs = [y, late, factor * ((dy @ ct.transpose(W2)) * ct.gelu_grad(h))]
        trace = Trace()
        roots = gpu_lowering.run(outputs, trace)
        assert ("gemm-dgelu-beside-gelu" in trace.counts()) == unfolded, factor
        ours, expected = ct.evaluate([roots[2]], feeds)[0], ct.evaluate([outputs[2]], feeds)[0]
        assert np.isfinite(expected).all() and np.isfinite(ours).all()
        np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(expected, np.float32), rtol=2e-2)


def test_a_kernel_reading_what_a_later_one_reads_joins_it_same_bits(monkeypatch):
    """exp(z), read by a product whose other operand needs another kernel's tanh(z * w), is computed by that kernel,
    which reads z anyway: one kernel fewer, every value the same bits."""
    a, b = ct.var("a", (64, 32)), ct.var("b", (32, 128))
    w, m = ct.var("w", (64, 128)), ct.var("m", (128, 128))
    z = a @ b  # made in the step: neither kernel is one of the initial ones, which run side by side
    q = ct.transpose(ct.exp(z)) @ (ct.tanh(z * w) @ m)
    joined, traces = _planned([q])
    apart, _ = _planned([q], monkeypatch)
    assert traces["fusion"].counts()["elementwise-into-reader"] == 1
    assert len(_fused(joined)) == len(_fused(apart)) - 1
    rng = np.random.default_rng(6)
    _assert_same_bits(joined, apart, {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (a, b, w, m)})


def test_a_kernel_is_not_made_earlier_for_readers_that_wait_for_more():
    """exp(z) comes after tanh(z * w) in post-order, and its reader also reads a product of tanh's result: joined, it
    would be made with tanh's and held until that product exists. Where its reader's other operand exists before
    tanh's kernel, it joins."""
    z, w, m, n = ct.var("z", (64, 128)), ct.var("w", (64, 128)), ct.var("m", (128, 128)), ct.var("n", (64, 128))
    host = ct.tanh(z * w)
    waits = ct.transpose(host @ m) @ ct.exp(z)
    ready = ct.transpose(host) @ n + ct.transpose(n) @ ct.exp(z)
    assert "elementwise-into-reader" not in _planned([waits])[1]["fusion"].counts()
    assert _planned([ready])[1]["fusion"].counts()["elementwise-into-reader"] == 1


def test_a_kernel_reading_what_another_does_not_or_reading_shifted_joins_none():
    """Kernels each reading an operand the other does not, or a slice's kernel (a shifted read), stay apart."""
    z, y, x = ct.var("z", (64, 128)), ct.var("y", (64, 128)), ct.var("x", (64, 128))
    m = ct.var("m", (128, 128))
    other = ct.transpose(ct.exp(z) * y) @ ((ct.tanh(z) * x) @ m)
    first, second = ct.split(ct.exp(ct.var("v", (64, 256))), 2, axis=1)
    for outputs in ([other], [ct.transpose(first) @ second]):
        assert "elementwise-into-reader" not in _planned(outputs)[1]["fusion"].counts()
