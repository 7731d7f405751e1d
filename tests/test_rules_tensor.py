"""The Espresso-style functions on tensor expressions, and patterns written in code."""

import numpy as np
import pytest

import cortado as ct
from cortado.rules import findex, matchex, matchingex, placeholders, rewrite, rewrite_all, simplify, subs, tryrewrite

x = ct.var("x", (3, 4))
y = ct.var("y", (4,))
n = ct.var("n", (3, 4), "int32")


def test_text_patterns_match_tensor_terms_by_op_name():
    assert matchex("_a + _b", x + y) == {"_a": x, "_b": y}
    assert matchex("np.exp(_a)", ct.exp(x)) == {"_a": x}
    assert matchex("_a.T", x.T) == {"_a": x}
    assert matchex("x + _b", x + y) == {"_b": y}  # a plain name is the variable of that name
    assert matchex("z + _b", x + y) is None


def test_numbers_match_constants_whose_every_element_equals_them():
    assert matchingex("_a * 2", x * 2)
    assert matchingex("_a * 2", x * np.full((3, 4), 2.0, np.float32))
    assert not matchingex("_a * 2", x * np.arange(4, dtype=np.float32))


def test_placeholders_in_code_build_patterns_with_operators_and_functions():
    a, b = placeholders("a b")
    assert matchex(ct.exp(a) + b, ct.exp(x) + y) == {"a": x, "b": y}
    assert rewrite(ct.exp(x) + y, ct.exp(a) + b, b * ct.exp(a)) is y * ct.exp(x)
    assert matchex(ct.sum(a, axis=1), ct.sum(x, axis=-1)) == {"a": x}  # attributes compare normalised
    assert matchex(ct.sum(a, axis=0), ct.sum(x, axis=1)) is None
    assert matchex(a.T, x.T) == {"a": x}


def test_constrained_placeholders():
    a = placeholders("a")
    c = placeholders("c", const=True)
    f = placeholders("f", dtype="floating")
    m = placeholders("m", rank=1)
    assert matchex(c * a, 2.0 * x) is not None
    assert matchex(c * a, y * x) is None
    assert matchingex(f + 1, x + 1) and not matchingex(f + 1, n + 1)
    assert matchingex(placeholders("i", dtype="int32") + 1, n + 1)
    assert matchingex(a + m, x + y) and not matchingex(m + a, x + y)


def test_attribute_placeholders_bind_the_normalised_attribute():
    assert matchex("sum(_x, axis=_a, keepdims=_k)", ct.sum(x, axis=-1)) == {"_x": x, "_a": (1,), "_k": False}
    assert rewrite(ct.sum(x, axis=1, keepdims=True), "sum(_x, axis=_a, keepdims=_k)",
                   "max(_x, axis=_a, keepdims=_k)") is ct.max(x, axis=1, keepdims=True)
    assert matchex("sum(_x)", ct.sum(x, axis=(0, 1))) == {"_x": x}  # omitted parameters are defaults
    assert matchex("sum(_x)", ct.sum(x, axis=0)) is None
    assert matchex("cast(_x, dtype='float64')", ct.cast(x, "float64")) == {"_x": x}


def test_splats_match_the_remaining_operands():
    a, b = ct.var("a", (2, 3)), ct.var("b", (3, 5))
    e = ct.einsum("ij,jk->ik", a, b)
    assert matchex("einsum(*_xs, subscripts=_s)", e) == {"_xs": (a, b), "_s": "ab,bc->ac"}  # normalised
    rest = placeholders("*rest")
    assert matchex(ct.einsum("ij,jk->ik", *rest), e) == {"rest": (a, b)}


def test_a_tensor_rewrite_that_would_change_shape_or_dtype_does_not_apply():
    assert tryrewrite(x + y, "_a + _b", "_b") is None  # y alone has the wrong shape
    assert tryrewrite(ct.cast(x, "float64"), "cast(_a, dtype=_d)", "_a") is None
    assert tryrewrite(x * 0.5, "_a * _c", "sum(_a, axis=0)") is None
    zeros = rewrite(x - x, "_a - _a", "0")  # a number stands for a constant of the term's type
    assert zeros.shape == (3, 4) and zeros.dtype == np.float32 and not zeros.attrs[0].array.any()


def test_subs_on_tensors():
    z = ct.var("z", (3, 4))
    assert subs(ct.exp(x) + y, x=z) is ct.exp(z) + y
    assert subs(ct.exp(x) + y, {x: z}) is ct.exp(z) + y
    value = ct.evaluate(subs(x + 1, x=2.0), {})
    np.testing.assert_array_equal(value, np.full((3, 4), 3.0, np.float32))
    with pytest.raises(ct.RewriteError, match="no variable named 'q'.*it has x, y"):
        subs(x + y, q=z)
    with pytest.raises(ct.RewriteError, match="not exactly a int32 value"):
        subs(n + 1, n=0.5)
    with pytest.raises(ct.RewriteError, match="shape"):
        subs(x + 1, x=np.zeros(3))


def test_findex_and_rewrite_all_on_tensors():
    assert findex("exp(_a)", ct.exp(x) + ct.exp(y)) == [ct.exp(x), ct.exp(y)]
    assert rewrite_all(ct.log(1 + x) * ct.log(1 + x), ct.rules.stability) is ct.log1p(x) * ct.log1p(x)


def test_simplify_takes_lists_and_shares_their_subterms():
    trace = ct.rules.Trace()
    simplified = simplify([x * 1, ct.exp(x * 1)], trace=trace)
    assert simplified == [x, ct.exp(x)]
    assert trace.counts()["multiply-one-right"] + trace.counts()["constant-first-multiply"] <= 2


def test_bad_arguments_are_rewrite_errors():
    with pytest.raises(ct.RewriteError, match="not list"):
        simplify([[x]])
    with pytest.raises(ct.RewriteError, match="cannot use dict"):
        matchex({}, x)
    with pytest.raises(ct.RewriteError, match="no cortado op"):
        rewrite(ct.exp(x), "exp(_a)", "frobnicate(_a)")
    with pytest.raises(ct.RewriteError, match="names the variable 'w'"):
        rewrite(ct.exp(x), "exp(_a)", "_a + w")


def test_a_pattern_call_missing_a_required_parameter_matches_nothing():
    assert matchex("reshape(_a)", ct.reshape(x, (12,))) is None


def test_exact_matching_lets_attributes_repeat():
    assert matchingex("sum(_a, axis=_p) + sum(_b, axis=_q)", ct.sum(x, axis=0) + ct.sum(2 * x, axis=0), exact=True)
