"""Constants are collected only where no value can change; ``fast_math=True`` opts into the rest.

By default a compiled program computes what its expressions say, up to the rounding of each
operation: a float sum is never regrouped (``(x + 1e8) - 1e8`` is 0 for small ``x``, as NumPy
says), and a float product only where the folded constant is exact and both constants scale the
same way, so neither grouping overflows or underflows where the other does not.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible, names

BACKENDS = [pytest.param(name, marks=pytest.mark.gpu) if name == "cupy" else name for name in names()]


def _host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def _compiled(expression, x, values, backend, **options):
    program = ct.compile([expression], inputs=[x], backend=backend, **options)
    return _host(program(x=values)[0])


def _skip_without_device(backend):
    if backend == "cupy" and not gpu_visible():
        pytest.skip("no NVIDIA GPU is visible")


CASES = {  # the written expression, and values at which regrouping would change it by more than rounding
    "cancelling sums": (lambda x: (x + 1e8) + (-1e8), [1.5, 3.25]),
    "hidden overflow": (lambda x: (x * 1e30) * 1e-30, [1e10, -3e9]),
    "hidden underflow": (lambda x: (x * 1e-30) * 1e30, [1e-20, 3e-25]),
    "powers of two, opposite ways": (lambda x: (x * 2.0 ** 100) * 2.0 ** -100, [1e10, -5e20]),
    "self difference": (lambda x: x - x, [np.inf, np.nan]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_compile_computes_what_the_expression_says(case, backend):
    _skip_without_device(backend)
    build, values = CASES[case]
    x = ct.var("x", (2,))
    xv = np.array(values, np.float32)
    expression = build(x)
    expected = ct.evaluate(expression, {"x": xv})
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_compiled(expression, x, xv, backend), expected)


def test_the_issue_values():
    x = ct.var("x", (2,))
    xv = np.array([1.5, 3.25], np.float32)
    np.testing.assert_array_equal(_compiled((x + 1e8) + (-1e8), x, xv, "numpy"), [0, 0])
    with np.errstate(over="ignore"):
        big = _compiled((x * 1e30) * 1e-30, x, np.array([1e10, 1], np.float32), "numpy")
    assert np.isinf(big[0])


@pytest.mark.parametrize("written, collected", [
    (lambda x: 3 * (2 * x), lambda x: 6 * x),              # both at least 1, the inner a power of two, 6 exact
    (lambda x: 0.3 * (0.25 * x), lambda x: 0.075 * x),     # both at most 1 (0.075 is 0.3 * 0.25 exactly in float32)
    (lambda x: 5 * (8 * x), lambda x: 40 * x),
])
def test_exact_products_of_one_direction_are_still_collected(written, collected):
    x = ct.var("x", (3,))
    assert ct.rules.simplify(written(x)) is collected(x)


@pytest.mark.parametrize("written", [
    lambda x: 1e30 * (1e-30 * x),       # opposite directions
    lambda x: 0.1 * (0.1 * x),          # 0.01 is not 0.1 * 0.1 in float32
    lambda x: 2.0 ** 100 * (2.0 ** -100 * x),
    lambda x: 3 + (4 + x),              # float sums never regroup
    lambda x: 2 * (3 * x),              # 3 * x of a subnormal x loses bits that 2 * would magnify
    lambda x: 1e5 * (1.5 * x),
])
def test_inexact_or_opposite_products_and_float_sums_stay(written):
    x = ct.var("x", (3,))
    assert ct.rules.simplify(written(x)) is written(x)


def test_integer_arithmetic_regroups_since_it_wraps():
    x = ct.var("x", (3,), "int8")
    assert ct.rules.simplify(100 + (100 + x)) is ct.const(np.int8(-56)) + x
    xv = np.array([1, -128, 127], np.int8)
    np.testing.assert_array_equal(_compiled(100 + (100 + x), x, xv, "numpy"), ct.evaluate(100 + (100 + x), {"x": xv}))
    assert ct.rules.simplify(x - x) is ct.rules.simplify(ct.const(np.zeros(3, np.int8)))


def test_text_is_regrouped_symbolically():
    assert ct.rules.simplify("2 * (3 * x) + 0") == "6 * x"
    assert ct.rules.simplify("(x + 1) + 2") == "3 + x"
    assert ct.rules.simplify("x - x") == "0"


def test_float64_products_are_checked_exactly():
    x = ct.var("x", (2,), "float64")
    assert ct.rules.simplify(3 * (4 * x)) is 12 * x
    assert ct.rules.simplify(0.1 * (0.1 * x)) is 0.1 * (0.1 * x)


def test_fast_math_opts_into_regrouping():
    x = ct.var("x", (2,))
    xv = np.array([1.5, 3.25], np.float32)
    np.testing.assert_array_equal(_compiled((x + 1e8) + (-1e8), x, xv, "numpy", fast_math=True), xv)
    np.testing.assert_array_equal(_compiled(x - x, x, np.array([np.inf, 1], np.float32), "numpy", fast_math=True), 0)
    program = ct.compile([(x + 1e8) + (-1e8)], inputs=[x], fast_math=True)
    assert "collect-sums-fast" in program.explain()
    np.testing.assert_array_equal(_compiled((x + 1e8) - 1e8, x, xv, "numpy", fast_math=True), xv)  # as written
    np.testing.assert_array_equal(_compiled((x + 1e8) - 1e8, x, xv, "numpy"), [0, 0])
    assert "difference-collected-fast" in ct.compile([(x + 1e8) - 1e8], inputs=[x], fast_math=True).explain()
    assert "simplify (fast_math): nothing fired" in ct.compile([ct.exp(x)], inputs=[x], fast_math=True).explain()


_FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
_CONSTANT = st.one_of(st.sampled_from([2.0, 0.5, 4.0, 0.25, 3.0, 1e30, 1e-30, 2.0 ** 60, 2.0 ** -60, 0.1, 1e8, -1e8]),
                      _FLOAT32.filter(lambda v: v != 0))


@settings(max_examples=80, deadline=None)
@given(a=_CONSTANT, b=_CONSTANT, values=st.lists(st.one_of(_FLOAT32, st.just(np.float32(3e38))), min_size=4, max_size=4),
       op=st.sampled_from(["+", "*"]))
def test_regrouped_constants_change_no_value(a, b, values, op):
    """Whatever ``simplify`` does to ``(x op a) op b``, the result is the written one's up to rounding: the
    same infinities and nans, and finite values within a few units in the last place."""
    x = ct.var("x", (4,))
    written = (x + a) + b if op == "+" else (x * a) * b
    xv = np.array(values, np.float32)
    with np.errstate(all="ignore"):
        expected = ct.evaluate(written, {"x": xv})
        ours = ct.evaluate(ct.rules.simplify(written), {"x": xv})
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(expected))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
    finite = np.isfinite(expected)
    tiny = np.finfo(np.float32).smallest_subnormal
    np.testing.assert_allclose(ours[finite], expected[finite], rtol=4 * 2.0 ** -24, atol=4 * tiny)


def test_subnormal_inputs_keep_their_value_through_collected_products():
    """Found by a review: with both constants at least 1 but the inner one no power of two, the written form rounds
    a subnormal ``1.5 * x`` and magnifies the error, where the folded form does not (2.8e-40 against 2.1e-40)."""
    x = ct.var("x", (3,))
    tiny = np.finfo(np.float32).smallest_subnormal
    xv = np.array([tiny, 3 * tiny, 1e-39], np.float32)
    for written in (1e5 * (1.5 * x), 3 * (2 * x), 0.5 * (0.25 * x), 0.3 * (0.25 * x)):
        np.testing.assert_allclose(_compiled(written, x, xv, "numpy"), ct.evaluate(written, {"x": xv}),
                                   rtol=0, atol=2 * tiny)


def test_a_constant_of_one_value_is_checked_as_that_value():
    """Found by a review: a full-shape constant of one value was expanded into float64 arrays to check it."""
    n = 100_000
    x = ct.var("x", (n,))
    written = ct.broadcast_to(ct.const(np.float32(3.0)), (n, n)) * (ct.const(np.float32(2.0)) * x)
    assert ct.rules.simplify(written).op.name == "multiply"
