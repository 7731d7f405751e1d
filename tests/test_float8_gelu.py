"""A float8 layer's gelu, cast to float8 for the next layer, written by the product that makes its argument
(``backends/cupy/lowering/float8_gelu``): cuBLASLt's GELU_AUX_BIAS epilogue with a float8 output, its D scale and
its amax."""

import ml_dtypes
import numpy as np
import pytest

import cortado as ct
from cortado import nn, optim
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy.lowering.float8_op import FLOAT8_GEMM, float8_gemm
from cortado.exprgraph.dtypes import converted
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import GELU
from cortado.exprgraph.scaling import scale_for
from cortado.rules.api import simplifier
from cortado.rules.engine import Trace
from cortado.rules.stability import stabiliser
from reference_checks import host, skip_without_device

E4M3, BF16 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.bfloat16)


def _mlp_step(hidden, batch=(4, 32), training=True):
    """``(roots, inputs, state, updates, feeds)``: a float8 gelu MLP (64 -> hidden -> 64) computing in bfloat16; in
    training its loss and AdamW's and the amax histories' updates, else its output; its state (the histories
    random, as after some steps) and feeds."""
    model = nn.MLP(64, hidden, 64, activation=ct.gelu, float8=True).compute_in("bfloat16")
    x, y = ct.var("x", batch + (64,), "bfloat16"), ct.var("y", batch + (64,))
    out = ct.cast(model(x), "float32")
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal(x.shape).astype(BF16), "y": rng.standard_normal(y.shape).astype(np.float32)}
    state = {v: np.abs(rng.standard_normal(a.shape)).astype(np.float32) if v.name.endswith("amax") else np.asarray(a)
             for v, a in model.initial_values(seed=0).items()}
    if not training:
        return [out], [x], state, {}, feeds
    loss = ct.mean((out - y) ** 2)
    params = model.parameters()
    optimizer_state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    state.update({v: np.asarray(a) for v, a in optimizer_state.items()})
    return [loss, *updates.values()], [x, y], state, updates, feeds


def _values(state, feeds):
    return {**{v.name: a for v, a in state.items()}, **feeds}


def _lowered(roots):
    """``(roots, rules applied)``: ``roots`` through the compiler's stages up to the GPU's lowering."""
    trace = Trace()
    roots = stabiliser.run(simplifier.run(roots, Trace()), Trace())
    return gpu_backend.lowering.run(roots, trace), {r.rule for r in trace}


def _products(roots):
    return [t for t in post_order(roots) if t.op is FLOAT8_GEMM and not t.attr("output")]


def test_a_float8_layers_gelu_for_the_next_layer_is_written_by_its_product_in_float8():
    """The MLP's training step at a width whose float8 rows a row kernel cannot write transposed (1024): the first
    layer's product writes the second's float8 input, keeps the gelu's argument for gelu's gradient and gives the
    amax, and no gelu is computed apart; the loss and the amax histories are the plain expressions' but for
    rounding (AdamW's first steps, about the sign of each gradient, flip with it where a gradient is near 0)."""
    roots, _, state, updates, feeds = _mlp_step(1024)
    lowered, rules = _lowered(roots)
    assert {"float8-gemm-gelu-cast", "float8-gemm-gelu-amax"} <= rules
    (folded,) = [t for t in _products(lowered) if t.dtype == E4M3]
    assert folded.attr("epilogue") == "bias_gelu_aux" and folded.shape == (128, 1024)
    assert not [t for t in post_order(lowered) if t.op is GELU]
    read = {(t.attr("output"), t.dtype.name) for t in post_order(lowered) if t.op is FLOAT8_GEMM and t.args == folded.args}
    assert read == {(0, "float8_e4m3fn"), (1, "bfloat16"), (2, "float32")}
    values = _values(state, feeds)
    compared = [0] + [k for k, v in enumerate(updates, start=1) if v.name.endswith("amax")]
    assert len(compared) == 5  # the loss, two layers' input and weight histories
    ours, plain = ct.evaluate(lowered, values), ct.evaluate(roots, values)
    for k in compared:
        np.testing.assert_allclose(np.asarray(ours[k], np.float32), np.asarray(plain[k], np.float32), rtol=2e-2)


