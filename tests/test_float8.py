"""float8 (e4m3fn, e5m2): saturating casts, exact products, straight-through gradients, and the GPU's scaled
cuBLASLt float8 GEMM that the lowering finds in a plain expression; values against ml_dtypes and the reference."""

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cortado as ct
from cortado import compiler, nn, optim
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy.lowering import lowering
from cortado.backends.cupy.lowering.float8_op import FLOAT8_GEMM, float8_gemm
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.term import RuleViolation
from cortado.exprgraph.scaling import EXPONENTS, exponents, scale_for
from cortado.rules.engine import Trace
from reference_checks import host, skip_without_device

E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")


def _saturated(values, dtype):
    """What a saturating cast gives, from ml_dtypes' rounding: beyond the largest value (infinities too), the largest."""
    largest = float(ml_dtypes.finfo(dtype).max)
    return np.clip(values, -largest, largest).astype(dtype)


EDGES = np.array([0.0, -0.0, 1.0, 448.0, 464.0, 480.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 57344.0, 61440.0,
                  2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17, 1.0625, 1.1875], np.float32)


@pytest.mark.parametrize("name", FLOAT8)
@pytest.mark.parametrize("backend", ["reference", "numpy"])
def test_a_cast_to_float8_rounds_to_nearest_even_and_saturates(name, backend):
    x = ct.var("x", EDGES.shape)
    y = ct.cast(ct.cast(x, name), "float32")
    got = ct.evaluate(y, {"x": EDGES}) if backend == "reference" else ct.compile([y], inputs=[x])(x=EDGES)[0]
    expected = _saturated(EDGES, np.dtype(name)).astype(np.float32)
    np.testing.assert_array_equal(got, expected)
    largest = float(ml_dtypes.finfo(np.dtype(name)).max)
    assert got[8] == largest and got[9] == -largest and np.isnan(got[10])  # no inf, no NaN from a number


@given(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=40), st.sampled_from(FLOAT8),
       st.sampled_from(["float32", "bfloat16", "float16", "float64"]))
def test_any_value_casts_to_float8_as_ml_dtypes_rounds_it_clipped(values, name, source):
    with np.errstate(over="ignore"):
        array = np.array(values, np.float32).astype(source)
    x = ct.var("x", array.shape, source)
    y = ct.cast(ct.cast(x, name), "float32")
    expected = _saturated(array, np.dtype(name)).astype(np.float32)
    np.testing.assert_array_equal(ct.compile([y], inputs=[x])(x=array)[0], expected)
    np.testing.assert_array_equal(ct.evaluate(y, {"x": array}), expected)


def test_float8_tensors_take_no_arithmetic():
    q = ct.cast(ct.var("x", (4, 16)), "float8_e4m3fn")
    for make in (lambda: q + q, lambda: ct.exp(q), lambda: ct.sum(q), lambda: q * 2.0):
        with pytest.raises(ct.DTypeError, match="float8 tensors are cast, moved and multiplied"):
            make()
    assert ct.transpose(q).dtype == E4M3 and ct.reshape(q, (64,)).dtype == E4M3


def test_float8_tensors_are_sliced_and_gathered_as_stored_and_not_concatenated():
    x = ct.var("x", (8, 16))
    q = ct.cast(x * 4.0, "float8_e4m3fn")
    parts = [q[1:], q[:, ::2], q[3], ct.take(q, ct.const(np.array([0, 5])), axis=0), ct.flip(q, 0)]
    assert all(p.dtype == E4M3 for p in parts)
    values = np.random.default_rng(7).standard_normal((8, 16)).astype(np.float32)
    q8 = _saturated(values * 4, E4M3)
    expected = [q8[1:], q8[:, ::2], q8[3], q8[[0, 5]], q8[::-1]]
    got = ct.compile([ct.cast(p, "float32") for p in parts], inputs=[x])(x=values)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e.astype(np.float32))
    with pytest.raises(ct.DTypeError, match="cast them to bfloat16, concatenate, and cast back"):
        ct.concatenate([q, q])


def test_float8_products_are_float32_or_the_other_operands_dtype():
    a8, b5 = ct.var("a", (4, 16), "float8_e4m3fn"), ct.var("b", (16, 8), "float8_e5m2")
    assert (a8 @ b5).dtype == np.float32
    assert (a8 @ ct.var("w", (16, 8), "bfloat16")).dtype.name == "bfloat16"
    assert ct.einsum("ik,kj->ij", a8, b5).dtype == np.float32
    with pytest.raises(ct.DTypeError, match="floats only"):
        a8 @ ct.var("n", (16, 8), "int32")


