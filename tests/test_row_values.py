"""A row kernel's output made by its readers (``rules.row_values``): a layer norm's normalized rows computed by its
gain's gradient from the layer's input and statistics instead of stored; where that is refused; and that every
value is as before, to the bit."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.exprgraph.graph import post_order
from cortado.rules.fusion import ROW_KERNEL
from gpu_rewrites import rewritten_for_the_gpu


def _rewritten(outputs, monkeypatch=None):
    """The GPU's rewritten program and its traces; without ``made_by_readers`` where ``monkeypatch`` is given."""
    return rewritten_for_the_gpu(outputs, monkeypatch, "made_by_readers")


def _row_kernel_bodies(roots):
    return {t.attr("outputs") for t in post_order(roots) if t.op.name == "fused" and t.attr("kernel") == ROW_KERNEL}


def _layer_norm_step():
    """A layer norm between two bfloat16 products (the backward pass reads its input and statistics for the input's
    gradient), its loss and every gradient."""
    x = ct.var("x", (4, 16, 64), "bfloat16")
    W1, W2 = ct.var("W1", (64, 64), "bfloat16"), ct.var("W2", (64, 32), "bfloat16")
    norm = ct.nn.LayerNorm(64, dtype="float32")
    y = norm(x @ W1) @ W2
    loss = ct.sum(ct.cast(y * y, "float32"))
    params = [x, W1, W2, norm.weight, norm.bias]
    rng = np.random.default_rng(3)
    feeds = {v.name: rng.standard_normal(v.shape).astype(ml_dtypes.bfloat16 if v.dtype == np.dtype(ml_dtypes.bfloat16)
                                                          else v.dtype) for v in params if v.op.name == "var"}
    feeds.update({norm.weight.name: rng.standard_normal(64).astype(np.float32),
                  norm.bias.name: rng.standard_normal(64).astype(np.float32)})
    return [loss, *ct.grad(loss, params)], feeds


def _same_bits(roots, expected_roots, feeds):
    for ours, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate(list(expected_roots), feeds)):
        np.testing.assert_array_equal(ours, expected)


def test_a_layer_norms_normalized_rows_are_made_by_its_gain_gradient_not_stored(monkeypatch):
    """The forward kernel writes the output and the statistics, not the normalized rows; the gain's gradient reads
    the layer's input and statistics instead, and every value is the same, bit for bit."""
    outputs, feeds = _layer_norm_step()
    roots, traces = _rewritten(outputs)
    assert traces["fusion"].counts()["row-value-made-by-reader"] == 1
    before, _ = _rewritten(outputs, monkeypatch)
    wide = [sum(o.shape == (4, 16, 64) for o in body) for body in _row_kernel_bodies(roots)]
    wide_before = [sum(o.shape == (4, 16, 64) for o in body) for body in _row_kernel_bodies(before)]
    assert sum(wide) == sum(wide_before) - 1
    _same_bits(roots, before, feeds)


@pytest.mark.parametrize("product", [False, True])
def test_rows_a_product_reads_too_are_stored(product):
    """Normalized rows a product reads too (a library call reads stored values) stay an output of the kernel; read
    by fused kernels alone, they are made by them."""
    x = ct.var("x", (4, 16, 64), "bfloat16")
    W = ct.var("W1", (64, 64), "bfloat16")
    wide = ct.cast(x @ W, "float32")
    mean = ct.mean(wide, axis=-1, keepdims=True)
    rows = ct.cast((wide - mean) / ct.sqrt(ct.mean((wide - mean) * (wide - mean), axis=-1, keepdims=True) + 1e-5),
                   "bfloat16")
    gain, W2 = ct.var("g", (64,), "bfloat16"), ct.var("W2", (64, 32), "bfloat16")
    y = (rows * gain) @ W2
    loss = ct.sum(ct.cast(y * y, "float32"))
    if product:
        loss = loss + ct.sum(ct.cast(rows @ W2, "float32"))
    _, traces = _rewritten([loss, *ct.grad(loss, [x, gain, W2])])
    assert traces["fusion"].counts()["row-value-made-by-reader"] == (0 if product else 1)


