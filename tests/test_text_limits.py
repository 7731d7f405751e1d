"""The text API at sizes a generated expression reaches: long sums, deep nesting, rule sets that grow text.

Each used to end in a RecursionError or MemoryError (or run for minutes); now each works, or is a RewriteError
that says why, quickly.
"""

import ast
import gc
import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cortado as ct
from cortado.rules import Fixpoint, Postwalk, Prewalk, Rule, RuleSet, parse, rewrite_all, simplify, unparse
from cortado.rules.text import abbreviated


def test_a_sum_of_400_terms_reads_prints_and_simplifies():
    source = " + ".join(f"x{i}" for i in range(400))
    term = parse(source)
    assert unparse(term) == str(term) == source
    assert simplify(f"({source}) * 1") == source
    assert repr(term).startswith("<text ") and len(repr(term)) < 1000


@pytest.mark.parametrize("depth", [600, 2500])
def test_deeply_nested_minus_signs_read_print_and_cancel(depth):
    source = "-" * depth + "x"
    assert unparse(parse(source)) == source
    assert simplify(source) == ("-x" if depth % 2 else "x")


def test_text_deeper_than_pythons_parser_goes_is_a_rewrite_error():
    with pytest.raises(ct.RewriteError, match="nested deeper than Python's parser goes") as caught:
        parse("-" * 20000 + "x")
    assert len(str(caught.value)) < 300  # the text is cut in the message


@pytest.mark.parametrize("strategy", [Fixpoint, lambda r: Fixpoint(Postwalk(r)), lambda r: Postwalk(Fixpoint(r)),
                                      lambda r: Fixpoint(Prewalk(r))])
@pytest.mark.parametrize("rule", [
    Rule("double", "f(_x)", "f(g(_x, _x))"),  # shares its halves: 2**100 leaves after 100 rounds
    Rule("wrap", "f(_x)", "f(h(_x))"),
    Rule("plus-zero", "_x", "_x + 0"),
])
def test_a_rule_set_that_grows_text_stops_with_a_short_rewrite_error(strategy, rule):
    start = time.perf_counter()
    with pytest.raises(ct.RewriteError, match=rule.name) as caught:
        strategy(RuleSet([rule])).run(parse("f(y)"))
    assert time.perf_counter() - start < 10
    assert len(str(caught.value)) < 3000


def test_printing_a_term_too_large_for_text_is_a_rewrite_error_showing_a_part():
    term = parse("y")
    for _ in range(40):
        term = parse("g(a, a)").rebuild([term, term])  # 2**40 leaves, 40 distinct subterms
    with pytest.raises(ct.RewriteError, match="would print as") as caught:
        unparse(term)
    assert "..." in str(caught.value) and len(str(caught.value)) < 3000
    assert "..." in unparse(abbreviated(term))
    assert len(repr(term)) < 3000


def test_rewriting_text_of_ever_new_function_names_keeps_no_memory():
    rules = RuleSet([Rule("drop-zero", "_x + 0", "_x")])

    def rewrite_names(first):
        for i in range(first, first + 5000):
            rewrite_all(parse(f"fn{i}(a) + 0"), rules)

    rewrite_names(0)  # warm up whatever is made once
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    rewrite_names(10_000)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    # Python's compiler keeps the names it reads (interned for good since Python 3.12): not ours to hold
    ours = [tracemalloc.Filter(False, ast.__file__), tracemalloc.Filter(False, tracemalloc.__file__)]
    grown = sum(stat.size_diff for stat in after.filter_traces(ours).compare_to(before.filter_traces(ours), "filename"))
    assert grown < 200_000, f"{grown} bytes kept after rewriting 5000 texts of new names"


_names = st.sampled_from(["a", "b", "x", "np.exp", "_y"])
_leaves = _names | st.integers(-3, 3).map(str) | st.sampled_from(["0.5", "-2.0", "1e400", "'s'", "True", "None", "..."])


def _combine(children):
    pair = st.tuples(children, children)
    return (st.tuples(children, st.sampled_from(["+", "-", "*", "**", "<<", "|", "^", "&", " and ", " or ", " < ",
                                                 " is not ", " in "]), children).map(lambda t: f"({t[0]}){t[1]}({t[2]})")
            | st.tuples(st.sampled_from(["-", "~", "not "]), children).map(lambda t: f"{t[0]}({t[1]})")
            | st.lists(children, max_size=3).map(lambda xs: f"({', '.join(xs)}{',' if len(xs) == 1 else ''})")
            | st.lists(children, max_size=3).map(lambda xs: f"[{', '.join(xs)}]")
            | pair.map(lambda t: f"({t[0]})[{t[1]}]")
            | pair.map(lambda t: f"({t[0]})[{t[1]}, {t[0]}]")
            | children.map(lambda c: f"({c}).real")
            | pair.map(lambda t: f"f({t[0]}, *{t[1]}, k=({t[0]}))")
            | st.lists(children, min_size=2, max_size=4).map(lambda xs: " and ".join(f"({x})" for x in xs)))


@given(st.recursive(_leaves, _combine, max_leaves=10))
def test_text_prints_as_ast_unparse_prints_it(source):
    try:
        expected = ast.unparse(ast.parse(source, mode="eval"))
        term = parse(source)
    except (SyntaxError, ct.RewriteError):
        return  # not an expression cortado reads (a chained comparison, say)
    assert unparse(term) == expected