@pytest.mark.parametrize("subscripts", ["ik,kj->ij", "bik,kj->bij", "bik,jkl->ij"])
def test_a_float8_product_sums_exact_products_in_float32(subscripts):
    rng = np.random.default_rng(0)
    inputs, _ = subscripts.split("->")
    shapes = {"i": 3, "j": 5, "k": 16, "b": 2, "l": 4}
    arrays = [(rng.standard_normal([shapes[c] for c in labels]) * 20).astype(dtype)
              for labels, dtype in zip(inputs.split(","), (E4M3, E5M2))]
    terms = [ct.var(f"v{k}", a.shape, a.dtype) for k, a in enumerate(arrays)]
    y = ct.einsum(subscripts, *terms)
    feeds = {t.name: a for t, a in zip(terms, arrays)}
    expected = np.einsum(subscripts, *(a.astype(np.float64) for a in arrays))  # exact: few, exact products
    np.testing.assert_allclose(ct.compile([y], inputs=terms)(**feeds)[0], expected, rtol=1e-6)
    np.testing.assert_allclose(ct.evaluate(y, feeds), expected, rtol=1e-6)


def test_a_gradient_passes_a_cast_to_float8_in_float32():
    """Straight through: the cotangent of a float8 value is float32, never rounded to float8 on its way."""
    x, w = ct.var("x", (4, 16)), ct.var("w", (8, 16))
    y = ct.matmul(ct.cast(x * 64.0, "float8_e4m3fn"), ct.transpose(ct.cast(w, "float8_e4m3fn"))) * (1 / 64.0)
    loss = ct.sum(y * 1e-3)  # a cotangent far below float8's smallest e4m3 value
    dx, dw = ct.grad(loss, [x, w])
    assert dx.dtype == np.float32 and dw.dtype == np.float32
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((4, 16)).astype(np.float32), "w": rng.standard_normal((8, 16)).astype(np.float32)}
    w8 = feeds["w"].astype(E4M3).astype(np.float32)
    np.testing.assert_allclose(ct.compile([dx], inputs=[x, w])(**feeds)[0], np.tile(w8.sum(0) * 1e-3, (4, 1)), rtol=1e-5)
    with pytest.raises(ct.DTypeError, match="the variable it is cast from"):
        ct.grad(ct.sum(ct.cast(ct.var("q", (3,), "float8_e5m2"), "float32")), ct.var("q", (3,), "float8_e5m2"))


def _linear(rows=32, k=64, n=48, activation=True):
    """A float8 linear layer as a user writes it: per-tensor scales, the product scaled back, a bias, gelu."""
    x, w, bias = ct.var("x", (2, rows, k), "bfloat16"), ct.var("w", (n, k)), ct.var("bias", (n,), "bfloat16")
    sx, sw = ct.var("sx", ()), ct.var("sw", ())
    x8 = ct.cast(ct.cast(x, "float32") * sx, "float8_e4m3fn")
    w8 = ct.cast(w * sw, "float8_e4m3fn")
    y = ct.cast(ct.matmul(x8, ct.transpose(w8)) * (1 / (sx * sw)), "bfloat16") + bias
    return (ct.gelu(y) if activation else y), [x, w, bias, sx, sw]


def _feeds(rows=32, k=64, n=48, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, rows, k)).astype(ml_dtypes.bfloat16),
            "w": (rng.standard_normal((n, k)) * 0.05).astype(np.float32),
            "bias": rng.standard_normal(n).astype(ml_dtypes.bfloat16), "sx": np.float32(64.0), "sw": np.float32(2048.0)}


def _gemms(roots):
    return [t for t in post_order(roots) if t.op is FLOAT8_GEMM]


