"""The int8 target's rules, on the CPU: which quantized patterns become ``int8_gemm`` (and which must not), and that
the lowered terms compute what the plain expressions do (bit for bit for integer products and their epilogues,
within float32 rounding where a dequantized float product becomes an exact integer one)."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends.cupy.lowering import lowering
from cortado.backends.cupy.lowering.int8 import int8_gemm
from cortado.exprgraph.graph import post_order
from cortado.rules import simplify


def _lowered(*outputs):
    trace = []
    return lowering.run([simplify(o) for o in outputs], trace), Counter(r.rule for r in trace)


def _ops(terms):
    return Counter(t.op.name for t in post_order(terms))


def _ints(rng, shape, dtype="int8"):
    low, high = (-128, 128) if dtype == "int8" else (0, 256)
    return rng.integers(low, high, shape).astype(dtype)


def _layer(x, w, scale, bias, out_scale):
    """A quantized linear layer as plain expressions: int8 sums, rescaled, a bias and a relu, requantized."""
    sums = ct.matmul(ct.cast(x, "int32"), ct.cast(w, "int32"))
    return ct.quantize(ct.relu(ct.cast(sums, "float32") * scale + bias), out_scale)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(2, 40), st.integers(1, 40), st.sampled_from(["int8", "uint8"]),
       st.integers(0, 2 ** 31))
def test_a_quantized_layer_becomes_one_int8_gemm_computing_the_same_bits(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    x, bias = ct.var("x", (m, k), dtype), ct.var("bias", (n,), "float32")
    scale = (rng.random(n) * 1e-2 + 1e-4).astype(np.float32)
    out = _layer(x, ct.const(_ints(rng, (k, n))), scale, bias, 0.05)
    (lowered,), fired = _lowered(out)
    assert lowered.op.name == "int8_gemm" and fired["int8-gemm"] == 1
    feeds = {"x": _ints(rng, (m, k), dtype), "bias": rng.standard_normal(n).astype(np.float32)}
    np.testing.assert_array_equal(ct.evaluate(lowered, feeds), ct.evaluate(out, feeds))


def test_two_layers_stay_two_int8_gemms_with_the_int8_value_between_them():
    """The cast that widens the first layer's int8 result is not folded into its epilogue: it is what makes the
    second product an int8 one, and the int8 value is a quarter of the bytes."""
    rng = np.random.default_rng(0)
    x = ct.var("x", (8, 16), "int8")
    hidden = _layer(x, ct.const(_ints(rng, (16, 12))), np.float32(0.01), ct.const(np.zeros(12, np.float32)), 0.1)
    out = _layer(hidden, ct.const(_ints(rng, (12, 4))), np.float32(0.02), ct.const(np.ones(4, np.float32)), 0.1)
    lowered, _ = _lowered(out)
    kinds = _ops(lowered)
    assert kinds["int8_gemm"] == 2 and kinds["sum"] == 0
    inner = lowered[0].args[0]
    assert inner.op.name == "int8_gemm" and inner.dtype == np.int8
    feeds = {"x": _ints(rng, (8, 16))}
    np.testing.assert_array_equal(ct.evaluate(lowered[0], feeds), ct.evaluate(out, feeds))


@pytest.mark.parametrize("weight_scale_shape", [(), (24,)])
def test_dequantized_products_become_exact_integer_products_times_the_scales(weight_scale_shape):
    rng = np.random.default_rng(1)
    x = ct.var("x", (10, 32), "float32")
    scale_w = (rng.random(weight_scale_shape) * 0.01 + 1e-3).astype(np.float32)
    y = ct.dequantize(ct.quantize(x, 0.05), 0.05) @ ct.dequantize(ct.const(_ints(rng, (32, 24))), scale_w,
                                                                  axis=1 if weight_scale_shape else None)
    (lowered,), fired = _lowered(y)
    assert fired["int8-dequantized-matmul"] == 1 and lowered.op.name == "int8_gemm"
    feeds = {"x": rng.standard_normal((10, 32)).astype(np.float32)}
    exact = ct.evaluate(y, feeds, precision="float64")
    np.testing.assert_allclose(ct.evaluate(lowered, feeds), exact, rtol=1e-6, atol=1e-6 * np.abs(exact).max())


def _dequantized_product(x_zero_point=0, x_axis=None, w_axis=1):
    rng = np.random.default_rng(2)
    x = ct.var("x", (6, 8), "float32")
    scales_x = 0.05 if x_axis is None else (rng.random(8 if x_axis == 1 else 6) * 0.1 + 0.01).astype(np.float32)
    qx = ct.quantize(x, scales_x, zero_point=x_zero_point, axis=x_axis)
    scales_w = (rng.random(8 if w_axis == 0 else 5) * 0.01 + 1e-3).astype(np.float32)
    return ct.dequantize(qx, scales_x, zero_point=x_zero_point, axis=x_axis) @ \
        ct.dequantize(ct.const(_ints(rng, (8, 5))), scales_w, axis=w_axis)


@pytest.mark.parametrize("case, kwargs", [
    ("asymmetric activations", dict(x_zero_point=3)),
    ("activation scales along the contracted axis", dict(x_axis=1)),
    ("weight scales along the contracted axis", dict(w_axis=0)),
])
def test_products_whose_scales_cannot_leave_the_sum_stay_float(case, kwargs):
    lowered, fired = _lowered(_dequantized_product(**kwargs))
    assert fired["int8-dequantized-matmul"] == 0 and _ops(lowered)["int8_gemm"] == 0, case


def test_per_row_activation_scales_leave_the_sum():
    lowered, fired = _lowered(_dequantized_product(x_axis=0))
    assert fired["int8-dequantized-matmul"] == 1 and _ops(lowered)["int8_gemm"] == 1


def test_wider_integers_and_shared_products_are_left_alone():
    rng = np.random.default_rng(3)
    x16 = ct.var("x", (4, 8), "int16")
    lowered, _ = _lowered(ct.matmul(ct.cast(x16, "int32"), ct.cast(ct.const(_ints(rng, (8, 3))), "int32")))
    assert _ops(lowered)["int8_gemm"] == 0
    x = ct.var("x8", (4, 8), "int8")
    sums = ct.matmul(ct.cast(x, "int32"), ct.cast(ct.const(_ints(rng, (8, 3))), "int32"))
    lowered, _ = _lowered(ct.relu(sums), sums * 2)  # the sums have two users: neither folds into the gemm
    assert [t.op.name for t in post_order(lowered)].count("int8_gemm") == 1
    assert all(t.op.name != "int8_gemm" or t.attr("epilogue").op.name == "param" for t in post_order(lowered))


@pytest.mark.parametrize("w_shape, options", [((6, 4, 1, 1), {}), ((6, 4, 3, 3), dict(padding=1)),
                                              ((5, 4, 3, 3), dict(stride=2))])
def test_quantized_convolutions_become_int8_gemms_over_windows(w_shape, options):
    rng = np.random.default_rng(4)
    x = ct.var("x", (2, 4, 7, 7), "int8")
    sums = ct.conv2d(ct.cast(x, "int32"), ct.cast(ct.const(_ints(rng, w_shape)), "int32"), **options)
    out = ct.quantize(ct.cast(sums, "float32") * np.float32(0.01), 0.5)
    lowered, fired = _lowered(out)
    assert fired["int8-conv"] == 1 and _ops(lowered)["int8_gemm"] == 1
    windows = next(t for t in post_order(lowered) if t.op.name == "windows")
    assert windows.dtype == np.int8  # the rows are copied as int8, not int32
    feeds = {"x": _ints(rng, (2, 4, 7, 7))}
    np.testing.assert_array_equal(ct.evaluate(lowered[0], feeds), ct.evaluate(out, feeds))


def test_dequantized_convolutions_with_per_channel_weight_scales():
    rng = np.random.default_rng(5)
    x = ct.var("x", (2, 4, 6, 6), "float32")
    scales = (rng.random(6) * 0.01 + 1e-3).astype(np.float32)
    w = ct.dequantize(ct.const(_ints(rng, (6, 4, 3, 3))), scales, axis=0)
    y = ct.conv2d(ct.dequantize(ct.quantize(x, 0.1), 0.1), w, padding=1)
    lowered, fired = _lowered(y)
    assert fired["int8-dequantized-conv"] == 1 and _ops(lowered)["int8_gemm"] == 1
    feeds = {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    exact = ct.evaluate(y, feeds, precision="float64")
    np.testing.assert_allclose(ct.evaluate(lowered[0], feeds), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_int8_gemm_checks_its_operands():
    a, b = ct.var("a", (3, 4), "int8"), ct.var("b", (4, 5), "int8")
    with pytest.raises(ct.DTypeError, match="int8 or uint8"):
        int8_gemm(ct.var("f", (3, 4), "float32"), b)
    with pytest.raises(ct.ShapeError, match="m x k"):
        int8_gemm(a, ct.var("c", (3, 5), "int8"))
    with pytest.raises(ct.ShapeError, match="broadcast"):
        int8_gemm(a, b, extras=(ct.var("e", (4,), "float32"),))
    assert int8_gemm(a, b).dtype == np.int32 and int8_gemm(a, b).shape == (3, 5)


def test_widening_casts_of_array_constants_are_not_folded():
    q = ct.const(np.arange(6, dtype=np.int8).reshape(2, 3))
    assert simplify(ct.cast(q, "float32")).op.name == "cast"
    assert simplify(ct.cast(ct.const(np.arange(6, dtype=np.float32)), "float16")).op.name == "const"
