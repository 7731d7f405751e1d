"""The rule sets keep values, shrink graphs, terminate, and stabilise what overflows."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cortado as ct
from cortado.rules import Fixpoint, Postwalk, Rule, algebra, simplify, stability
from cortado.rules.api import fast_simplifier
from cortado.testing import feeds, graphs, graphs_with_feeds


def operation_count(outputs):
    """Terms that compute something: every term but variables and constants."""
    return sum(1 for t in ct.Graph(outputs).schedule if t.op.kind != "leaf")


def _close(before, after, outputs, dtype_tolerance):
    for b, a, term in zip(before, after, outputs):
        scale = max(1.0, float(np.max(np.abs(b), initial=0)))
        np.testing.assert_allclose(a, b, rtol=dtype_tolerance, atol=dtype_tolerance * scale, err_msg=repr(term))


def _values_kept(graph, feed, rewritten, tolerance):
    before = ct.evaluate(list(graph.outputs), feed, precision="float64")
    still_read = {v.name for v in ct.Graph(rewritten).variables}  # rewriting may drop variables
    after = ct.evaluate(rewritten, {k: v for k, v in feed.items() if k in still_read}, precision="float64")
    for old, new in zip(graph.outputs, rewritten):
        assert (new.shape, new.dtype) == (old.shape, old.dtype)
    _close(before, after, graph.outputs, tolerance)


everywhere = {name: Fixpoint(Postwalk(Fixpoint(rules))) for name, rules in
              [("stability", stability), ("all", algebra + stability)]}


@given(graphs_with_feeds(dtypes=("float64",)))
def test_simplify_keeps_values_and_never_adds_operations(case):
    graph, feed = case
    simplified = simplify(list(graph.outputs))
    _values_kept(graph, feed, simplified, 1e-9)
    assert operation_count(simplified) <= operation_count(graph.outputs)


@given(graphs_with_feeds(dtypes=("float32",)))
def test_simplify_keeps_float32_values_up_to_float32_rounding(case):
    graph, feed = case
    _values_kept(graph, feed, simplify(list(graph.outputs)), 1e-5)


@pytest.mark.parametrize("name", sorted(everywhere))
@given(case=graphs_with_feeds(dtypes=("float64",)))
def test_every_rule_set_keeps_values(name, case):
    graph, feed = case
    _values_kept(graph, feed, everywhere[name].run(list(graph.outputs)), 1e-9)


# -- redundancy put in on purpose, then taken out by simplify ----------------------------------


def _redundant_forms(term, draw):
    """Forms with ``term``'s value, shape and dtype, for every value, that simplify should undo."""
    forms = [term - 0.0, term + (-0.0), 1 * term, term * 1, ct.negative(ct.negative(term)),
             ct.cast(term, term.dtype), ct.reshape(ct.reshape(term, (-1,)), term.shape)]
    if term.ndim:
        perm = draw(st.permutations(range(term.ndim)))
        forms.append(ct.transpose(ct.transpose(term, perm), np.argsort(perm).tolist()))
    return forms


def _fast_math_forms(term, draw):
    """Forms with ``term``'s value for finite values of moderate size, which only fast_math undoes (a sum of one copy
    is ``term + 0.0``: a sum adds from +0.0, so it is +0.0 of -0.0)."""
    forms = [2.0 * (0.5 * term), term - term + term, (term + 1.0) + (-1.0), term + 0.0]
    if term.ndim:
        forms.append(0.5 * ct.sum(ct.broadcast_to(term, (2,) + term.shape), axis=0))
        forms.append(ct.sum(ct.broadcast_to(term, (1,) + term.shape), axis=0))
    return forms


def _obfuscated(data, graph, forms_of):
    def obfuscate(b):
        if not data.draw(st.booleans(), label=f"obfuscate {b.term!r}"):
            return None
        forms = forms_of(b.term, data.draw)
        return forms[data.draw(st.integers(0, len(forms) - 1))]

    return Postwalk(Rule("obfuscate", "_t", obfuscate)).run(list(graph.outputs))


@given(st.data(), graphs(dtypes=("float64",), ops=["add", "multiply", "exp", "tanh", "sum", "matmul", "transpose"]))
def test_simplify_takes_out_redundancy_put_in(data, graph):
    simplified = simplify(_obfuscated(data, graph, _redundant_forms))
    _values_kept(graph, data.draw(feeds(graph)), simplified, 1e-9)
    assert operation_count(simplified) <= operation_count(graph.outputs)