def test_the_gpu_lowering_makes_a_scaled_float8_linear_layer_one_call():
    y, _ = _linear()
    trace = Trace()
    lowered = lowering.run([y], trace)
    (g,) = _gemms(lowered)
    assert (g.dtype.name, g.attr("epilogue"), g.attr("scaled")) == ("bfloat16", "bias_gelu", True)
    assert {"float8-gemm", "float8-gemm-scale", "float8-gemm-cast", "float8-gemm-add", "float8-gemm-gelu"} \
        <= {r.rule for r in trace}
    feeds = _feeds()
    # the call rounds once where the expression rounds three times (after the scale, the bias, gelu)
    np.testing.assert_allclose(np.asarray(ct.evaluate(lowered[0], feeds), np.float32),
                               np.asarray(ct.evaluate(y, feeds), np.float32), rtol=2e-2, atol=2e-2)


def _residual_feeds(shape, seed=1):
    return {**_feeds(), "r": np.random.default_rng(seed).standard_normal(shape).astype(ml_dtypes.bfloat16)}


@pytest.mark.parametrize("then_gelu", [False, True])
def test_a_residual_added_to_a_float8_product_is_the_calls_c(then_gelu):
    """``r + linear(x)`` in bfloat16: the residual is cuBLASLt's C, added to the float32 sums before the one
    rounding; a gelu of that sum stays a kernel of its own (the call's gelu comes before C)."""
    y, _ = _linear(activation=False)
    r = ct.var("r", y.shape, "bfloat16")
    out = ct.gelu(r + y) if then_gelu else r + y
    lowered = lowering.run([out])
    (g,) = _gemms(lowered)
    assert (g.dtype.name, g.attr("epilogue"), g.attr("added")) == ("bfloat16", "bias", True)
    assert any(t.op.name == "gelu" for t in post_order(lowered)) == then_gelu
    feeds = _residual_feeds(y.shape)
    np.testing.assert_allclose(np.asarray(ct.evaluate(lowered[0], feeds), np.float32),
                               np.asarray(ct.evaluate(out, feeds), np.float32), rtol=2e-2, atol=2e-2)


def test_a_broadcast_row_added_twice_is_the_bias_then_a_kernel_not_the_calls_c():
    y, _ = _linear(activation=False)
    row = ct.var("row", (y.shape[-1],), "bfloat16")
    (g,) = _gemms(lowering.run([y + row]))
    assert (g.attr("epilogue"), g.attr("added")) == ("bias", False)


def test_a_float8_product_adds_a_term_only_where_cublaslt_does():
    a, b = ct.var("a", (32, 64), "float8_e4m3fn"), ct.var("b", (48, 64), "float8_e4m3fn")
    c = ct.var("c", (32, 48), "bfloat16")
    assert float8_gemm(a, b, "bfloat16", "bias", bias=ct.var("bias", (48,), "bfloat16"), c=c).attr("added")
    with pytest.raises(RuleViolation, match="only to a product it writes in bfloat16, without gelu"):
        float8_gemm(a, b, "float32", c=ct.var("c32", (32, 48)))
    with pytest.raises(RuleViolation, match="without gelu"):
        float8_gemm(a, b, "bfloat16", "gelu", c=c)
    with pytest.raises(ct.ShapeError, match="the added term has shape"):
        float8_gemm(a, b, "bfloat16", c=ct.var("wide", (32, 64), "bfloat16"))
    with pytest.raises(ct.DTypeError, match="added term of a float8_gemm writing bfloat16"):
        float8_gemm(a, b, "bfloat16", c=ct.var("c16", (32, 48), "float16"))


@pytest.mark.parametrize("case", ["kept in float32", "e5m2 by e5m2", "k not a multiple of 16", "batch of products"])
def test_products_cublaslt_cannot_take_in_float8_are_taken_exactly_wider(case):
    if case == "kept in float32":
        a, b = ct.var("a", (32, 64), "float8_e4m3fn"), ct.var("b", (64, 32), "float8_e4m3fn")
    elif case == "e5m2 by e5m2":
        a, b = ct.var("a", (32, 64), "float8_e5m2"), ct.var("b", (64, 32), "float8_e5m2")
    elif case == "k not a multiple of 16":
        a, b = ct.var("a", (32, 24), "float8_e4m3fn"), ct.var("b", (24, 32), "float8_e4m3fn")
    else:
        a, b = ct.var("a", (3, 32, 64), "float8_e4m3fn"), ct.var("b", (3, 64, 32), "float8_e4m3fn")
    lowered = lowering.run([a @ b])
    assert not _gemms(lowered)
    assert all(m.args[0].dtype == np.float32 for m in post_order(lowered) if m.op.name == "gemm")


