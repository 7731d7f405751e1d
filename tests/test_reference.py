"""The reference interpreter against NumPy computing the same recipe directly."""

import itertools
import string

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy_oracle import NUMPY_FLOAT64, replay_numpy

import cortado as ct
from cortado.exprgraph.dtypes import SUPPORTED, is_float8
from cortado.exprgraph.ops import ELEMENTWISE, Op
from cortado.exprgraph.ops.base import no_attributes
from cortado.exprgraph.term import make
from cortado.testing import ALL_OPS, graphs_with_feeds


TOLERANCES = {"float16": (2e-2, 2e-2), "float32": (1e-4, 4e-3), "float64": (1e-10, 1e-8)}


def _tolerance(graph):
    """(rtol, atol) of the least precise floating dtype anywhere in the graph."""
    floats = [t.dtype for t in ct.schedule(graph.outputs) if t.dtype.kind == "f"]
    return TOLERANCES[min(floats, key=lambda d: d.itemsize).name] if floats else (0, 0)


def assert_matches(ours, theirs, tolerance):
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    rtol, atol = tolerance if ours.dtype.kind == "f" else (0, 0)
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, equal_nan=True)


@given(graphs_with_feeds())
def test_random_graphs_evaluate_as_numpy_computes_them(case):
    graph, feeds = case
    for ours, theirs, term in zip(ct.evaluate(graph.outputs, feeds), replay_numpy(graph, feeds), graph.outputs):
        assert ours.shape == term.shape and ours.dtype == term.dtype
        assert_matches(ours, theirs, _tolerance(graph))


@pytest.mark.parametrize("op", ALL_OPS)
@given(data=st.data())
def test_each_op_evaluates_as_numpy_computes_it(op, data):
    graph, feeds = data.draw(graphs_with_feeds(ops=[op], max_steps=3))
    for ours, theirs in zip(ct.evaluate(graph.outputs, feeds), replay_numpy(graph, feeds)):
        assert_matches(ours, theirs, _tolerance(graph))


@given(graphs_with_feeds(dtypes=("float16", "float32")))
def test_float64_precision_is_close_to_numpy_in_float64(case):
    graph, feeds = case
    wide = {name: value.astype(np.float64) for name, value in feeds.items()}
    expected = replay_numpy(graph, wide, NUMPY_FLOAT64)
    for ours, theirs in zip(ct.evaluate(graph.outputs, feeds, precision="float64"), expected):
        assert ours.dtype == (np.float64 if theirs.dtype.kind == "f" else theirs.dtype)
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-8)


# -- dtype promotion against NumPy 2 ---------------------------------------------------------

NUMERIC = [d for d in SUPPORTED if d.kind in "iuf"]
SCALARS = [2, -3, 2.5, True, 300]


@given(st.sampled_from(NUMERIC), st.sampled_from(NUMERIC + SCALARS),
       st.sampled_from(["add", "subtract", "multiply", "divide", "maximum", "less", "power"]))
def test_binary_dtypes_follow_numpy_2_promotion(left, right, op):
    x = ct.var("x", (2,), left)
    right_value = np.ones(2, right) if isinstance(right, np.dtype) else right
    operand = ct.var("y", (2,), right) if isinstance(right, np.dtype) else right
    if is_float8(left) or (isinstance(right, np.dtype) and is_float8(right)):  # for products only: no arithmetic
        with pytest.raises(ct.DTypeError, match="float8 tensors are cast, moved and multiplied"):
            getattr(ct, op)(x, operand)
        return
    with np.errstate(all="ignore"):
        try:
            expected = getattr(np, op)(np.ones(2, left), right_value)
        except (OverflowError, TypeError, ValueError):
            with pytest.raises(ct.DTypeError):
                getattr(ct, op)(x, operand)
            return
    assert getattr(ct, op)(x, operand).dtype == expected.dtype


