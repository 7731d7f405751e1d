"""``floor_divide`` (``//``) and ``remainder`` (``%``): NumPy's bits in every dtype from the reference interpreter
and the CPU backend, the hard cases included (division by 0, signed zeros, infinities, NaN, the smallest integer
over -1); the remainder's gradient against finite differences; text and placeholder patterns spelling them as
Python does; on a GPU, NumPy's bits too (the float forms are NumPy's npy_divmod step for step)."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends import gpu_visible
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.gradcheck import check_grads

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTEGERS = ["int8", "int32", "int64", "uint8", "uint32"]


def _operands(dtype, rng):
    """Every pair of the dtype's hard values, then random pairs over several magnitudes."""
    if dtype in INTEGERS:
        info = np.iinfo(dtype)
        hard = np.array(sorted({0, 1, 2, 3, 7, info.max, info.max - 1, info.min, info.min + 1, -1 % (info.max + 1),
                                max(info.min, -3)}), dtype)
        a, b = (x.ravel() for x in np.meshgrid(hard, hard))
        wide = rng.integers(info.min, info.max, (2, 500), endpoint=True).astype(dtype)
        return np.concatenate([a, wide[0]]), np.concatenate([b, wide[1]])
    hard = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, -7.0, 1e-3, 1e4, np.inf, -np.inf, np.nan])
    a, b = (x.ravel() for x in np.meshgrid(hard, hard))
    wide = rng.standard_normal((2, 500)) * 10.0 ** rng.integers(-3, 4, (2, 500))
    kind = BFLOAT16 if dtype == "bfloat16" else dtype
    return np.concatenate([a, wide[0]]).astype(kind), np.concatenate([b, wide[1]]).astype(kind)


def _same(got, expected):
    """The same values, NaNs in the same places and zeros of the same sign."""
    assert got.dtype == expected.dtype
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    both = ~np.isnan(expected)
    np.testing.assert_array_equal(got[both], expected[both])
    np.testing.assert_array_equal(np.signbit(got[both]), np.signbit(expected[both]))


@pytest.mark.parametrize("dtype", FLOATS + INTEGERS)
def test_floor_divide_and_remainder_are_numpys(dtype):
    a, b = _operands(dtype, np.random.default_rng(0))
    x, y = ct.var("x", a.shape, dtype), ct.var("y", b.shape, dtype)
    left = 5 if dtype[0] == "u" else -5  # (-5 is no unsigned value: NumPy refuses it, as cortado does)
    outputs = [x // y, x % y, ct.floor_divide(x, 3), ct.remainder(left, y)]
    with np.errstate(all="ignore"):
        expected = [np.floor_divide(a, b), np.remainder(a, b), np.floor_divide(a, np.array(3, a.dtype)),
                    np.remainder(np.array(left, b.dtype), b)]
    program = ct.compile(outputs, inputs=[x, y])
    for got, want in zip(program(x=a, y=b), expected):
        _same(got, want)
    for got, want in zip(ct.evaluate(outputs, {"x": a, "y": b}), expected):
        _same(got, want)


@pytest.mark.parametrize("order", [1, 2])
def test_the_remainders_gradient_agrees_with_finite_differences(order):
    x, y = ct.var("x", (5,), "float64"), ct.var("y", (5,), "float64")
    feeds = {"x": np.array([5.3, -5.3, 0.7, 9.1, -2.2]), "y": np.array([2.1, 2.1, -1.9, 3.3, -0.9])}
    check_grads(ct.sin(x % y) + x // y, [x, y], feeds, order=order, rtol=1e-6)


def test_python_spells_them_in_text_and_placeholder_patterns():
    x = ct.var("x", (3,))
    written = ct.rules.rewrite(x % 2.0, "_x % 2.0", "_x - (_x // 2.0) * 2.0")
    assert written.op.name == "subtract" and written.args[1].args[0].op.name == "floor_divide"
    a = ct.rules.placeholders("a")
    assert ct.rules.matchex(a // 2.0, x // 2.0) == {"a": x}


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS)
def test_on_the_gpu_floor_divide_and_remainder_are_numpys_bits(dtype):
    a, b = _operands(dtype, np.random.default_rng(1))
    x, y = ct.var("x", a.shape, dtype), ct.var("y", b.shape, dtype)
    outputs = [x // y, x % y, (x % y) * 2 + x // 3]
    gpu = [r.get() for r in ct.compile(outputs, inputs=[x, y], backend="cupy")(x=a, y=b)]
    cpu = ct.compile(outputs, inputs=[x, y], backend="numpy")(x=a, y=b)
    _same(gpu[0], cpu[0])
    _same(gpu[1], cpu[1])
    if dtype not in ("float16", "bfloat16"):
        _same(gpu[2], cpu[2])
    else:  # one fused kernel keeps the parts in float32 and rounds once, where NumPy rounds each part
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        with np.errstate(all="ignore"):
            _same(gpu[2], ((a32 % b32) * np.float32(2) + a32 // np.float32(3)).astype(cpu[2].dtype))
