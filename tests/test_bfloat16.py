"""bfloat16: NumPy 2's promotion with weak scalars, sums and products accumulated in float32, every
op of random graphs against float64, the NumPy backend against the reference, gradients, feeds,
and the error where ml_dtypes is missing."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given

import cortado as ct
from cortado.exprgraph.dtypes import BFLOAT16, finfo, is_float
from cortado.exprgraph.ops import CONTRACTION, REDUCTION
from cortado.exprgraph.term import make
from cortado.gradcheck import check_grads
from cortado.testing import graphs_with_feeds

EPS = float(finfo(BFLOAT16).eps)  # 2**-7, the gap after 1: one rounding errs by 2**-8 at most


def bf16(values):
    return np.asarray(values, np.float32).astype(BFLOAT16)


# -- dtypes: NumPy 2's rules, which ml_dtypes alone does not follow ---------------------------

WEAK = {
    "x * 0.5": lambda x: x * 0.5, "x + 2": lambda x: x + 2, "2 - x": lambda x: 2 - x, "x / 3": lambda x: x / 3,
    "x ** 2": lambda x: x ** 2, "maximum(x, 0)": lambda x: ct.maximum(x, 0), "x < 1": lambda x: x < 1,
    "where(x > 0, x, 0.5)": lambda x: ct.where(x > 0, x, 0.5), "where(x > 0, 1, x)": lambda x: ct.where(x > 0, 1, x),
}


@pytest.mark.parametrize("build", WEAK.values(), ids=WEAK.keys())
def test_weak_python_scalars_take_bfloat16_as_they_take_float16(build):
    half = build(ct.var("h", (2,), "float16")).dtype
    expected = BFLOAT16 if half == np.float16 else half
    assert build(ct.var("x", (2,), "bfloat16")).dtype == expected


@pytest.mark.parametrize("other, expected", [("float32", "float32"), ("float64", "float64"), ("int8", "bfloat16"),
                                             ("uint8", "bfloat16"), ("bool", "bfloat16")])
def test_bfloat16_tensors_promote_as_numpy_promotes_them(other, expected):
    x, y = ct.var("x", (2, 2), "bfloat16"), ct.var("y", (2, 2), other)
    for result in (x + y, y * x, ct.where(x > 0, x, y), ct.einsum("ij,jk->ik", x, y)):
        assert result.dtype == np.dtype(expected) == np.result_type(BFLOAT16, np.dtype(other))


def test_bfloat16_reductions_and_contractions_stay_bfloat16():
    x, w = ct.var("x", (3, 4), "bfloat16"), ct.var("w", (4, 2), "bfloat16")
    for result in (x @ w, ct.einsum("ij,jk->ik", x, w), ct.sum(x), ct.mean(x, axis=0), ct.max(x),
                   ct.logsumexp(x, axis=1), ct.softmax(x), ct.log_softmax(x), ct.sigmoid(x), ct.softplus(x)):
        assert result.dtype == BFLOAT16
    assert (x @ ct.var("v", (4, 2), "float32")).dtype == np.float32


@pytest.mark.parametrize("other", ["float16", "int16", "int32", "int64", "uint16"])
def test_bfloat16_with_a_dtype_numpy_cannot_promote_it_with_is_refused_by_name(other):
    x, y = ct.var("x", (2, 2), "bfloat16"), ct.var("y", (2, 2), other)
    for build in (lambda: x + y, lambda: x < y, lambda: ct.where(x > 0, x, y), lambda: x @ y,
                  lambda: ct.einsum("ij,jk->ik", x, y)):
        with pytest.raises(ct.DTypeError, match=f"no common dtype for bfloat16 and {other}"):
            build()


def test_without_ml_dtypes_cortado_runs_and_bfloat16_says_what_to_install():
    script = "\n".join([
        "import sys",
        "sys.modules['ml_dtypes'] = None  # import ml_dtypes raises ImportError",
        "import numpy as np, cortado as ct",
        "x = ct.var('x', (2,))",
        "assert ct.evaluate(ct.exp(x), {'x': np.zeros(2, np.float32)}).tolist() == [1.0, 1.0]",
        "try:",
        "    ct.var('y', (2,), 'bfloat16')",
        "except ct.DTypeError as error:",
        "    print(error)",
    ])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "bfloat16 needs the ml_dtypes package" in result.stdout and "pip install ml_dtypes" in result.stdout


# -- values ----------------------------------------------------------------------------------


def _both(outputs, inputs, feeds):
    """The values of ``outputs`` from the reference interpreter and from the NumPy backend."""
    return ct.evaluate(outputs, feeds), ct.compile(outputs, inputs=inputs)(**feeds)


def test_sums_and_products_of_bfloat16_accumulate_in_float32_and_round_once():
    rng = np.random.default_rng(0)
    x, a, b = ct.var("x", (4096,), "bfloat16"), ct.var("a", (8, 64), "bfloat16"), ct.var("b", (64, 4), "bfloat16")
    feeds = {"x": bf16(rng.uniform(0.5, 1.5, 4096)), "a": bf16(rng.standard_normal((8, 64))),
             "b": bf16(rng.standard_normal((64, 4)))}
    x32, a32, b32 = (feeds[name].astype(np.float32) for name in "xab")
    expected = [np.sum(x32), np.mean(x32), a32 @ b32, a32 @ b32]
    outputs = [ct.sum(x), ct.mean(x), a @ b, ct.einsum("ij,jk->ik", a, b)]
    for values in _both(outputs, [x, a, b], feeds):
        for value, wanted in zip(values, expected):
            assert value.dtype == BFLOAT16
            np.testing.assert_array_equal(value, np.asarray(wanted).astype(BFLOAT16))
    totals = _both([ct.sum(x)], [x], {"x": np.ones(4096, BFLOAT16)})
    assert [float(total) for (total,) in totals] == [4096, 4096]  # added in bfloat16, ones stop at 256


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"])
def test_casts_to_and_from_bfloat16_are_numpys(dtype):
    x, v = ct.var("x", (4,), "bfloat16"), ct.var("v", (4,), dtype)
    feeds = {"x": bf16([1.5, -2.0, 0.0, 100.0]), "v": np.array([1, 0, 3, 1]).astype(dtype)}
    expected = [feeds["x"].astype(dtype), feeds["v"].astype(BFLOAT16)]
    for values in _both([ct.cast(x, dtype), ct.cast(v, "bfloat16")], [x, v], feeds):
        for value, wanted in zip(values, expected):
            assert value.dtype == wanted.dtype
            np.testing.assert_array_equal(value, wanted)


def test_a_bfloat16_variable_takes_bfloat16_arrays_and_python_numbers_as_a_float16_one_does():
    x = ct.var("x", (2,), "bfloat16")
    assert ct.evaluate(x * 2, {"x": bf16([1.5, 3])}).tolist() == [3, 6]
    assert ct.evaluate(x * 2, {"x": [1.5, 3]}).dtype == BFLOAT16
    assert ct.evaluate(x * 2, {"x": np.array([1.5, 3])}, precision="float64").dtype == np.float64
    with pytest.raises(ct.DTypeError, match=r"has dtype float32; convert it with .astype\('bfloat16'\)"):
        ct.evaluate(x, {"x": np.ones(2, np.float32)})


def _alone(term):
    """``term``'s op and attributes applied to fresh variables of its operands' types."""
    operands = tuple(ct.var(f"operand{i}", a.shape, a.dtype) for i, a in enumerate(term.args))
    return make(term.op, operands, term.attrs), operands


def _error_bound(term, alone, operands, feeds, exact):
    """How far ``term``'s value may be from ``exact``. An op that accumulates rounds once, after
    float32 sums whose error is relative to the sum of the operands' absolute values (products:
    the same op on absolute values) or to the largest of them (softmax, logsumexp). Any other op
    rounds its result, and a formula its intermediates (gelu's cubic, sigmoid's exp): those move
    the result about as much as moving the operands by two roundings does, except where the result
    turns (gelu_grad at its minimum), where the intermediates' roundings, relative to the operand,
    remain."""
    eps, tiny = float(finfo(term.dtype).eps), float(finfo(term.dtype).tiny)
    if term.op.kind == CONTRACTION or term.op.name in ("sum", "mean"):
        sizes = np.abs(ct.evaluate(alone, {v.name: np.abs(feeds[v.name]) for v in operands}, precision="float64"))
        return eps / 2 * np.abs(exact) + 2 ** -12 * sizes + tiny
    if term.op.kind == REDUCTION:
        sizes = max(float(np.max(np.abs(feeds[v.name].astype(np.float64)))) for v in operands)
        return eps / 2 * np.abs(exact) + 2 ** -12 * sizes + tiny
    moved = [ct.evaluate(alone, {v.name: _scaled(feeds[v.name], factor) for v in operands}, precision="float64")
             for factor in (1 - 2 * eps, 1 + 2 * eps)]
    spread = np.nan_to_num(np.fmax(*(np.abs(m - exact) for m in moved)))  # nan: a negative base to a moved power
    if term.op.name in ("gelu", "gelu_grad"):
        spread = spread + eps * np.abs(feeds[operands[0].name].astype(np.float64))
    return 2 * eps * np.abs(exact) + spread + tiny


def _scaled(array, factor):
    return array.astype(np.float64) * factor if is_float(array.dtype) else array


@given(graphs_with_feeds(dtypes=("bfloat16", "float32")))
def test_every_op_of_random_graphs_is_within_rounding_of_float64_on_its_own_operands(case):
    """Each op's value, from the operands the reference computed, against that op in float64."""
    graph, feeds = case
    everything = ct.schedule(graph.outputs)
    values = dict(zip(everything, ct.evaluate(everything, feeds)))
    for term in (t for t in everything if t.args):
        alone, operands = _alone(term)
        operand_feeds = {v.name: values[a] for v, a in zip(operands, term.args)}
        exact = ct.evaluate(alone, operand_feeds, precision="float64")
        ours = values[term]
        assert ours.dtype == term.dtype
        if not is_float(term.dtype):
            np.testing.assert_array_equal(ours, exact)
            continue
        bound = _error_bound(term, alone, operands, operand_feeds, exact)
        assert (np.abs(ours.astype(np.float64) - exact) <= bound).all(), term