@given(st.sampled_from([d for d in SUPPORTED if d != np.bool_]),
       st.sampled_from(["exp", "log1p", "sqrt", "tanh", "sign", "negative", "abs", "sigmoid",
                        "sum", "mean", "max", "logsumexp", "softmax", "relu"]))
def test_unary_and_reduction_dtypes_follow_numpy(dtype, op):
    x = ct.var("x", (3,), dtype)
    if is_float8(dtype):
        with pytest.raises(ct.DTypeError, match="float8 tensors are cast, moved and multiplied"):
            getattr(ct, op)(x)
        return
    oracle = {"sigmoid": np.exp, "logsumexp": np.exp, "softmax": np.exp, "relu": lambda a: np.maximum(a, 0)}
    expected = (oracle[op] if op in oracle else getattr(np, op))(np.ones(3, dtype)).dtype
    assert getattr(ct, op)(x).dtype == expected


# -- einsum against NumPy, errors included ---------------------------------------------------


@st.composite
def einsum_cases(draw):
    """Random subscripts (ellipses, repeats, implicit output, size-1 broadcasting) and shapes."""
    labels = "abcdE"
    operands = draw(st.integers(1, 3))
    sizes = {label: draw(st.integers(1, 3)) for label in labels}
    terms, shapes = [], []
    for _ in range(operands):
        term = draw(st.lists(st.sampled_from(labels), max_size=3))
        ellipsis = draw(st.booleans())
        shape = [sizes[label] if draw(st.integers(0, 5)) else 1 for label in term]
        if ellipsis:
            at = draw(st.integers(0, len(term)))
            extra = draw(st.lists(st.integers(1, 3), max_size=2))
            term = term[:at] + ["..."] + term[at:]
            shape = shape[:at] + extra + shape[at:]
        if draw(st.integers(0, 9)) == 0:  # sometimes a shape that does not fit
            shape.append(2)
        terms.append("".join(term))
        shapes.append(tuple(shape))
    subscripts = ",".join(terms)
    if draw(st.booleans()):
        pool = sorted(set("".join(terms).replace(".", ""))) + ["..."] * draw(st.booleans())
        subscripts += "->" + "".join(draw(st.permutations(pool))[: draw(st.integers(0, len(pool)))])
    if draw(st.integers(0, 14)) == 0:
        subscripts = subscripts.replace(draw(st.sampled_from(string.ascii_lowercase[:5])), "3")
    return subscripts, shapes


@given(einsum_cases())
def test_einsum_accepts_exactly_what_numpy_accepts(case):
    subscripts, shapes = case
    arrays = [np.random.default_rng(len(s)).standard_normal(s) for s in shapes]
    try:
        expected = np.einsum(subscripts, *arrays)
    except ValueError:
        with pytest.raises(ct.ShapeError):
            ct.einsum(subscripts, *[ct.var(f"e{i}", s, "float64") for i, s in enumerate(shapes)])
        return
    term = ct.einsum(subscripts, *[ct.var(f"e{i}", s, "float64") for i, s in enumerate(shapes)])
    got = ct.evaluate(term, {f"e{i}": a for i, a in enumerate(arrays)})
    assert term.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("left, right", list(itertools.product([(3,), (2, 3), (4, 2, 3), (1, 2, 3)],
                                                                [(3,), (3, 5), (4, 3, 5), (1, 3, 5)])))
def test_matmul_shapes_follow_numpy(left, right):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(left), rng.standard_normal(right)
    term = ct.matmul(ct.var("a", left, "float64"), ct.var("b", right, "float64"))
    np.testing.assert_allclose(ct.evaluate(term, {"a": a, "b": b}), a @ b)


# -- numerics the interpreter owes its users --------------------------------------------------