@given(st.data(), graphs(dtypes=("float64",), ops=["add", "multiply", "tanh", "sum", "matmul", "transpose"]))
def test_fast_math_takes_out_what_only_rounding_tells_apart(data, graph):
    simplified = fast_simplifier.run(_obfuscated(data, graph, _fast_math_forms))
    _values_kept(graph, data.draw(feeds(graph)), simplified, 1e-9)
    assert operation_count(simplified) <= operation_count(graph.outputs)


# -- termination on text -------------------------------------------------------------------


_atoms = st.sampled_from(["a", "b", "0", "1", "2", "-1", "0.5"])
_text = st.recursive(_atoms, lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**"]), inner).map(
    lambda t: f"({t[0]}) {t[1]} ({t[2]})") | inner.map(lambda s: f"-({s})") | inner.map(lambda s: f"log(exp({s}))"),
    max_leaves=16)


@given(_text)
def test_simplify_on_text_terminates_and_reaches_a_fixpoint(source):
    once = simplify(source)
    assert simplify(once) == once


# -- stability where the naive form fails ----------------------------------------------------


def _stabilised(term):
    return everywhere["stability"].run(term)


def test_log_softmax_of_logits_near_1000_is_finite():
    x = ct.var("x", (2, 3))
    logits = np.array([[1000.0, 0.0, -1000.0], [1000.0, 1001.0, 999.0]], np.float32)
    naive = ct.log(ct.softmax(x, axis=1))
    assert np.isinf(ct.evaluate(naive, {"x": logits})).any()
    stable = _stabilised(naive)
    assert stable is ct.log_softmax(x, axis=1)
    expected = logits - np.log(np.sum(np.exp(logits.astype(np.float64) - 1000), axis=1, keepdims=True)) - 1000
    np.testing.assert_allclose(ct.evaluate(stable, {"x": logits}), expected, rtol=1e-6)