def test_rows_made_from_wider_values_are_stored():
    """Normalized rows of a float32 input are made by their readers in float32 (from as many bytes), never where
    they are bfloat16: their readers would read twice their bytes."""
    x = ct.var("x", (4, 16, 64), "float32")
    W1, W2 = ct.var("W1", (64, 64), "float32"), ct.var("W2", (64, 32), "bfloat16")
    gain, bias = ct.var("g", (64,), "bfloat16"), ct.var("b", (64,), "bfloat16")
    h = x @ W1
    mean = ct.mean(h, axis=-1, keepdims=True)
    centered = h - mean
    rows = ct.cast(centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5), "bfloat16")
    loss = ct.sum(ct.cast((rows * gain + bias) @ W2, "float32"))
    _, traces = _rewritten([loss, *ct.grad(loss, [x, W1, gain, bias])])
    made = [r.before for r in traces["fusion"] if r.rule == "row-value-made-by-reader"]
    assert made and all(t.dtype == np.float32 for t in made)


def test_rows_the_program_returns_are_stored():
    """Normalized rows that are an output of the program stay an output of the kernel."""
    x = ct.var("x", (4, 16, 64), "bfloat16")
    wide = ct.cast(x, "float32")
    mean = ct.mean(wide, axis=-1, keepdims=True)
    centered = wide - mean
    rows = ct.cast(centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5), "bfloat16")
    gain = ct.var("g", (64,), "float32")
    loss = ct.sum(ct.cast(rows, "float32") * gain)
    _, traces = _rewritten([loss, rows, *ct.grad(loss, [x, gain])])
    assert "row-value-made-by-reader" not in traces["fusion"].counts()


@st.composite
def _normalized_steps(draw, sides=((2, 3), (4, 1), (1, 5)), widths=(8, 12, 33)):
    """A training step around a layer norm drawn in one of its written forms: the input made by a product or read
    as fed, in bfloat16 or float32, its statistics in float32, its rows scaled by a reciprocal or divided, cast or
    not, with a gain and a bias or without, then a product or an elementwise op; every gradient; and feeds. Rows of
    the leading ``sides``, of ``widths`` values."""
    dtype = draw(st.sampled_from(["bfloat16", "float32"]))
    rows, n = draw(st.sampled_from(sides)), draw(st.sampled_from(widths))
    x = ct.var("x", rows + (n,), dtype)
    variables = [x]
    h = x
    if draw(st.booleans()):
        W = ct.var("W", (n, n), dtype)
        variables.append(W)
        h = x @ W
    wide = ct.cast(h, "float32")
    centered = wide - ct.mean(wide, axis=-1, keepdims=True)
    variance = ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5
    normed = centered * (1 / ct.sqrt(variance)) if draw(st.booleans()) else centered / ct.sqrt(variance)
    if draw(st.booleans()):
        normed = ct.cast(normed, dtype)
    if draw(st.booleans()):
        gain, bias = ct.var("g", (n,), normed.dtype), ct.var("b", (n,), normed.dtype)
        variables += [gain, bias]
        normed = normed * gain + bias
    if draw(st.booleans()):
        V = ct.var("V", (n, 4), normed.dtype)
        variables.append(V)
        out = normed @ V
    else:
        out = ct.exp(normed) * normed
    loss = ct.sum(ct.cast(out * out, "float32"))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in variables}
    return [loss, *ct.grad(loss, variables)], feeds


@settings(max_examples=30)
@given(_normalized_steps())
def test_a_layer_norms_step_computes_the_same_bits_with_rows_made_by_readers(case):
    """Layer norm steps in their written forms, rewritten for the GPU with and without rows made by their readers:
    the same bits."""
    outputs, feeds = case
    roots, _ = _rewritten(outputs)
    with pytest.MonkeyPatch.context() as patched:
        before, _ = _rewritten(outputs, patched)
    _same_bits(roots, before, feeds)