def test_stable_forms_do_not_overflow():
    x = ct.var("x", (2, 3))
    logits = np.array([[1000.0, 999.0, -1000.0], [-1e4, -1e4, -1e4]], dtype=np.float32)
    lse, sm, lsm, sig = ct.evaluate(
        [ct.logsumexp(x, axis=1), ct.softmax(x, axis=1), ct.log_softmax(x, axis=1), ct.sigmoid(x)], {"x": logits}
    )
    np.testing.assert_allclose(lse, [1000.0 + np.log1p(np.exp(-1.0)), -1e4 + np.log(3.0)], rtol=1e-6)
    np.testing.assert_allclose(sm.sum(axis=1), 1.0, rtol=1e-6)
    assert np.isfinite(lsm).all() and np.isclose(lsm[0, 1], -1.0 - np.log1p(np.exp(-1.0)))
    np.testing.assert_array_equal(sig, [[1, 1, 0], [0, 0, 0]])


def test_logsumexp_of_all_minus_infinity_is_minus_infinity():
    x = ct.var("x", (3,), "float64")
    assert ct.evaluate(ct.logsumexp(x), {"x": np.full(3, -np.inf)}) == -np.inf


def test_float64_precision_ignores_float_casts():
    x = ct.var("x", (), "float64")
    roundtrip = ct.cast(ct.cast(x, "float16"), "float64")
    assert ct.evaluate(roundtrip, {"x": 0.1}) != 0.1
    assert ct.evaluate(roundtrip, {"x": 0.1}, precision="float64") == 0.1


def test_evaluate_returns_fresh_arrays():
    x = ct.var("x", (2,))
    value = np.ones(2, np.float32)
    out = ct.evaluate(ct.reshape(x, (2,)), {"x": value})
    out[0] = 5.0
    assert value[0] == 1.0


@given(st.sampled_from(NUMERIC), st.sampled_from(NUMERIC))
def test_casts_follow_numpy(source, target):
    values = np.array([0, 1, 7], dtype=source)
    got = ct.evaluate(ct.cast(ct.var("x", (3,), source), target), {"x": values})
    np.testing.assert_array_equal(got, values.astype(target))
    assert got.dtype == target


# -- regressions found by review ---------------------------------------------------------------

INTEGER = [d for d in SUPPORTED if d.kind in "iu"]
COMPARE = ["less", "less_equal", "greater", "greater_equal", "equal", "not_equal"]


@st.composite
def edge_ints(draw):
    dtype = draw(st.sampled_from(INTEGER))
    info = np.iinfo(dtype)
    near = [int(info.min) - 1, int(info.min), int(info.max), int(info.max) + 1, 0, 2 ** 63, 2 ** 64 - 1, -2 ** 63 - 1]
    return dtype, draw(st.sampled_from(near) | st.integers(-2 ** 64, 2 ** 64))


@given(edge_ints(), st.sampled_from(COMPARE), st.booleans())
def test_integer_comparisons_with_any_python_int_are_exact(case, op, scalar_left):
    dtype, value = case
    info = np.iinfo(dtype)
    data = np.array([info.min, info.max, 0, 1], dtype=dtype)
    x = ct.var("x", (4,), dtype)
    args = (value, x) if scalar_left else (x, value)
    try:
        expected = getattr(np, op)(*((value, data) if scalar_left else (data, value)))
    except OverflowError:  # NumPy refuses ints beyond uint64 too
        with pytest.raises(ct.DTypeError):
            getattr(ct, op)(*args)
        return
    np.testing.assert_array_equal(ct.evaluate(getattr(ct, op)(*args), {"x": data}), expected)


def test_python_ints_beyond_int64_are_weak_too():
    f = ct.var("f", (2,))
    assert (f * 2 ** 64).dtype == np.float32
    assert ct.evaluate(f * 2 ** 64, {"f": [1.0, 2.0]}).tolist() == [2.0 ** 64, 2.0 ** 65]


@given(st.sampled_from([d for d in SUPPORTED if d.kind in "biu"]),
       st.sampled_from(["exp", "log1p", "sqrt", "tanh", "sigmoid", "logsumexp", "softmax", "log_softmax"]))