@given(graphs_with_feeds(dtypes=("bfloat16",)))
def test_random_bfloat16_graphs_compile_to_the_reference_values(case):
    """Op for op the same calls; only simplify's rewrites (``(x + 2) + 2`` to ``x + 4``) round differently."""
    graph, feeds = case
    program = ct.compile(list(graph.outputs), inputs=graph.inputs, debug=True)
    for ours, expected in zip(program(**feeds), ct.evaluate(graph.outputs, feeds)):
        assert ours.dtype == expected.dtype
        np.testing.assert_allclose(ours.astype(np.float64), expected.astype(np.float64), rtol=4 * EPS, atol=EPS / 2)


# -- gradients -------------------------------------------------------------------------------


def test_gradients_of_a_bfloat16_model_are_bfloat16_and_agree_with_finite_differences():
    x, W = ct.var("x", (5, 4), "bfloat16"), ct.var("W", (4, 3), "bfloat16")
    loss = ct.sum(ct.tanh(x @ W) * 0.5) + ct.sum(ct.logsumexp(x @ W, axis=1))
    assert ct.grad(loss, W).dtype == BFLOAT16
    rng = np.random.default_rng(3)
    feeds = {"x": bf16(rng.standard_normal((5, 4))), "W": bf16(rng.standard_normal((4, 3)))}
    for order in (1, 2):
        check_grads(loss, [W], feeds, order=order)
    mixed = ct.sum(ct.tanh(ct.var("y", (5, 4)) @ ct.cast(W, "float32")))
    check_grads(mixed, [W], {"y": rng.standard_normal((5, 4)).astype(np.float32), "W": feeds["W"]})


@given(graphs_with_feeds(dtypes=("bfloat16",)))
def test_gradients_of_random_bfloat16_graphs_are_bfloat16_and_compile_to_the_reference_values(case):
    graph, feeds = case
    floats = [out for out in graph.outputs if is_float(out.dtype)]
    assume(floats)
    gradients = ct.grad(sum(ct.sum(out) for out in floats), list(graph.inputs))
    assert [g.dtype for g in gradients] == [BFLOAT16] * len(gradients)
    read = ct.Graph(gradients).variables
    feeds = {v.name: feeds[v.name] for v in read}
    program = ct.compile(gradients, inputs=read, debug=True)
    for ours, expected in zip(program(**feeds), ct.evaluate(gradients, feeds)):
        expected = expected.astype(np.float64)
        np.testing.assert_allclose(ours.astype(np.float64), expected, rtol=4 * EPS,
                                   atol=EPS / 2 * max(1.0, np.abs(expected).max(initial=0)))