def test_the_folded_products_results_are_its_gelu_in_float8_its_argument_and_its_amax():
    """Reference semantics: the float32 sums scaled, the bias added (result 1, rounded to bfloat16), gelu taken in
    float32, its largest magnitude (result 2), then scaled by the D scale and rounded to e4m3, saturating
    (result 0)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((32, 64)).astype(E4M3), rng.standard_normal((48, 64)).astype(E4M3)
    bias = rng.standard_normal(48).astype(BF16)
    scale, d_scale = np.float32(0.5), np.float32(64.0)
    terms = [float8_gemm(ct.const(a), ct.const(b), E4M3, "bias_gelu_aux", ct.const(scale), ct.const(bias),
                         ct.const(d_scale), output=k) for k in range(3)]
    d, aux, amax = ct.evaluate(terms, {})
    sums = a.astype(np.float32) @ b.astype(np.float32).T * scale + bias.astype(np.float32)
    g = ct.evaluate(ct.gelu(ct.const(sums)), {})
    assert d.dtype == E4M3 and aux.dtype == BF16 and amax.dtype == np.float32 and amax.shape == ()
    np.testing.assert_array_equal(aux, sums.astype(BF16))
    assert amax == np.abs(g).max()
    np.testing.assert_array_equal(d, converted(g * d_scale, E4M3))
    assert (np.abs(d.astype(np.float32)) == 448).any()  # saturated, not NaN


def test_a_gelu_read_otherwise_or_scaled_by_its_own_amax_stays_a_kernel():
    """No fold where the gelu is read in bfloat16 too, where the float8 scale is made from the gelu itself (current
    scaling: the call would wait for its own amax), or where a row kernel writes the float8 rows transposed for the
    weight gradient (width 256): forward alone (nothing reads them transposed) the product writes them."""
    x, w = ct.var("x", (128, 64), "float8_e4m3fn"), ct.var("w", (1024, 64), "float8_e4m3fn")
    s = ct.var("s", ())
    g = ct.gelu(ct.cast(ct.matmul(x, ct.transpose(w)) * 0.25, "bfloat16"))
    cast = ct.cast(ct.cast(g, "float32") * s, "float8_e4m3fn")
    assert "float8-gemm-gelu-cast" in _lowered([cast])[1]
    assert "float8-gemm-gelu-cast" not in _lowered([cast, g])[1]
    own = scale_for(ct.max(ct.abs(ct.cast(g, "float32"))), "float8_e4m3fn")
    assert "float8-gemm-gelu-cast" not in _lowered([ct.cast(ct.cast(g, "float32") * own, "float8_e4m3fn")])[1]
    assert "float8-gemm-gelu-cast" not in _lowered(_mlp_step(256)[0])[1]
    assert "float8-gemm-gelu-cast" in _lowered(_mlp_step(256, training=False)[0])[1]


# -- on the GPU ---------------------------------------------------------------------------------


def _layer(rows=256, k=128, n=1024):
    """A float8 layer's product, its bias and gelu, cast to e4m3 at the scale ``s``, its amax, and its argument
    read on its own (as gelu's gradient reads it)."""
    x, w = ct.var("x", (rows, k), "float8_e4m3fn"), ct.var("w", (n, k), "float8_e4m3fn")
    bias, s = ct.var("bias", (n,), "bfloat16"), ct.var("s", ())
    h = ct.cast(ct.matmul(x, ct.transpose(w)) * 0.25, "bfloat16") + bias
    g = ct.cast(ct.gelu(h), "float32")
    return [ct.cast(g * s, "float8_e4m3fn"), ct.max(ct.abs(g)), h], [x, w, bias, s]


def _layer_feeds(rows=256, k=128, n=1024, s=16.0, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": (rng.standard_normal((rows, k)) * 2).astype(E4M3), "w": rng.standard_normal((n, k)).astype(E4M3),
            "bias": rng.standard_normal(n).astype(BF16), "s": np.float32(s)}


@pytest.mark.gpu
def test_on_the_gpu_the_folded_gelu_product_computes_what_its_term_says():
    """The call against its term's reference semantics (the lowered graph on the CPU: the float32 sums, scaled, the
    bias added, rounded once; the expression rounds the product and the sum with the bias to bfloat16 apart, which
    near 0 makes another value: the CPU test above holds the plain expressions to it). The float8 tensor cores keep
    about 13 bits of their partial sums (``lowering/float8.py``), so the gelu's argument may be 2^-12 of the
    products' magnitudes off the float32 sums: its float8 gelu at most one e4m3 step more off than that carries
    (gelu's slope is below 1.13), saturating where the scale carries it past 448; its kept argument one bfloat16
    step more; its amax the same, set afresh by every call (a second call on smaller values gives the smaller
    amax)."""
    skip_without_device("cupy")
    outputs, inputs = _layer()
    step = ct.compile(outputs, inputs=inputs, backend="cupy")
    assert "float8-gemm-gelu-cast" in step.explain()
    lowered, _ = _lowered(outputs)
    amaxes = []
    for seed, x_scale in ((0, 1.0), (1, 0.25)):
        feeds = _layer_feeds(seed=seed)
        feeds["x"] = (feeds["x"].astype(np.float32) * x_scale).astype(E4M3)
        got = [np.asarray(host(v), np.float32) for v in step(**feeds)]
        expected = [np.asarray(v, np.float32) for v in ct.evaluate(lowered, feeds)]
        magnitudes = np.abs(feeds["x"].astype(np.float32)) @ np.abs(feeds["w"].astype(np.float32)).T * 0.25
        argument_off = 2.0 ** -12 * magnitudes
        step_of = np.maximum(np.abs(expected[0]) * 2.0 ** -3, 2.0 ** -9)  # an e4m3 step at each value
        assert (np.abs(got[0] - expected[0]) <= step_of + 1.13 * feeds["s"] * argument_off).all()
        assert seed or (np.abs(got[0]) == 448).any()
        np.testing.assert_allclose(got[1], expected[1], rtol=2.0 ** -7)
        assert (np.abs(got[2] - expected[2]) <= np.abs(expected[2]) * 2.0 ** -7 + argument_off).all()
        amaxes.append(float(got[1]))
    assert amaxes[1] < amaxes[0]


@pytest.mark.gpu
def test_on_the_gpu_a_nan_in_a_folded_gelu_product_reaches_its_amax():
    """A NaN among the operands makes the reference's amax NaN (its max lets NaN win); the call's too, so that a
    float8 layer's history shows the step went wrong."""
    skip_without_device("cupy")
    outputs, inputs = _layer()
    feeds = _layer_feeds()
    feeds["x"][3, 5] = np.nan
    got = host(ct.compile(outputs, inputs=inputs, backend="cupy")(**feeds)[1])
    assert np.isnan(ct.compile(outputs, inputs=inputs)(**feeds)[1]) and np.isnan(got)
