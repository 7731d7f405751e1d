"""A fuzzer at the edges: random programs, compiled on every backend, against the reference interpreter, fed
NaN, infinities, the dtype's extremes, signed zeros and subnormals, and shapes with empty axes.

A compiled program must compute what its expressions say. Each value is compared with the reference in the
declared dtypes and with the reference in float64 (a rewrite that computes more accurately, a stable form, may
match only that one); either will do, but a NaN must stay a NaN, an infinity that same infinity, and a finite
value finite and close. Gradients are taken of every float input, so the backward rules meet the same values.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.exprgraph.dtypes import finfo, is_float
from cortado.testing import ALL_OPS, feeds, graphs
from reference_checks import (BACKENDS, agrees, check, run, skip_without_device, with_gradients,
                              zeros_face_non_finite_weights)

EXAMPLES = int(os.environ.get("CORTADO_FUZZ_EXAMPLES", "40"))  # more for a long campaign; benchmarks/run_gpu.sh sets fewer
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def _edges(dtype):
    """The values at which rewrites and kernels go wrong: non-finite, the largest and smallest, signed zeros."""
    info = finfo(dtype)
    return [np.nan, np.inf, -np.inf, float(info.max), -float(info.max), float(info.tiny), -float(info.tiny),
            float(info.smallest_subnormal), 0.0, -0.0, 1.0, -1.0]


def _finite_edges(dtype):
    """The edges that keep a product of a few of them finite: signed zeros, the smallest, large but not the largest."""
    info = finfo(dtype)
    return [float(info.tiny), -float(info.tiny), float(info.smallest_subnormal), 0.0, -0.0, 100.0, -100.0]


@st.composite
def _at_edges(draw, arrays, edges=_edges):
    """``arrays`` with some elements of each float array replaced by ``edges`` of its dtype."""
    edged = {}
    for name, array in arrays.items():
        array = np.array(array, copy=True)
        if is_float(array.dtype) and array.size:
            flat = array.reshape(-1)
            for index in draw(st.lists(st.integers(0, array.size - 1), max_size=min(array.size, 3), unique=True)):
                flat[index] = array.dtype.type(draw(st.sampled_from(edges(array.dtype))))
        edged[name] = array
    return edged


@st.composite
def _graph_at_edges(draw, dtypes):
    graph = draw(graphs(ops=ALL_OPS, dtypes=dtypes))
    return graph, draw(_at_edges(draw(feeds(graph))))


@pytest.mark.parametrize("backend", BACKENDS)
@FUZZ
@given(case=_graph_at_edges(("float32", "float64")))
def test_random_programs_at_edge_values(backend, case):
    skip_without_device(backend)
    graph, feed = case
    check(with_gradients(graph.outputs, graph.inputs), graph.inputs, feed, backend)


@pytest.mark.gpu
@FUZZ
@given(case=_graph_at_edges(("bfloat16", "float16")))
def test_random_half_precision_programs_at_edge_values_on_the_gpu(case):
    skip_without_device("cupy")
    graph, feed = case
    check(list(graph.outputs), graph.inputs, feed, "cupy")


_CHAIN_CONSTANTS = [2.0, 0.5, 3.0, -1.5, 1e8, -1e8, 1e30, 1e-30, 2.0 ** 100, 2.0 ** -100, 0.1]
_CHAIN_OPS = {"+": lambda t, c: t + c, "*": lambda t, c: t * c, "-": lambda t, c: t - c, "/": lambda t, c: t / c,
              "c-": lambda t, c: c - t, "-self": lambda t, c: t - t}


@st.composite
def _constant_chains(draw):
    """``x`` through a few ops with constants, so that rewrites meet constants to collect, at edge values."""
    steps = draw(st.lists(st.tuples(st.sampled_from(sorted(_CHAIN_OPS)), st.sampled_from(_CHAIN_CONSTANTS)),
                          min_size=1, max_size=4))
    values = draw(st.lists(st.sampled_from(_edges(np.float32) + [1.5, 3.25, -7.0, 1e10, 1e-20]), min_size=4, max_size=4))
    return steps, np.array(values, np.float32)


def _chain(x, steps):
    for op, constant in steps:
        x = _CHAIN_OPS[op](x, constant)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@FUZZ
@given(case=_constant_chains())
def test_constant_chains_at_edge_values(backend, case):
    skip_without_device(backend)
    steps, values = case
    x = ct.var("x", (4,))
    check(with_gradients([_chain(x, steps)], [x]), [x], {"x": values}, backend)


def test_the_fuzzer_finds_what_fast_math_changes():
    """The check fails where a program regroups what the expression says: it would find a rewrite doing so."""
    x = ct.var("x", (4,))
    values = np.array([1.5, 3.25, 1e10, -7.0], np.float32)
    for steps in ([("+", 1e8), ("+", -1e8)], [("*", 1e30), ("*", 1e-30)], [("-self", 0.0)]):
        feed = {"x": values if steps[0][0] != "-self" else np.array([np.inf, 1, 2, 3], np.float32)}
        with pytest.raises(AssertionError, match="differs from the reference"):
            check([_chain(x, steps)], [x], feed, "numpy", fast_math=True)
        check([_chain(x, steps)], [x], feed, "numpy")


def test_the_gpu_is_not_held_to_one_reading_of_padding_facing_a_nan_weight():
    """Where a convolution's padding (or its input dilation's zeros) faces a NaN or infinite weight, the reference
    multiplies the zeros (NaN) and cuDNN adds no term (a number): the fuzzer found a bfloat16 convolution of a NaN by
    itself with one position of padding giving 0 on an H200. The GPU's checks set such feeds aside; a NaN image
    facing the padding, or a NaN weight with none, is still judged."""
    x, w = ct.var("x", (1, 1, 2)), ct.var("w", (1, 1, 1))
    nan_weight = {"x": np.ones((1, 1, 2), np.float32), "w": np.full((1, 1, 1), np.nan, np.float32)}
    nan_image = {"x": np.full((1, 1, 2), np.nan, np.float32), "w": np.ones((1, 1, 1), np.float32)}
    padded, dilated, plain = ct.conv(x, w, padding=((0, 1),)), ct.conv(x, w, lhs_dilation=2), ct.conv(x, w)
    assert zeros_face_non_finite_weights([padded], nan_weight)
    assert zeros_face_non_finite_weights([ct.relu(dilated)], nan_weight)
    assert not zeros_face_non_finite_weights([plain], nan_weight)
    assert not zeros_face_non_finite_weights([padded], nan_image)


def _images(draw, shape, dtype, edges=_edges):
    values = draw(st.lists(st.floats(-3, 3, width=32), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return draw(_at_edges({"v": np.array(values, dtype).reshape(shape)}, edges))["v"]


@pytest.mark.parametrize("backend", BACKENDS)
@FUZZ
@given(data=st.data())
def test_convolution_and_pooling_at_edge_values(backend, data):
    """A conv layer with bias and relu, max and average pooling, and every gradient, its image and bias fed NaN and
    infinities. The weights stay finite: the gradients, written as convolutions, multiply the padding's zeros by the
    weights (0 * inf is NaN) where cuDNN's skip the padding, and they differ only where the forward pass is NaN
    everywhere already."""
    skip_without_device(backend)
    n, c, k, side = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)), 6
    stride, padding = data.draw(st.integers(1, 2)), data.draw(st.integers(0, 1))
    x, w, b = ct.var("x", (n, c, side, side)), ct.var("w", (k, c, 3, 3)), ct.var("b", (k,))
    h = ct.relu(ct.conv2d(x, w, stride=stride, padding=padding) + ct.reshape(b, (-1, 1, 1)))
    pooled = ct.max_pool2d(h, 2) + ct.avg_pool2d(h, 2)
    weights = st.lists(st.floats(-2.0 ** 100, 2.0 ** 100, width=32), min_size=w.size, max_size=w.size)
    feed = {"x": _images(data.draw, x.shape, np.float32), "w": np.array(data.draw(weights), np.float32).reshape(w.shape),
            "b": _images(data.draw, b.shape, np.float32)}
    check(with_gradients([pooled], [x, w, b]), [x, w, b], feed, backend)


_INT8 = {"int8": (-128, 127), "uint8": (0, 255)}


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=max(EXAMPLES // 3, 1), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_int8_products_at_their_extremes(backend, data):
    """Dequantized products whose operands sit at their dtype's extremes, with contractions up to past the bound
    where an int32 sum would overflow: the product computes what the float product says."""
    skip_without_device(backend)
    a_dtype, w_dtype = data.draw(st.sampled_from(sorted(_INT8))), data.draw(st.sampled_from(sorted(_INT8)))
    k = data.draw(st.sampled_from([1, 31, 256, 33025, 33026, 65794]))
    a, w = ct.var("a", (4, k), a_dtype), ct.var("w", (k, 8), w_dtype)
    product = ct.dequantize(a, 0.01) @ ct.dequantize(w, 0.02)
    extreme = st.sampled_from(["low", "high", "mixed"])

    def filled(dtype, shape, how):
        lo, hi = _INT8[dtype]
        if how == "mixed":
            return np.random.default_rng(k).choice([lo, hi], size=shape).astype(dtype)
        return np.full(shape, lo if how == "low" else hi, dtype)

    feed = {"a": filled(a_dtype, a.shape, data.draw(extreme)), "w": filled(w_dtype, w.shape, data.draw(extreme))}
    _, (ours,) = run([product], [a, w], feed, backend)
    scale = np.float64(np.float32(0.01)) * np.float64(np.float32(0.02))
    exact = feed["a"].astype(np.float64) @ feed["w"].astype(np.float64) * scale
    magnitude = np.abs(feed["a"].astype(np.float64)) @ np.abs(feed["w"].astype(np.float64)) * scale  # float32 sums
    assert (np.abs(ours - exact) <= 1e-5 * magnitude + 1e-6).all()  # round within this; a wrapped sum is far off


@pytest.mark.parametrize("backend", BACKENDS)
@FUZZ
@given(data=st.data(), dtype=st.sampled_from(["float32", "bfloat16", "float16"]))
def test_attention_at_edge_values(backend, data, dtype):
    """Causal softmax attention as users write it (which the GPU runs as one fused attention call in half
    precision), its values NaN, infinite or extreme where the edges land, its queries and keys at edges that keep
    each row of scores finite. A row of scores that is NaN is NaN at every key in the written form, masked keys too
    (0 over a NaN sum), and so in the values' gradient of every key; cuDNN's flash attention, as torch's
    scaled_dot_product_attention, leaves the keys it masks out of such a row's gradient (``_attention_excluding_masked``).
    Where a value is infinite, cuDNN's backward pass forms its row sums from the output it stored in half precision
    and may give -inf where the written form gives NaN: a NaN and an infinity agree here, a number and either never.
    A row sum ``dout . out`` of -inf (a value of -inf reaching the row's output) cuDNN takes as 0, which leaves the
    row's score gradients finite at its finite keys (found by the fuzzer: bfloat16 q = k = 0, one value -inf, the
    other keys' gradients 0 where the written form gives NaN); the output and the query's gradient are non-finite in
    both."""
    skip_without_device(backend)
    b, t, d = 2, data.draw(st.sampled_from([4, 8])), 16
    q, k, v = (ct.var(name, (b, t, d), dtype) for name in "qkv")
    scores = (q @ ct.transpose(k, (0, 2, 1))) * (1 / d ** 0.5)  # a Python float: the scores keep q's dtype
    causal = np.tril(np.ones((t, t), bool))
    masked = ct.where(causal, scores, -np.inf)
    out = ct.softmax(masked, axis=-1) @ v
    drawn = np.dtype(dtype) if dtype != "bfloat16" else np.float32  # then rounded to bfloat16
    feed = {name: _images(data.draw, (b, t, d), drawn, _edges if name == "v" else _finite_edges).astype(q.dtype)
            for name in "qkv"}
    with np.errstate(all="ignore"):
        flash = _attention_excluding_masked(*(feed[name] for name in "qkv"), 1 / d ** 0.5)
        magnitudes = _attention_excluding_masked(*(feed[name] for name in "qkv"), 1 / d ** 0.5, absolute=True)
    check(with_gradients([out], [q, k, v]), [q, k, v], feed, backend, also=[flash], non_finite_alike=True,
          magnitudes=magnitudes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_where_minus_infinity_reaches_the_output(backend):
    """The fuzzer's find, pinned: bfloat16 queries and keys of 0 and one value of -inf, which reaches every query's
    output; on the GPU the other keys' gradients are cuDNN's (its row sum of -inf taken as 0), elsewhere the
    written form's NaN."""
    skip_without_device(backend)
    b, t, d = 2, 4, 16
    q, k, v = (ct.var(name, (b, t, d), "bfloat16") for name in "qkv")
    scores = (q @ ct.transpose(k, (0, 2, 1))) * (1 / d ** 0.5)
    out = ct.softmax(ct.where(np.tril(np.ones((t, t), bool)), scores, -np.inf), axis=-1) @ v
    feed = {name: np.zeros((b, t, d), q.dtype) for name in "qk"}
    feed["v"] = np.random.default_rng(0).standard_normal((b, t, d)).astype(q.dtype)
    feed["v"][0, 0, 0] = -np.inf
    with np.errstate(all="ignore"):
        flash = _attention_excluding_masked(*(feed[name] for name in "qkv"), 1 / d ** 0.5)
        magnitudes = _attention_excluding_masked(*(feed[name] for name in "qkv"), 1 / d ** 0.5, absolute=True)
    assert np.isfinite(flash[2][0, 1:]).all() and np.isnan(flash[1][0]).all()
    check(with_gradients([out], [q, k, v]), [q, k, v], feed, backend, also=[flash], non_finite_alike=True,
          magnitudes=magnitudes)


def _masked_sum(mask, products, axis):
    """The sum over ``axis`` of ``products`` where ``mask`` holds, the rest left out (not added as 0 * x)."""
    return np.sum(np.where(mask, products, 0.0), axis=axis)


def _attention_excluding_masked(q, k, v, scale, absolute=False):
    """``[out, dq, dk, dv]`` of causal attention (the adjoint of ``out`` all ones) with each query's masked keys
    left out of every sum, as flash attention leaves them, where the written form weights them by 0 (and so a NaN
    or infinity there reaches it): in float64 NumPy.

    With ``absolute``, every operand of a sum is taken by its absolute value (the probabilities stay those of the
    scores): the scale of each element's rounding error. Flash attention's backward pass subtracts from each score's
    gradient its row's sum ``dout . out``, formed from the output stored in half precision, so a gradient that
    cancels to nearly 0 is off by up to the rounding of ``|dout| . |out|`` (found by the fuzzer: cuDNN's bfloat16
    ``dk`` of 0 where float64 gives 9.3e-05)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    t = q.shape[-2]
    mask = np.tril(np.ones((t, t), bool))
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    peak = np.max(s, axis=-1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.abs(peak) < np.inf, peak, 0)), 0.0)
    p = e / np.sum(e, axis=-1, keepdims=True)
    if absolute:
        q, k, v = np.abs(q), np.abs(k), np.abs(v)
    pairs = mask[..., None]  # (query, key, feature)
    out = _masked_sum(pairs, p[..., None] * v[..., None, :, :], axis=-2)
    g = np.ones_like(out)
    dv = _masked_sum(pairs, p[..., None] * g[..., :, None, :], axis=-3)
    dp = _masked_sum(pairs, g[..., :, None, :] * v[..., None, :, :], axis=-1)
    row = _masked_sum(mask, p * dp, axis=-1)[..., None]
    row = np.where(row == -np.inf, 0.0, row)  # cuDNN takes a row sum of -inf as 0, as it does a fully masked row's
    ds = np.where(mask, p * (dp + row if absolute else dp - row), 0.0) * scale
    dq = _masked_sum(pairs, ds[..., None] * k[..., None, :, :], axis=-2)
    dk = _masked_sum(pairs, ds[..., None] * q[..., :, None, :], axis=-3)
    return [out, dq, dk, dv]


def test_attention_means_its_plain_expressions_where_a_row_holds_inf():
    """Found by the fuzzer on the GPU, which runs float32 attention as its plain expressions: the reference's
    attention shifted a row by its max even where that max is inf, so a row of scores [inf, inf, -inf, -inf] was NaN
    throughout, where softmax (and so the plain form) gives NaN at the infinities and 0 at the masked keys."""
    from cortado.exprgraph.constructors import attention, attention_grad
    from cortado.rules.attention_vjps import plain_attention, plain_attention_grad

    q, k, v = (np.zeros((2, 4, 16), np.float32) for _ in range(3))
    q[1, 1, 8], q[0, 0, :2], k[1, :2, 8] = np.inf, np.nan, 1
    Q, K, V = (ct.var(name, (2, 4, 16)) for name in "qkv")
    dout = ct.const(np.ones((2, 4, 16), np.float32))
    out = attention(Q, K, V, 0.25, True)
    fused = [out] + [attention_grad(Q, K, V, out, dout, 0.25, True, result=r) for r in range(3)]
    plain = [plain_attention(Q, K, V, 0.25, True), *plain_attention_grad(Q, K, V, dout, 0.25, True)]
    feed = {"q": q, "k": k, "v": v}
    with np.errstate(all="ignore"):
        for ours, spelled in zip(ct.evaluate(fused, feed), ct.evaluate(plain, feed)):
            np.testing.assert_array_equal(ours, spelled)


EMPTY = [
    ("sum", lambda x: ct.sum(x, axis=1)),
    ("mean", lambda x: ct.mean(x, axis=1)),
    ("softmax", lambda x: ct.softmax(x, axis=0)),
    ("matmul", lambda x: x @ ct.transpose(x)),
    ("slice", lambda x: ct.exp(x[:, ::2]) + 1),
    ("concatenate", lambda x: ct.concatenate([x, x * 2], axis=1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, build", EMPTY, ids=[name for name, _ in EMPTY])
def test_empty_axes(backend, name, build):
    skip_without_device(backend)
    x = ct.var("x", (3, 0))
    term = build(x)
    check(with_gradients([term], [x]), [x], {"x": np.zeros((3, 0), np.float32)}, backend)


VIEWS = [
    ("crop and flip", lambda x: x[1:, ::-1] * 2),
    ("strided window", lambda x: ct.exp(x[::2, 1::2])),
    ("transpose of a slice", lambda x: ct.transpose(x[:, 1:3]) @ x),
    ("reshape of a transpose", lambda x: ct.reshape(ct.transpose(x), (-1,)) + 1),
    ("split and concatenate", lambda x: ct.concatenate(ct.split(x, 2, axis=1)[::-1], axis=1) - x),
    ("broadcast", lambda x: ct.broadcast_to(ct.max(x, axis=0, keepdims=True), x.shape) - x),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, build", VIEWS, ids=[name for name, _ in VIEWS])
@settings(max_examples=max(EXAMPLES // 3, 1), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_views_at_edge_values(backend, name, build, data):
    skip_without_device(backend)
    x = ct.var("x", (4, 4))
    feed = {"x": _images(data.draw, (4, 4), np.float32)}
    check(with_gradients([build(x)], [x]), [x], feed, backend)


def test_the_comparison_catches_what_it_must():
    """The fuzzer's own check: a NaN turned into a number, an infinity into a finite value and a wrong value fail."""
    ref = np.array([np.nan, np.inf, 1.0, 2.0], np.float32)
    assert agrees(ref.copy(), ref, np.float32).all()
    for wrong in ([0.0, np.inf, 1.0, 2.0], [np.nan, 3.0, 1.0, 2.0], [np.nan, np.inf, 1.0, 2.5], [np.nan, -np.inf, 1, 2]):
        assert not agrees(np.array(wrong, np.float32), ref, np.float32).all()
