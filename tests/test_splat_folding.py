"""Reductions of one-value constants fold in closed form: instantly at any size, to the reference's values."""

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.exprgraph.dtypes import finfo, is_float
from cortado.rules import simplify

REDUCTIONS = {
    "sum": ct.sum, "mean": ct.mean, "max": ct.max, "logsumexp": ct.logsumexp,
    "softmax": ct.softmax, "log_softmax": ct.log_softmax,
}
VALUES = [0.0, 1.0, -2.5, 0.1, 1e30, -1e30, np.inf, -np.inf, np.nan]


def _folded(term):
    folded = simplify(term)
    assert folded.op.name == "const", f"{term} did not fold: {folded}"
    return folded


def test_the_gradient_of_a_sum_over_a_trillion_copies_is_instant():
    s = ct.var("s", (), "float32")
    start = time.perf_counter()
    g = ct.grad(ct.sum(ct.broadcast_to(s, (10**6, 10**6))), s)
    assert time.perf_counter() - start < 5
    assert ct.evaluate(g, {}) == np.float32(1e12)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(REDUCTIONS)),
    dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64", "int8", "int64", "uint8", "bool"]),
    value=st.sampled_from(VALUES + [3, 100, -7]),
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
    data=st.data(),
)
def test_a_folded_reduction_of_one_value_equals_the_reference(name, dtype, value, shape, data):
    if dtype not in ("float16", "bfloat16", "float32", "float64") and not np.isfinite(value):
        return
    if dtype == "bool":
        value = bool(value)
    elif dtype in ("int8", "int64", "uint8"):
        value = int(value) % 100
    constant = ct.broadcast_to(ct.const(value, dtype), shape)
    axis = data.draw(st.sampled_from([None] + list(range(len(shape)))))
    try:
        term = REDUCTIONS[name](constant, axis=axis if axis is not None or name in ("sum", "mean", "max") else -1)
    except ct.errors.CortadoError:
        return  # the op refuses the dtype (softmax of bool, say): nothing to fold
    expected, folded = ct.evaluate(term, {}), ct.evaluate(_folded(term), {})
    assert folded.dtype == expected.dtype
    if not is_float(folded.dtype):
        np.testing.assert_array_equal(folded, expected)
        return
    # the closed form rounds the exact value once, where NumPy's sum of the copies rounds on the way; a logsumexp
    # adds the value to log(n), which may cancel (-2.5 + log(11)): its error scales with the terms, not the result
    eps = 4 * float(finfo(folded.dtype).eps)
    atol = eps * (abs(float(value)) + 1) if name == "logsumexp" and np.isfinite(value) else 0
    np.testing.assert_allclose(folded.astype(np.float64), expected.astype(np.float64), rtol=eps, atol=atol)


def test_integer_sums_wrap_as_numpy_and_float_sums_overflow_to_infinity():
    huge = ct.sum(ct.broadcast_to(ct.const(9, "int64"), (2**30, 2**30)))  # 9 * 2**60 wraps past 2**63
    assert ct.evaluate(_folded(huge), {}) == np.int64(9 * 2**60 - 2**64)
    too_many = ct.sum(ct.broadcast_to(ct.const(1, "int64"), (2**31, 2**31)))  # more bytes than NumPy can view
    assert ct.evaluate(simplify(too_many), {}) == 2**62
    many = ct.sum(ct.broadcast_to(ct.const(3, "float16"), (100_000,)))  # past float16's largest
    assert ct.evaluate(_folded(many), {}) == ct.evaluate(many, {}) == np.float16(np.inf)