def test_a_product_scaled_by_a_row_is_not_the_calls_one_scale_and_is_widened():
    a, b = ct.var("a", (32, 64), "float8_e4m3fn"), ct.var("b", (48, 64), "float8_e4m3fn")
    row = ct.var("r", (48,))
    trace = Trace()
    lowered = lowering.run([ct.cast(ct.matmul(a, ct.transpose(b)) * row, "bfloat16")], trace)
    assert not _gemms(lowered) and "float8-widen" in {r.rule for r in trace}


# -- scales, gradients and layers ----------------------------------------------------------------


@pytest.mark.parametrize("name", FLOAT8)
def test_a_scale_is_the_largest_power_of_two_that_keeps_the_largest_value_in_range(name):
    largest = float(ml_dtypes.finfo(np.dtype(name)).max)
    amaxes = np.array([0.0, 1e-30, 3e-8, 0.013, 1.0, 2.0, 447.0, 448.0, 449.0, 1e5, 3e38, np.inf], np.float32)
    amax = ct.var("amax", ())
    scale = scale_for(amax, name)
    assert exponents(scale) == (min(EXPONENTS[0], 0), max(EXPONENTS[1], 0))
    program = ct.compile([scale], inputs=[amax])
    for value in amaxes:
        got = float(program(amax=value)[0])
        assert got == float(ct.evaluate(scale, {"amax": value}))
        if value == 0:
            assert got == 1.0
            continue
        mantissa, _ = np.frexp(got)
        assert mantissa == 0.5 and 2.0 ** EXPONENTS[0] <= got <= 2.0 ** EXPONENTS[1]
        if 2.0 ** EXPONENTS[0] < got < 2.0 ** EXPONENTS[1]:
            assert value * got <= largest < value * got * 4  # the largest power of two, or half of it
    assert exponents(ct.const(np.float32(0.75))) is None and exponents(ct.const(np.float32(0.25))) == (-2, -2)


def test_float8_gradient_is_the_identity_whose_cotangent_is_rounded_to_e5m2():
    x = ct.var("x", (64,))
    y = ct.float8_gradient(x * 1.0)
    (dx,) = ct.grad(ct.sum(y * ct.const(np.linspace(-3e-6, 5e-6, 64, dtype=np.float32))), [x])
    feeds = {"x": np.arange(64, dtype=np.float32)}
    np.testing.assert_array_equal(ct.compile([y], inputs=[x])(**feeds)[0], feeds["x"])
    got = ct.compile([dx], inputs=[x])(**feeds)[0]
    exact = np.linspace(-3e-6, 5e-6, 64, dtype=np.float32)
    scale = 2.0 ** np.floor(np.log2(57344 / 5e-6))
    np.testing.assert_array_equal(got, (exact * scale).astype(E5M2).astype(np.float32) / scale)
    with pytest.raises(ct.DTypeError, match="to a float8 dtype"):
        ct.float8_gradient(x, "bfloat16")


def test_a_delayed_float8_gradient_takes_its_scale_from_the_history_and_saturates_beyond_it():
    """Given an amax history, the cotangent is scaled by ``scale_for`` of the history's largest entry (100: 2^9), a
    value beyond that range saturating to e5m2's largest; the history's gradient is its next value, the
    cotangent's largest magnitude pushed in front."""
    x, history = ct.var("x", (64,)), ct.var("h", (4,))
    cotangent = np.linspace(-300, 50, 64, dtype=np.float32)
    y = ct.float8_gradient(x * 1.0, history=history)
    dx, dh = ct.grad(ct.sum(y * ct.const(cotangent)), [x, history])
    feeds = {"x": np.zeros(64, np.float32), "h": np.array([3, 100, 0, 7], np.float32)}
    got_dx, got_dh = ct.compile([dx, dh], inputs=[x, history])(**feeds)
    scale = np.float32(2.0 ** 9)  # the largest power of two keeping 100 within 57344
    expected = np.clip(cotangent * scale, -57344, 57344).astype(E5M2).astype(np.float32) / scale
    np.testing.assert_array_equal(got_dx, expected)
    assert got_dx.min() == -57344 / scale  # -300 saturated
    np.testing.assert_array_equal(got_dh, [300, 3, 100, 0])
    with pytest.raises(ct.ShapeError, match="amax history is a float32 vector"):
        ct.float8_gradient(x, history=ct.var("h2", (4, 1)))


