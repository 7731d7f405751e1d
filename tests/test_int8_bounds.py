"""The int8 target turns a dequantized (float) product or convolution into an int32 one only where no int32 sum can
overflow: ``K * max|a| * max|w| <= 2**31 - 1``, with ``K`` the terms a sum adds (a product's inner size, a
convolution's ``C_in / groups * R * S``). Each side of the bound, on the CPU through the GPU's lowering rules, with
every operand at its largest magnitude; and the same on the GPU, compiled."""

from collections import Counter

import numpy as np
import pytest

import cortado as ct
from cortado.backends import gpu_visible
from cortado.backends.cupy.lowering import lowering
from cortado.backends.cupy.lowering.int8 import exact_in_int32
from cortado.exprgraph.graph import post_order
from cortado.rules import simplify

INT32 = np.iinfo(np.int32)
# (activations, weights, the largest K whose sums fit in int32)
LIMITS = [("int8", "int8", 131071), ("uint8", "uint8", 33025), ("int8", "uint8", 65793), ("uint8", "int8", 65793)]
EXTREME = {"int8": -128, "uint8": 255}  # the value of largest magnitude
FLOAT32_SUMS = 1e-4  # a float32 sum of ~1e5 equal terms, against float64: a wrapped one is off by its sign or 2**32


def _lowered(y):
    trace = []
    (lowered,) = lowering.run([simplify(y)], trace)
    return lowered, Counter(r.rule for r in trace)


def _gemms(term):
    return sum(t.op.name == "int8_gemm" for t in post_order([term]))


def _extremes(shape, dtype):
    return np.full(shape, EXTREME[dtype], dtype)


@pytest.mark.parametrize("a_dtype, w_dtype, limit", LIMITS)
def test_the_limit_is_the_largest_k_whose_extreme_sums_fit_in_int32(a_dtype, w_dtype, limit):
    """Checked against the products of the dtypes' ends themselves, not the formula's magnitudes."""
    a, w = np.iinfo(a_dtype), np.iinfo(w_dtype)
    products = [int(x) * int(y) for x in (a.min, a.max) for y in (w.min, w.max)]
    assert all(INT32.min <= limit * p <= INT32.max for p in products)
    assert any(not INT32.min <= (limit + 1) * p <= INT32.max for p in products)
    assert exact_in_int32(limit, np.dtype(a_dtype), np.dtype(w_dtype))
    assert not exact_in_int32(limit + 1, np.dtype(a_dtype), np.dtype(w_dtype))


def _dequantized_product(a_dtype, w_dtype, k, m=2, n=3):
    """``(product, its inputs, feeds at the largest magnitudes)``."""
    a, w = ct.var("a", (m, k), a_dtype), ct.var("w", (k, n), w_dtype)
    feeds = {"a": _extremes((m, k), a_dtype), "w": _extremes((k, n), w_dtype)}
    return ct.dequantize(a, 0.01) @ ct.dequantize(w, 0.01), [a, w], feeds


@pytest.mark.parametrize("a_dtype, w_dtype, limit", LIMITS)
def test_a_dequantized_product_at_the_limit_is_an_exact_integer_product(a_dtype, w_dtype, limit):
    y, _, feeds = _dequantized_product(a_dtype, w_dtype, limit)
    lowered, fired = _lowered(y)
    assert fired["int8-dequantized-matmul"] == 1 and _gemms(lowered) == 1
    exact = ct.evaluate(y, feeds, precision="float64")
    np.testing.assert_allclose(ct.evaluate(lowered, feeds), exact, rtol=1e-6)


@pytest.mark.parametrize("a_dtype, w_dtype, limit", LIMITS)
def test_a_dequantized_product_one_past_the_limit_stays_float(a_dtype, w_dtype, limit):
    y, _, feeds = _dequantized_product(a_dtype, w_dtype, limit + 1)
    lowered, fired = _lowered(y)
    assert fired["int8-dequantized-matmul"] == 0 and _gemms(lowered) == 0
    exact = ct.evaluate(y, feeds, precision="float64")
    np.testing.assert_allclose(ct.evaluate(lowered, feeds), exact, rtol=FLOAT32_SUMS)


# (activations, weights, C_in, kernel, at the limit): C_in * kH * kW is the limit or one past it
CONVOLUTIONS = [
    ("int8", "int8", 131071, (1, 1), True), ("int8", "int8", 8192, (4, 4), False),
    ("uint8", "uint8", 1321, (5, 5), True), ("uint8", "uint8", 16513, (1, 2), False),
    ("int8", "uint8", 3133, (3, 7), True), ("uint8", "int8", 32897, (1, 2), False),
]


@pytest.mark.parametrize("x_dtype, w_dtype, channels, kernel, at_limit", CONVOLUTIONS)
def test_a_dequantized_convolution_is_an_integer_one_up_to_the_limit(x_dtype, w_dtype, channels, kernel, at_limit):
    limit = next(k for a, w, k in LIMITS if (a, w) == (x_dtype, w_dtype))
    assert channels * kernel[0] * kernel[1] == (limit if at_limit else limit + 1)
    x, w = ct.var("x", (1, channels) + kernel, x_dtype), ct.var("w", (2, channels) + kernel, w_dtype)
    y = ct.conv2d(ct.dequantize(x, 0.01), ct.dequantize(w, 0.01))
    lowered, fired = _lowered(y)
    assert fired["int8-dequantized-conv"] == _gemms(lowered) == int(at_limit)
    feeds = {"x": _extremes(x.shape, x_dtype), "w": _extremes(w.shape, w_dtype)}
    exact = ct.evaluate(y, feeds, precision="float64")
    np.testing.assert_allclose(ct.evaluate(lowered, feeds), exact, rtol=1e-6 if at_limit else FLOAT32_SUMS)


def test_a_written_int32_product_past_the_limit_wraps_as_numpy_wraps_it():
    """An int32 product the user writes is an ``int8_gemm`` at any K: both compute int32 sums, modulo 2**32."""
    k = 131072
    a, w = ct.var("a", (2, k), "int8"), ct.var("w", (k, 3), "int8")
    y = ct.matmul(ct.cast(a, "int32"), ct.cast(w, "int32"))
    lowered, _ = _lowered(y)
    assert _gemms(lowered) == 1
    feeds = {"a": _extremes((2, k), "int8"), "w": _extremes((k, 3), "int8")}
    written = ct.evaluate(y, feeds)
    assert (written == INT32.min).all()  # 2**31, wrapped
    np.testing.assert_array_equal(ct.evaluate(lowered, feeds), written)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("a_dtype, w_dtype, k, integer", [
    ("int8", "int8", 131072, False), ("int8", "int8", 131071, True),
    ("uint8", "uint8", 33026, False), ("uint8", "uint8", 33025, True),
])
def test_on_the_gpu_a_dequantized_product_equals_the_float64_one(a_dtype, w_dtype, k, integer):
    """The issue's product (16 x K by K x 16, every value -128): int8 on the tensor cores up to the limit, a float
    product past it; the float64 product's value either way, never wrapped."""
    y, inputs, feeds = _dequantized_product(a_dtype, w_dtype, k, m=16, n=16)
    program = ct.compile([y], inputs=inputs, backend="cupy")
    assert sum(kernel.term.op.name == "int8_gemm" for kernel in program.kernels) == int(integer)
    expected = ct.evaluate(y, feeds, precision="float64")
    np.testing.assert_allclose(program(**feeds)[0].get(), expected, rtol=1e-6 if integer else FLOAT32_SUMS)
