"""The engine: rules, rule sets, strategies, termination, memoisation and the trace."""

import pytest

import cortado as ct
from cortado.rules import Chain, Fixpoint, Postwalk, Prewalk, Rule, RuleSet, Trace, explain, parse, unparse

x = ct.var("x", (3,))


def _text(rewriter, source, trace=None):
    return unparse(rewriter.run(parse(source), trace))


def test_a_rule_set_tries_its_rules_in_order_and_composes_with_plus():
    first = RuleSet([Rule("to-g", "f(_x)", "g(_x)")])
    second = RuleSet([Rule("to-h", "f(_x)", "h(_x)"), Rule("g-to-k", "g(_x)", "k(_x)")])
    assert _text(first + second, "f(a)") == "g(a)"
    assert _text(second + first, "f(a)") == "h(a)"
    assert [r.name for r in first + second] == ["to-g", "to-h", "g-to-k"]
    assert (first + second)["g-to-k"].name == "g-to-k"


def test_prewalk_and_postwalk_visit_in_opposite_orders():
    rules = RuleSet([Rule("outer", "f(g(_x))", "done(_x)"), Rule("inner", "g(_x)", "h(_x)")])
    assert _text(Prewalk(rules), "f(g(a))") == "done(a)"  # the parent is seen first
    assert _text(Postwalk(rules), "f(g(a))") == "f(h(a))"  # the child is rewritten first


def test_chain_applies_each_in_turn():
    chain = Chain(Postwalk(Rule("a", "f(_x)", "g(_x)")), Postwalk(Rule("b", "g(_x)", "h(_x)")))
    assert _text(chain, "f(f(a))") == "h(h(a))"


def test_fixpoint_repeats_until_nothing_changes():
    count_down = Rule("down", "s(s(_x))", "s(_x)")
    assert _text(Fixpoint(Postwalk(count_down)), "s(s(s(s(s(z)))))") == "s(z)"


def test_a_cycle_is_an_error_naming_its_rules():
    flip = RuleSet([Rule("commute", "_x + _y", "_y + _x")])
    with pytest.raises(ct.RewriteError, match="rules commute rewrite in a cycle.*a \\+ b  ->  b \\+ a"):
        Fixpoint(flip).run(parse("a + b"))
    pair = RuleSet([Rule("f-to-g", "f(_x)", "g(_x)"), Rule("g-to-f", "g(_x)", "f(_x)")])
    with pytest.raises(ct.RewriteError, match="rules f-to-g, g-to-f rewrite in a cycle"):
        Fixpoint(Postwalk(pair)).run(parse("f(a)"))


def test_growth_without_end_stops_at_the_cap():
    grow = Rule("grow", "f(_x)", "f(g(_x))")
    with pytest.raises(ct.RewriteError, match="grow were still rewriting after 20 rounds"):
        Fixpoint(Postwalk(grow), max_iterations=20).run(parse("f(a)"))
    # a walk's memo replays the first rewrite inside the grown term: later rounds record none, the error names it
    with pytest.raises(ct.RewriteError, match=r"rules wrap-double were still rewriting after 20 rounds, each round "
                                              r"the term grown by their rewrites \(shown\) inside it again.*: "
                                              r"wrap-double: a \* 2  ->  a \* 2 \* 1"):
        Fixpoint(Postwalk(Rule("wrap-double", "_a * 2", "(_a * 2) * 1")), max_iterations=20).run(parse("a * 2"))
    with pytest.raises(ct.RewriteError, match="rewrite a term into one that contains it"):
        Prewalk(Rule("wrap", "f(_x)", "h(f(_x))")).run(parse("f(a)"))
    with pytest.raises(ct.RewriteError, match="nested 50 rewrites deep"):
        Prewalk(Rule("nest", "f(_x)", "h(f(g(_x)))"), max_depth=50).run(parse("f(a)"))


def test_a_shared_subterm_is_rewritten_once():
    calls = []

    def rewrite_leaf(b):
        calls.append(b.term)
        return b.domain.build("+", [b["_x"], b.domain.literal(1)], {})

    shared = ct.exp(x)
    expression = shared * shared + ct.sum(shared) * shared
    Postwalk(Rule("leaf", "exp(_x)", rewrite_leaf)).run(expression)
    assert calls == [shared]


def test_log_exp_fires_on_text_but_not_on_a_float_tensor_where_exp_overflows_or_rounds_to_one():
    assert ct.rules.unparse(ct.rules.simplify(ct.rules.parse("log(exp(y))"))) == "y"
    assert ct.rules.simplify(ct.log(ct.exp(x))) is ct.log(ct.exp(x))
    assert ct.rules.simplify(ct.log1p(ct.expm1(x))) is ct.log1p(ct.expm1(x))


def test_the_trace_records_every_rewrite_and_explain_prints_it():
    trace = Trace()
    ct.rules.simplify(ct.negative(ct.negative(x)) * 1 - 0, trace=trace)
    assert [step.rule for step in trace] == ["double-negation", "multiply-one-right", "subtract-zero"]
    assert trace[0].before is ct.negative(ct.negative(x)) and trace[0].after is x
    text = explain(trace)
    assert text.startswith("3 rewrites by 3 rules")
    assert "double-negation: negative(negative(x))  ->  x" in text
    assert explain(Trace()) == "no rule fired"


def test_a_match_refused_says_why_in_the_trace():
    """A rule that matches but whose replacement cannot stand for the term (another shape, or operands its ops
    refuse) fires nowhere; the trace keeps the refusal, and explain shows the first of each rule with why."""
    m = ct.var("m", (4, 3))
    rules = RuleSet([Rule("drop-sum", "sum(_a, axis=_ax, keepdims=_k)", "_a"),
                     Rule("bad-product", "exp(_a)", "_a @ _a")])
    trace = Trace()
    Fixpoint(Postwalk(rules)).run([ct.sum(m, axis=1), ct.exp(m)], trace)
    assert not trace and {rule for rule, _, _ in trace.refused} == {"drop-sum", "bad-product"}
    text = trace.explain()
    assert text.startswith("no rule fired\n") and "match(es) refused:" in text
    assert "drop-sum at sum(m, axes=(1,)): its replacement would be float32[4, 3], not the term's float32[4]" in text
    assert "bad-product at exp(m): its replacement's ops refuse it: " in text


def test_deep_chains_need_no_recursion():
    term = x
    for _ in range(50_000):
        term = ct.exp(term) * 1
    assert ct.rules.simplify(term) is _exp_chain(50_000)


def _exp_chain(depth):
    term = x
    for _ in range(depth):
        term = ct.exp(term)
    return term


def test_rules_are_checked_when_they_are_made():
    with pytest.raises(ct.RewriteError, match="uses _y, which the pattern"):
        Rule("bad", "f(_x)", "g(_y)")
    with pytest.raises(ct.RewriteError, match="expected a Rule or a \\(pattern, replacement\\) pair"):
        RuleSet(["f(_x)"])