def test_logsumexp_of_large_logits_does_not_overflow():
    x = ct.var("x", (3,))
    naive = ct.log(ct.sum(ct.exp(x)))
    assert np.isinf(ct.evaluate(naive, {"x": np.float32([1000, 1000, 1000])}))
    stable = _stabilised(naive)
    assert stable is ct.logsumexp(x)
    np.testing.assert_allclose(ct.evaluate(stable, {"x": np.float32([1000, 1000, 1000])}), 1000 + np.log(3), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_log1p_keeps_the_digits_of_small_inputs(dtype):
    x = ct.var("x", (), dtype)
    naive = ct.log(1 + x)
    feed = {"x": np.array(1e-10, dtype)}
    relative_error = abs(ct.evaluate(naive, feed) - 1e-10) / 1e-10
    assert relative_error > 1e-8  # float32: 1 + 1e-10 is 1, so log gives 0; float64 keeps 7 digits
    stable = _stabilised(naive)
    assert stable is ct.log1p(x)
    np.testing.assert_allclose(ct.evaluate(stable, feed), 1e-10, rtol=1e-7)


def test_expm1_and_log_sigmoid_and_softplus_are_stable():
    x = ct.var("x", (3,), "float64")
    feed = {"x": np.array([1e-12, -1000.0, 1000.0])}
    np.testing.assert_allclose(ct.evaluate(_stabilised(ct.exp(x) - 1), feed)[0], 1e-12, rtol=1e-9)
    log_sigmoid = ct.evaluate(_stabilised(ct.log(ct.sigmoid(x))), feed)
    np.testing.assert_allclose(log_sigmoid, [np.log(0.5) + 5e-13, -1000.0, 0.0], atol=1e-12)
    assert np.isinf(ct.evaluate(ct.log(ct.sigmoid(x)), feed)[1])  # the naive form
    complement = ct.evaluate(_stabilised(ct.log(1 - ct.sigmoid(x))), feed)
    np.testing.assert_allclose(complement, [np.log(0.5) - 5e-13, 0.0, -1000.0], atol=1e-12)
    softplus = ct.evaluate(_stabilised(ct.log(1 + ct.exp(x))), feed)
    np.testing.assert_allclose(softplus, [np.log(2.0) + 5e-13, 0.0, 1000.0], atol=1e-12)


def test_softmax_and_sigmoid_written_out_become_the_ops():
    x = ct.var("x", (2, 3))
    written = ct.exp(x) / ct.sum(ct.exp(x), axis=1, keepdims=True)
    assert _stabilised(written) is ct.softmax(x, axis=1)
    assert _stabilised(1 / (1 + ct.exp(-x))) is ct.sigmoid(x)


def test_the_sign_of_a_zero_is_kept_and_fast_math_lets_it_go():
    """``x + 0``, ``0 - x`` and ``-(x - y)`` differ from ``x``, ``-x`` and ``y - x`` only in the sign of a zero, which
    ``1 / x`` turns into the sign of an infinity: they stay, but for the zero that keeps every sign (``x + -0.0``,
    ``-0.0 - x``, ``x - 0.0``), integers, text, and fast_math."""
    x = ct.var("x", (2,))
    zeros = {"x": np.array([0.0, -0.0], np.float32)}
    written = [1.0 / (x + 0.0), 1.0 / (0.0 - x), 1.0 / ct.negative(x - x), 1.0 / (x + -0.0), 1.0 / (-0.0 - x),
               1.0 / (x - 0.0)]
    for term in written:
        expected = ct.evaluate(term, zeros)
        np.testing.assert_array_equal(ct.compile([term], inputs=[x])(**zeros)[0], expected)
        np.testing.assert_array_equal(np.signbit(ct.evaluate(simplify(term), zeros)), np.signbit(expected))
    assert simplify(x + 0.0) is 0.0 + x and simplify(x + -0.0) is x and simplify(x - 0.0) is x
    assert simplify(0.0 - x) is 0.0 - x and simplify(-0.0 - x) is ct.negative(x)
    i = ct.var("i", (2,), "int32")
    assert simplify(i + 0) is i and simplify(0 - i) is ct.negative(i) and simplify(ct.negative(i - 1)) is 1 - i
    assert simplify("a + 0") == "a" and simplify("0 - a") == "-a"
    assert fast_simplifier.run([x + 0.0])[0] is x and fast_simplifier.run([0.0 - x])[0] is ct.negative(x)


def test_x_times_zero_is_zero_only_where_that_holds_for_inf_and_nan():
    f = ct.var("f", (3,))
    i = ct.var("i", (3,), "int32")
    assert simplify(f * 0) is 0 * f
    assert simplify(i * 0).op.name == "const"


def test_algebra_tidies_what_gradients_leave():
    x, q = ct.var("x", (3, 4)), ct.var("q", (2, 3, 4))
    assert simplify(x + x) is 2 * x
    assert simplify("x + x") == "2 * x"
    ones = ct.const(np.ones(2, np.float32))
    assert simplify(ct.einsum("a,abc->abc", ones, q)) is q  # ones that stretch no axis go
    kept = ct.einsum("a,bc->abc", ones, x)  # here the ones make an axis: they stay
    assert simplify(kept) is kept
    assert simplify(ct.einsum("abc->cab", q)) is ct.transpose(q, (2, 0, 1))
    assert simplify(ct.const(np.full((3, 4), 6.0, np.float32)) * x) is 6.0 * x  # one value: a scalar
    s, h = ct.var("s", ()), ct.var("h", (3, 4), "float16")
    assert simplify(ct.const(np.ones((3, 4), np.float32)) * s) is ct.broadcast_to(s, (3, 4))
    assert simplify(h * ct.const(np.float32(1))) is ct.cast(h, "float32")
    assert simplify(ct.where(ct.const(True), x, s)) is x
    assert simplify(ct.where(ct.const(np.zeros(4, bool)), x, s)) is ct.broadcast_to(s, (3, 4))
    assert simplify("where(c, a, a)") == "a"
    big = ct.broadcast_to(ct.reshape(ct.const(np.float32(2)), (1, 1)), (1024, 1024))
    folded = simplify(big)
    assert folded.op.name == "const" and folded.attrs[0].scalar == 2 and folded.shape == (1024, 1024)


def test_a_transposed_product_becomes_the_product_of_transposes_only_where_one_composes_away():
    """``transpose(a @ b)`` as ``b^T @ a^T`` where an operand is a transpose itself (a weight gradient's ``x^T @ dy``):
    the new transpose of that operand composes with it; where none is, two transposes would take one's place."""
    x, dy = ct.var("x", (5, 4)), ct.var("dy", (5, 3))
    assert simplify(ct.transpose(ct.transpose(x) @ dy)) is ct.transpose(dy) @ x
    a, b = ct.var("a", (3, 4)), ct.var("b", (4, 2))
    kept = ct.transpose(a @ b)
    assert simplify(kept) is kept


def test_evaluate_in_float64_takes_float64_feeds_for_float32_variables():
    x = ct.var("x", (2,))
    value = np.array([1 + 1e-12, 2.0])
    assert ct.evaluate(x * 1, {"x": value}, precision="float64")[0] == 1 + 1e-12
    with pytest.raises(ct.DTypeError, match="has dtype float64"):
        ct.evaluate(x * 1, {"x": value})