def test_a_float8_layer_records_its_gradients_amax_from_the_loss():
    """A float8 layer's ``gradient_amax`` history takes the largest magnitude of its float8 product's cotangent each
    step, as the step's state (here ``2 (y - t) / n`` of a mean squared error over the product's scales, 2^9 each
    from histories of 0.5), and its gradient's scale the next step comes from it. With ``gradient_scaling="current"``
    (the default) it keeps no such history."""
    layer = nn.Linear(8, 4, bias=False, float8=True, history=3, gradient_scaling="delayed")
    x, t = ct.var("x", (16, 8)), ct.var("t", (16, 4))
    y = layer(x)
    loss = ct.mean((y - t) ** 2)
    updates = layer.state_updates(loss)
    assert set(updates) == set(layer.buffers().values())
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((16, 8)).astype(np.float32), "t": rng.standard_normal((16, 4)).astype(np.float32),
             **{v.name: a for v, a in layer.initial_values().items()},
             **{name: np.array([0.5, 0.25, 0], np.float32) for name in ("input_amax", "weight_amax", "gradient_amax")}}
    got_y, got_history = ct.evaluate([y, updates[layer.buffers()["gradient_amax"]]], feeds)
    cotangent = 2 * (np.asarray(got_y, np.float32) - feeds["t"]) / y.size / 2.0 ** 18
    np.testing.assert_allclose(got_history, [np.abs(cotangent).max(), 0.5, 0.25], rtol=1e-6)
    with pytest.raises(ct.CortadoError, match="give state_updates the scalar loss"):
        layer.state_updates([y])
    current = nn.Linear(8, 4, float8=True)
    current(x)
    assert set(current.buffers()) == {"input_amax", "weight_amax"}
    with pytest.raises(ct.CortadoError, match="'delayed' or 'current'"):
        nn.Linear(8, 4, float8=True, gradient_scaling="late")



@given(st.integers(0, 2 ** 32 - 1), st.sampled_from(FLOAT8), st.integers(-40, 40), st.integers(-40, 40))
def test_moving_power_of_two_scales_out_of_a_float8_product_changes_no_bit(seed, name, k1, k2):
    """The proof ``float8-scales-out`` rests on, checked: (q * 2^a) @ (w * 2^b) == (q @ w) * 2^(a + b)."""
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((8, 48)) * 50).astype(np.dtype(name))
    w = rng.standard_normal((48, 16)).astype(E4M3)
    qv, wv = ct.var("q", q.shape, name), ct.var("w", w.shape, "float8_e4m3fn")
    s1, s2 = ct.var("s1", ()), ct.var("s2", ())
    product = ct.matmul(ct.cast(qv, "float32") * s1, ct.cast(wv, "float32") * s2)
    trace = Trace()
    scale_expressions = [ct.power(2.0, ct.minimum(ct.maximum(ct.rint(s), -40.0), 40.0)) for s in (s1, s2)]
    product = ct.matmul(ct.cast(qv, "float32") * scale_expressions[0], ct.cast(wv, "float32") * scale_expressions[1])
    moved = lowering.local.run([product], trace)[0]
    assert "float8-scales-out" in {r.rule for r in trace}
    feeds = {"q": q, "w": w, "s1": np.float32(k1), "s2": np.float32(k2)}
    np.testing.assert_array_equal(ct.evaluate(moved, feeds), ct.evaluate(product, feeds))


@pytest.mark.parametrize("keepdims", [False, True])
def test_a_large_amax_is_taken_in_two_stages_on_the_gpu_to_the_same_value(keepdims):
    x = ct.var("x", (8, 256, 96), "bfloat16")
    amax = ct.max(ct.abs(ct.cast(x, "float32")), keepdims=keepdims)
    trace = Trace()
    (staged,) = lowering.run([amax], trace)
    assert "max-by-rows" in {r.rule for r in trace} and staged.shape == amax.shape
    values = np.random.default_rng(6).standard_normal(x.shape).astype(ml_dtypes.bfloat16)
    values[3, 17, 5] = np.nan if keepdims else 40.0
    np.testing.assert_array_equal(ct.evaluate(staged, {"x": values}), ct.evaluate(amax, {"x": values}))
    vector_trace = Trace()
    lowering.run([ct.max(ct.var("v", (1 << 17,)))], vector_trace)
    assert "max-by-rows" not in {r.rule for r in vector_trace}  # no rows to split it by: one stage


