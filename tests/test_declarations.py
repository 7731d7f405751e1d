"""Each ``ct.var`` call declares a variable of its own: a helper called twice makes two weights, and two
variables of one name in one program are refused, naming where each was declared."""

import numpy as np
import pytest

import cortado as ct


def _linear(x):
    W = ct.var("W", (16, 16))
    return x @ W


def test_a_helper_called_twice_declares_two_weights():
    x = ct.var("x", (4, 16))
    loss = ct.sum(_linear(_linear(x)))
    weights = [v for v in ct.Graph(loss).variables if v.name == "W"]
    assert len(weights) == 2 and weights[0] is not weights[1]
    first, second = ct.grad(loss, weights)
    assert first is not second


def test_compile_refuses_two_variables_of_one_name_naming_both_lines():
    x = ct.var("x", (4, 16))
    h = _linear(x)
    loss = ct.sum(_linear(h))
    W = next(v for v in ct.Graph(loss).variables if v.name == "W")
    with pytest.raises(ct.FeedError) as error:
        ct.compile([loss], inputs=[x], state={W: np.eye(16, dtype=np.float32)})
    message = str(error.value)
    assert "two variables are both named 'W'" in message
    assert message.count("test_declarations.py:11") == 2  # the helper's line, once a declaration
    assert "called from tests/test_declarations.py:26" in message and "test_declarations.py:27" in message


def test_evaluate_refuses_two_variables_of_one_name():
    x = ct.var("x", (4, 16))
    with pytest.raises(ct.FeedError, match="two variables are both named 'W'"):
        ct.evaluate(ct.sum(_linear(_linear(x))), {"x": np.ones((4, 16), np.float32), "W": np.eye(16, dtype=np.float32)})


def test_one_declaration_passed_to_both_places_is_one_weight():
    x, W = ct.var("x", (4, 16)), ct.var("W", (16, 16))
    loss = ct.sum((x @ W) @ W)
    assert [v.name for v in ct.Graph(loss).variables].count("W") == 1
    step = ct.compile([loss], inputs=[x], state={W: np.eye(16, dtype=np.float32)})
    (value,) = step(x=np.ones((4, 16), np.float32))
    assert value == 64


def test_two_declarations_are_distinct_terms_but_each_is_hash_consed():
    a, b = ct.var("a", (3,)), ct.var("a", (3,))
    assert a is not b and ct.exp(a) is not ct.exp(b)
    assert ct.exp(a) * 2 is ct.exp(a) * 2


def test_subs_by_a_name_two_variables_share_is_refused():
    """Found by a review: subs replaced one of the two silently; the variable itself says which."""
    x = ct.var("x", (16,))
    first = x @ ct.var("W", (16, 16))
    loss = ct.sum(_linear(first))
    with pytest.raises(ct.RewriteError, match="two variables are both named 'W'"):
        ct.rules.subs(loss, W=np.eye(16, dtype=np.float32))
    W = first.args[1]
    assert ct.rules.subs(loss, {W: ct.const(np.eye(16, dtype=np.float32))}) is not loss

