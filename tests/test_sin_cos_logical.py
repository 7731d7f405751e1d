"""``sin``, ``cos`` and the logical ops: NumPy's values from the reference interpreter and the CPU backend in every
dtype (NaNs and infinities too), gradients against finite differences, the operators ``& | ^ ~`` on bool terms
and their refusal on numbers; on a GPU, CUDA's ``sin`` and ``cos`` within a few ulps of NumPy's and the logical
ops NumPy's bits."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends import gpu_visible
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.gradcheck import check_grads

FLOATS = ["float16", "bfloat16", "float32", "float64"]


def _angles(dtype):
    values = np.concatenate([np.linspace(-20, 20, 61), [0.0, -0.0, 1e-30, 3e4, -1e5, np.inf, -np.inf, np.nan]])
    with np.errstate(over="ignore"):  # -1e5 is -inf in float16
        return values.astype(BFLOAT16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("name", ["sin", "cos"])
@pytest.mark.parametrize("dtype", [*FLOATS, "int32"])
def test_sin_and_cos_are_numpys_on_the_cpu(name, dtype):
    values = _angles(dtype) if dtype != "int32" else np.arange(-50, 50, dtype=np.int32)
    x = ct.var("x", values.shape, dtype)
    out = getattr(ct, name)(x)
    with np.errstate(invalid="ignore"):
        expected = getattr(np, name)(values)
        for got in (ct.evaluate(out, {"x": values}), ct.compile([out], inputs=[x])(x=values)[0]):
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))  # (bfloat16's NaNs)


@pytest.mark.parametrize("order", [1, 2])
def test_gradients_agree_with_finite_differences(order):
    x = ct.var("x", (7,), "float64")
    feeds = {"x": np.linspace(-3, 3, 7)}
    check_grads(ct.sin(x) * ct.cos(2 * x) + ct.cos(x) ** 2, x, feeds, order=order, rtol=1e-6)


def _truth_table():
    a = np.array([0.0, 0.0, 1.0, -2.0, np.nan, -0.0, np.inf], np.float32)
    b = np.array([0.0, 3.0, 0.0, 5.0, 0.0, np.nan, -0.0], np.float32)
    return a, b


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical_ops_of_numbers_are_numpys(name):
    a, b = _truth_table()
    x, y = ct.var("x", a.shape), ct.var("y", b.shape)
    out = getattr(ct, name)(x, y)
    expected = getattr(np, name)(a, b)
    for got in (ct.evaluate(out, {"x": a, "y": b}), ct.compile([out], inputs=[x, y])(x=a, y=b)[0]):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ct.evaluate(ct.logical_not(x), {"x": a}), np.logical_not(a))


def test_bool_operators_are_the_logical_ops_and_refuse_numbers():
    p, q = ct.var("p", (4,), "bool"), ct.var("q", (4,), "bool")
    pv, qv = np.array([0, 0, 1, 1], bool), np.array([0, 1, 0, 1], bool)
    outputs = [p & q, p | q, p ^ q, ~p, p & np.True_, np.False_ | q]
    expected = [pv & qv, pv | qv, pv ^ qv, ~pv, pv & True, False | qv]
    for got, want in zip(ct.compile(outputs, inputs=[p, q])(p=pv, q=qv), expected):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ct.DTypeError, match="an operand is False, which == or != between two terms gives"):
        _ = p & (q == p)  # identity of two terms, not their elements
    x = ct.var("x", (4,), "int32")
    with pytest.raises(ct.DTypeError, match=r"'&' takes bool terms .* call ct.logical_and"):
        x & p
    with pytest.raises(ct.DTypeError, match=r"'~' takes bool terms .* call ct.logical_not"):
        _ = ~x
    w = ct.var("w", (4,))
    (gradient,) = ct.grad(ct.sum(ct.where(ct.logical_and(x > 0, p), 2.0 * w, 0.0)), [w])  # none through the mask
    got = ct.evaluate(gradient, {"x": np.array([1, -1, 2, 0], np.int32), "p": pv})
    np.testing.assert_array_equal(got, [0.0, 0.0, 2.0, 0.0])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("dtype", FLOATS)
def test_on_the_gpu_sin_and_cos_are_within_a_few_ulps_of_numpys(dtype):
    """CUDA's sinf and cosf are within 2 ulps of the exact values, NumPy's float32 loops within about 1.5: the two
    within 4 ulps of each other, their product within 8; float16 and bfloat16 through float32, rounded once."""
    values = _angles(dtype)
    x = ct.var("x", values.shape, dtype)
    outputs = [ct.sin(x), ct.cos(x), ct.sin(x) * ct.cos(x)]
    gpu = [r.get() for r in ct.compile(outputs, inputs=[x], backend="cupy")(x=values)]
    cpu = ct.compile(outputs, inputs=[x], backend="numpy")(x=values)
    for ours, theirs, most in zip(gpu, cpu, (4, 4, 8)):
        ours, theirs = ours.astype(np.float64), theirs.astype(np.float64)
        assert np.array_equal(np.isnan(ours), np.isnan(theirs))
        finite = ~np.isnan(theirs)
        ulp = np.abs(np.spacing(theirs[finite].astype(values.dtype))).astype(np.float64)
        ulps = np.abs(ours - theirs)[finite] / np.maximum(ulp, np.finfo(np.float64).tiny)
        print(f"{dtype}: at most {ulps.max():.1f} ulps apart")
        assert ulps.max() <= most, (values[finite][ulps > most], ours[finite][ulps > most], theirs[finite][ulps > most])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_on_the_gpu_logical_ops_are_numpys():
    a, b = _truth_table()
    x, y, p = ct.var("x", a.shape), ct.var("y", b.shape), ct.var("p", a.shape, "bool")
    pv = np.array([1, 0, 1, 0, 1, 0, 1], bool)
    outputs = [ct.logical_and(x, y), ct.logical_or(x, y), ct.logical_xor(x, y), ct.logical_not(x), (x > 0) & p, ~p,
               ct.where(ct.logical_or(x > 1, p), x, y)]
    gpu = ct.compile(outputs, inputs=[x, y, p], backend="cupy")(x=a, y=b, p=pv)
    cpu = ct.compile(outputs, inputs=[x, y, p], backend="numpy")(x=a, y=b, p=pv)
    for ours, theirs in zip(gpu, cpu):
        np.testing.assert_array_equal(ours.get(), theirs)
