"""``ct.compile(..., rules=...)``: the caller's own rewrites run before every other stage, on the outputs, the
gradients and the updates alike; a rule set as the built-in algebra runs (bottom-up to a fixpoint), a strategy as
given; what they did listed first by ``explain()``; anything else refused."""

import numpy as np
import pytest

import cortado as ct
from cortado.rules import Postwalk, Rule, RuleSet

TRIG = RuleSet([Rule("pythagoras", "sin(_t) ** 2 + cos(_t) ** 2", "1"),
                Rule("sin-double", "sin(_t) * cos(_t) * 2", "sin(2 * _t)")], name="trig")


def test_your_rules_run_first_and_explain_lists_them():
    t = ct.var("t", (8,))
    out = ct.sin(t) ** 2 + ct.cos(t) ** 2 + ct.sin(t) * ct.cos(t) * 2
    program = ct.compile([out], inputs=[t], rules=TRIG)
    text = program.explain()
    assert text.splitlines()[1].startswith("  your rules: 2 rewrites:"), text
    assert "pythagoras: add(power(sin(t), 2.0), power(cos(t), 2.0))  ->  full(1.0)" in text
    values = np.linspace(-2, 2, 8).astype(np.float32)
    np.testing.assert_allclose(program(t=values)[0], 1 + np.sin(2 * values), rtol=1e-6)
    assert "your rules" not in ct.compile([out], inputs=[t]).explain()


@pytest.mark.parametrize("rules", [TRIG["pythagoras"], [TRIG["pythagoras"]], Postwalk(TRIG),
                                   [("sin(_t) ** 2 + cos(_t) ** 2", "1")]], ids=["rule", "list", "strategy", "pairs"])
def test_a_rule_a_list_a_strategy_or_pairs(rules):
    t = ct.var("t", (3,))
    program = ct.compile([ct.sin(t) ** 2 + ct.cos(t) ** 2], inputs=[t], rules=rules)
    assert " x1" in program.explain()
    np.testing.assert_array_equal(program(t=np.array([0.1, 2.0, -5.0], np.float32))[0], [1, 1, 1])


def test_your_rules_rewrite_the_gradients_and_updates_too():
    """A rule that would change nothing but the form: an update's ``w - 0.5 * g`` read as ``w - g / 2``."""
    w, x = ct.var("w", (4,)), ct.var("x", (4,))
    (g,) = ct.grad(ct.sum(ct.sin(w * x)), [w])
    halve = Rule("halve", "_w - 0.5 * _g", "_w - _g / 2")
    program = ct.compile([], inputs=[x], state={w: np.ones(4, np.float32)}, updates={w: w - 0.5 * g}, rules=halve)
    assert "halve x1" in program.explain()
    xv = np.arange(4, dtype=np.float32)
    program(x=xv)
    np.testing.assert_allclose(program.state["w"], 1 - np.cos(xv) * xv / 2, rtol=1e-6)


def test_anything_else_is_refused():
    t = ct.var("t", (3,))
    with pytest.raises(ct.RewriteError, match=r"rules is a Rule, a RuleSet, a list of them \(or of \(pattern, "
                                                         r"replacement\) pairs\) or a strategy"):
        ct.compile([t * 2], inputs=[t], rules="sin(_t) -> 0")


def test_a_rule_that_reads_a_variable_the_program_is_not_given_is_refused_at_compile():
    """A rule's replacement reading a new variable compiled, then the step failed with a KeyError from inside the
    executor's load of it: the variables the rules bring in are checked, and named, when compiling."""
    x, z = ct.var("x", (4,)), ct.var("z", (4,))
    brings_z = Rule("brings-z", "tanh(_t)", lambda b: ct.sin(b["_t"]) + z)
    with pytest.raises(ct.RewriteError, match=r"read variable .z.*neither an input nor state.*brings-z"):
        ct.compile([ct.tanh(x)], inputs=[x], rules=brings_z)
    program = ct.compile([ct.tanh(x)], inputs=[x, z], rules=brings_z)  # z fed: nothing to refuse
    np.testing.assert_allclose(program(x=np.ones(4, np.float32), z=np.ones(4, np.float32))[0], np.sin(1) + 1, rtol=1e-6)


def test_explain_says_why_a_rule_of_yours_that_matched_did_not_fire():
    x = ct.var("x", (4,))
    widen = Rule("widen", "exp(_x)", "exp(cast(_x, dtype='float64'))")
    text = ct.compile([ct.exp(x)], inputs=[x], rules=widen).explain()
    assert ("  your rules: nothing fired\n      refused: widen at exp(x): its replacement would be float64[4], not the "
            "term's float32[4]") in text


@pytest.mark.parametrize("rule, message", [
    (Rule("printed", "sum(_x, axes=_a)", "_x"), r"sum takes no axes= \(its keywords: axis=, keepdims=\)"),
    (Rule("misspelt", "sum(_x, axiz=_a)", "_x"), "sum takes no axiz="),
    (Rule("unknown", "foo(_x)", "_x"), "'foo' is the op of no term"),
    (Rule("builds-only", "conv2d(_x, _w)", "_x"), "'conv2d' is the op of no term"),  # its terms' op is conv
    (Rule("unknown-replacement", "max(-_x)", "-min(_x)"), r"'min' is no cortado op \(ct.min is a function written "
                                                          r"with other ops, which a rule writes out"),
    (Rule("positional", "sum(_x, 0)", "_x"), r"sum takes 1 operand\(s\), not 2: its attributes are keywords "
                                             r"\(axis=, keepdims=\)"),
    (Postwalk(RuleSet([Rule("in-a-strategy", "foo(_x)", "_x")])), "'foo' is the op of no term"),
])
def test_a_rule_that_fits_no_term_is_refused_rather_than_never_firing(rule, message):
    """A pattern copied from explain() (which prints attributes, axes=) matched nothing, without a word."""
    x = ct.var("x", (3,))
    name = getattr(rule, "name", "in-a-strategy")
    with pytest.raises(ct.RewriteError, match=rf"your rule '{name}' fits no term of a program: {message}"):
        ct.compile([ct.sum(x)], inputs=[x], rules=rule)


def test_a_rules_guard_is_a_function_and_a_name_given_for_it_is_refused():
    """A third item of a rule's tuple is its guard: a name given there failed deep in the engine, calling a str."""
    x = ct.var("x", (4,))
    with pytest.raises(ct.RewriteError, match=r"its guard is a function of the bindings, not 'my-name'; a rule is "
                                              r"named with Rule\(name, pattern, replacement\)"):
        ct.compile([ct.log(1 + x)], inputs=[x], rules=[("log(1 + _a)", "log1p(_a)", "my-name")])


def test_a_pattern_with_the_ops_own_keywords_is_taken():
    """add_at's terms carry size=, which its function derives: a pattern may bind it (the built-in derivative does)."""
    base, values = ct.var("base", (6,)), ct.var("values", (3,))
    added = ct.add_at(base, np.array([0, 2, 2], np.int32), values, axis=0)
    ct.compile([added], inputs=[base, values], rules=Rule("keep", "add_at(_v, _i, axis=_a, size=_n)", lambda b: None))