def test_float64_precision_widens_integer_operands_first(dtype, op):
    data = np.array([0, 1, 1], dtype=dtype)
    x = ct.var("x", (3,), dtype)
    got = ct.evaluate(getattr(ct, op)(x), {"x": data}, precision="float64")
    wide = ct.evaluate(getattr(ct, op)(ct.var("w", (3,), "float64")), {"w": data.astype(np.float64)})
    np.testing.assert_allclose(got, wide, rtol=1e-15)


def test_power_checks_the_computed_dtype_and_runtime_exponents():
    i8 = ct.var("i8", (3,), "int8")
    assert (i8 ** -0.5).dtype == np.float64  # NumPy computes an int base with a float exponent in floats
    assert (i8 ** np.array([-1.0, 2.0, 1.0])).dtype == np.float64
    with pytest.raises(ct.DTypeError, match="negative integer powers"):
        ct.var("b", (3,), "bool") ** -1
    exponent = ct.var("e", (3,), "int8")
    with pytest.raises(ct.BackendError, match="failed on these values: Integers to negative integer powers"):
        ct.evaluate(i8 ** exponent, {"i8": [1, 2, 3], "e": [1, -1, 2]})


def _misrecorded(name, shape_rule, dtype_rule, evaluate, computes_in_float32=None):
    """A unary op whose record's rules say one thing and whose ``evaluate`` computes another."""
    return Op(name, 1, (), lambda args: shape_rule(args[0]), lambda args: dtype_rule(args[0]), ELEMENTWISE,
              no_attributes, evaluate=evaluate, computes_in_float32=computes_in_float32)


def test_a_value_of_another_shape_than_its_record_says_is_an_internal_error():
    """Cast to the term's dtype and kept, it stood for the term: a wrong shape rule went unnoticed."""
    first_row = _misrecorded("first_row", lambda x: x.shape, lambda x: x.dtype, lambda xs: xs[0][:1])
    x = ct.var("x", (3, 2))
    with pytest.raises(RuntimeError, match=r"internal error: first_row's evaluate gave a value of shape \(1, 2\) for "
                                           r".*, whose shape rule says \(3, 2\): the op's record and its evaluation"):
        ct.evaluate(make(first_row, (x,)), {"x": np.ones((3, 2), np.float32)})


@pytest.mark.parametrize("precision", [None, "float64"])
def test_a_value_of_another_kind_or_integer_dtype_than_its_record_says_is_an_internal_error(precision):
    """An int8 running sum computed as NumPy's cumsum (in int64) was cast back to int8, wrapping."""
    running_sum = _misrecorded("running_sum", lambda x: x.shape, lambda x: x.dtype, lambda xs: np.cumsum(xs[0]))
    n = ct.var("n", (300,), "int8")
    with pytest.raises(RuntimeError, match=r"running_sum's evaluate gave a value of int64 for .*, whose dtype rule "
                                           r"says int8"):
        ct.evaluate(make(running_sum, (n,)), {"n": np.ones(300, np.int8)}, precision=precision)
    floor = _misrecorded("floor", lambda x: x.shape, lambda x: x.dtype, lambda xs: np.floor(xs[0]).astype(np.int64))
    x = ct.var("x", (3,))
    with pytest.raises(RuntimeError, match=r"floor's evaluate gave a value of int64 for .*, whose dtype rule says "
                                           r"float(32|64)"):
        ct.evaluate(make(floor, (x,)), {"x": np.ones(3, np.float32)}, precision=precision)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_floating_value_computed_wider_than_its_term_is_rounded_once(dtype):
    """As an op computing narrow floats in float32 says it does, or a lowered product whose output is narrower."""
    thirds = _misrecorded("thirds", lambda x: x.shape, lambda x: x.dtype, lambda xs: xs[0].astype(np.float64) / 3)
    x = ct.var("x", (3,), dtype)
    value = ct.evaluate(make(thirds, (x,)), {"x": np.array([1.0, 2.0, 3.0]).astype(x.dtype)})
    assert value.dtype == x.dtype and value.tolist() == (np.array([1.0, 2.0, 3.0]) / 3).astype(x.dtype).tolist()