def test_a_matrix_stored_transposed_is_copied_by_tiles():
    """How a float8 GEMM's operand stored the other way is copied: a tile at a time through shared memory, the tiles
    smaller where a matrix has few of them (a weight), so that every multiprocessor gets a few."""
    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.sources import copy_source
    from cortado.backends.cupy.transposed_kernels import COPY_BLOCKS, TILE, TILE_ROWS

    copy = copy_source(Operand((3072, 8192), E4M3, (1, 3072)))
    assert "__shared__ ct_vec<__nv_fp8_e4m3, 4> tile" in copy.text  # blocks of 4 x 4 a thread: a tile of 4 TILE a side
    assert copy.blocks == (3072 // (4 * TILE), 8192 // (4 * TILE), 1) and copy.block == (TILE, TILE_ROWS, 1)
    weight = copy_source(Operand((3072, 768), E4M3, (1, 3072)))  # 144 tiles of 4 TILE: halved to 576
    assert weight.blocks == (3072 // (2 * TILE), 768 // (2 * TILE), 1) and weight.block == (TILE // 2, TILE_ROWS, 1)
    assert weight.blocks[0] * weight.blocks[1] >= COPY_BLOCKS > 3072 * 768 // (4 * TILE) ** 2
    assert "ct_vec<__nv_fp8_e4m3, 1>" in copy_source(Operand((766, 8192), E4M3, (1, 766))).text  # no whole words
    assert "__shared__" not in copy_source(Operand((768, 8192), E4M3, (8192, 1))).text  # already in order


def _float8_mlp(batch=4, time=32, sizes=(64, 256, 64)):
    model = nn.MLP(*sizes, activation=ct.gelu, float8=True).compute_in("bfloat16")
    x, y = ct.var("x", (batch, time, sizes[0]), "bfloat16"), ct.var("y", (batch, time, sizes[-1]))
    loss = ct.mean((ct.cast(model(x), "float32") - y) ** 2)
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    values = {**model.initial_values(seed=0), **{v: np.asarray(a) for v, a in state.items()}}
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16),
             "y": rng.standard_normal(y.shape).astype(np.float32)}
    return loss, [x, y], values, updates, feeds


def test_a_float8_layer_needs_a_history_of_one_step_or_more():
    with pytest.raises(ct.ShapeError, match="history, the steps whose amax it keeps, is a whole number of at least 1"):
        nn.Linear(16, 16, float8=True, history=0)
    layer = nn.Linear(16, 16, float8=True, history=1)
    layer(ct.var("x", (4, 16)))
    assert layer.buffers()["input_amax"].shape == (1,)


def test_a_float8_layer_trains_and_keeps_its_amax_histories():
    loss, inputs, values, updates, feeds = _float8_mlp()
    step = ct.compile([loss], inputs=inputs, state=values, updates=updates)
    losses = [float(step(**feeds)[0]) for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0]
    history = step.state["0.input_amax"]
    assert history[0] == np.abs(feeds["x"].astype(np.float32)).max() and history[5] > 0 and not history[6:].any()


def test_on_the_gpu_a_float8_training_step_is_float8_products_forward_and_back():
    loss, _, _, updates, _ = _float8_mlp()
    traces = {}
    roots = compiler._rewrite([loss, *updates.values()], gpu_backend, traces)
    products = [t for t in post_order(roots) if t.op is FLOAT8_GEMM]
    assert len(products) == 5  # two forward, the second layer's input gradient, two weight gradients
    assert all(t.dtype.name == "bfloat16" for t in products)
    assert {t.args[0].dtype.name for t in products} == {"float8_e4m3fn", "float8_e5m2"}
    assert not [t for t in post_order(roots) if t.op.name == "gemm"]


# -- on the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", FLOAT8)
def test_on_the_gpu_a_cast_to_float8_gives_the_cpus_bits(name):
    skip_without_device("cupy")
    rng = np.random.default_rng(2)
    values = np.concatenate([EDGES, (rng.standard_normal(4096) * 300).astype(np.float32),
                             rng.standard_normal(4096).astype(np.float32) * 2.0 ** -12])
    x, s = ct.var("x", values.shape), ct.var("s", ())
    y = ct.cast(ct.cast(x * s, name), "float32")
    feeds = {"x": values, "s": np.float32(1.5)}
    got = host(ct.compile([y], inputs=[x, s], backend="cupy")(**feeds)[0])
    np.testing.assert_array_equal(got, ct.compile([y], inputs=[x, s])(**feeds)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [True, False, "residual"])
def test_on_the_gpu_a_float8_linear_layer_is_one_cublaslt_call_equal_to_the_reference(activation):
    """With gelu, without, or with a residual added (cuBLASLt's C)."""
    skip_without_device("cupy")
    rows, k, n = 256, 128, 96
    y, inputs = _linear(rows, k, n, activation is True)
    feeds = _feeds(rows, k, n, seed=3)
    if activation == "residual":
        r = ct.var("r", y.shape, "bfloat16")
        y, inputs = r + y, inputs + [r]
        feeds = {**feeds, "r": np.random.default_rng(4).standard_normal(r.shape).astype(ml_dtypes.bfloat16)}
    step = ct.compile([y], inputs=inputs, backend="cupy")
    assert "float8-gemm-scale" in step.explain()
    assert any("float8 bias + c" in label for label in step._executor.labels) == (activation == "residual")
    got = np.asarray(host(step(**feeds)[0]), np.float32)
    expected = np.asarray(ct.compile([y], inputs=inputs)(**feeds)[0], np.float32)
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_on_the_gpu_float8_operands_stored_otherwise_are_copied_and_mixed_formats_multiply():
    """A gradient's e5m2 times a weight's e4m3, the weight stored (k, n): cuBLASLt reads it after a transposing copy.
    Kept in float32, or of two e5m2 matrices, a product is widened: exactly the float32 sums."""
    skip_without_device("cupy")
    rng = np.random.default_rng(4)
    a, b = ct.var("a", (128, 64), "float8_e5m2"), ct.var("b", (64, 80), "float8_e4m3fn")
    c, d = ct.var("c", (128, 64), "float8_e5m2"), ct.var("d", (64, 80), "float8_e5m2")
    e = ct.var("e", (128, 64), "float8_e4m3fn")
    outputs = [ct.cast(a @ b, "bfloat16"), e @ b, c @ d]
    feeds = {"a": rng.standard_normal((128, 64)).astype(E5M2), "b": rng.standard_normal((64, 80)).astype(E4M3),
             "c": rng.standard_normal((128, 64)).astype(E5M2), "d": rng.standard_normal((64, 80)).astype(E5M2),
             "e": rng.standard_normal((128, 64)).astype(E4M3)}
    step = ct.compile(outputs, inputs=[a, b, c, d, e], backend="cupy")
    assert "float8-gemm-cast" in step.explain() and "float8-widen" in step.explain()
    narrow, *wide = step(**feeds)
    exact = [feeds[x].astype(np.float64) @ feeds[w].astype(np.float64) for x, w in (("a", "b"), ("e", "b"), ("c", "d"))]
    np.testing.assert_allclose(np.asarray(host(narrow), np.float32), exact[0], rtol=8e-3, atol=1e-2)
    for got, expected in zip(wide, exact[1:]):
        np.testing.assert_allclose(host(got), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_on_the_gpu_scales_are_the_cpus_powers_of_two():
    skip_without_device("cupy")
    amax = ct.var("amax", (12,))
    scales = scale_for(ct.max(ct.reshape(amax, (12, 1)), axis=1), "float8_e5m2")
    values = np.array([0.0, 1e-30, 3e-8, 0.013, 1.0, 2.0, 447.0, 448.0, 449.0, 1e5, 3e38, np.inf], np.float32)
    got = host(ct.compile([scales], inputs=[amax], backend="cupy")(amax=values)[0])
    np.testing.assert_array_equal(got, ct.compile([scales], inputs=[amax])(amax=values)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("width", [256, 1024])
def test_on_the_gpu_a_float8_training_step_follows_the_cpus(width):
    """Forward and back in float8 on the tensor cores: the losses and amax histories of three steps against the CPU's
    (which takes every float8 product exactly in float32 and the plain expressions), as close as float8's rounding of
    the gradients allows. At width 1024 the first layer's product writes the gelu in float8 (``float8_gelu``)."""
    skip_without_device("cupy")
    loss, inputs, values, updates, feeds = _float8_mlp(sizes=(64, width, 64))
    steps = {backend: ct.compile([loss], inputs=inputs, state=values, updates=updates, backend=backend)
             for backend in ("numpy", "cupy")}
    explained = steps["cupy"].explain()
    assert "float8-scales-out" in explained and ("float8-gemm-gelu-cast" in explained) == (width == 1024)
    for _ in range(3):
        cpu, gpu = (float(host(steps[b](**feeds)[0])) for b in ("numpy", "cupy"))
        assert abs(gpu - cpu) <= 2e-2 * abs(cpu)
    for name in ("0.input_amax", "2.input_amax", "0.weight_amax", "2.weight_amax"):
        np.testing.assert_allclose(host(steps["cupy"].state[name]), steps["numpy"].state[name], rtol=2e-2)


def test_float8_state_is_saved_and_loaded_as_safetensors_f8(tmp_path):
    q, x = ct.var("q", (4, 16), "float8_e5m2"), ct.var("x", (4, 16))
    updates = {q: ct.cast(ct.cast(q, "float32") * 0.5 + x, "float8_e5m2")}
    programs = [ct.compile([ct.cast(q, "float32")], inputs=[x], state={q: np.full((4, 16), k, E5M2)}, updates=updates)
                for k in (1.0, 0.0)]
    programs[0](x=np.full((4, 16), 3.0, np.float32))
    ct.save(programs[0], tmp_path / "f8.safetensors")
    ct.load(programs[1], tmp_path / "f8.safetensors")
    assert programs[1].state["q"].dtype == E5M2 and (programs[1].state["q"].astype(np.float32) == 3.5).all()
    header = (tmp_path / "f8.safetensors").read_bytes()[8:200]
    assert b'"F8_E5M2"' in header


@pytest.mark.gpu
def test_on_the_gpu_float8_tensors_are_sliced_and_gathered_as_on_the_cpu():
    skip_without_device("cupy")
    x = ct.var("x", (64, 48))
    q = ct.cast(x * 4.0, "float8_e5m2")
    outputs = [ct.cast(p, "float32") for p in (q[1:], q[:, ::2], q[3], ct.take(q, ct.const(np.array([0, 5])), axis=0),
                                                 ct.transpose(q))]
    values = np.random.default_rng(8).standard_normal((64, 48)).astype(np.float32)
    for gpu, cpu in zip(ct.compile(outputs, inputs=[x], backend="cupy")(x=values), ct.compile(outputs, inputs=[x])(x=values)):
        np.testing.assert_array_equal(host(gpu), cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(768, 8192), (260, 132), (130, 258), (66, 70)])
def test_on_the_gpu_a_matrix_stored_transposed_is_copied_as_numpy_transposes_it(dtype, shape):
    """Every element in its place, whether the sides are whole tiles, whole words only, or neither."""
    skip_without_device("cupy")
    import cupy

    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.kernels import launcher
    from cortado.backends.cupy.sources import copy_source

    rows, cols = shape
    stored = np.arange(rows * cols, dtype=np.uint64).reshape(cols, rows)  # column by column: stored[col, row]
    itemsize = np.dtype(getattr(ml_dtypes, dtype, dtype)).itemsize
    stored = (stored % (1 << (8 * itemsize))).astype(f"uint{8 * itemsize}")
    source = copy_source(Operand(shape, np.dtype(getattr(ml_dtypes, dtype, dtype)), (1, rows)))
    given_in, out = cupy.asarray(stored), cupy.zeros((rows, cols), stored.dtype)
    launcher(source, (given_in.data.ptr, out.data.ptr))()
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(out.get(), stored.T)


@pytest.mark.gpu
@pytest.mark.parametrize("contestant", ["ours", "ours_bias_gelu", "ours_e5m2"])
def test_the_float8_benchmarks_calls_of_ours_run_on_the_gpu(contestant):
    """bench_float8_gpu.py's contestants of ours at a small shape: the benchmark calls the float8 product as a program
    does (its pointers follow the call's signature), and the plain product matches float32's."""
    skip_without_device("cupy")
    import cupy

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_float8_gpu

    result = getattr(bench_float8_gpu, contestant)(256, 128, 64, 1, bench_float8_gpu._operands(cupy, 256, 128, 64))
    assert result["ms"] > 0 and (result["max_rel_error"] is not None) == (contestant == "ours")
