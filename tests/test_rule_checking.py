"""``ct.rules.check`` finds the values a rule changes, on every combination of each dtype's hard values, and passes
the rules that keep them: the built-in algebra in every dtype, where fast_math's rules each change one."""

import numpy as np

import cortado as ct
from cortado.rules import Rule, check


def test_a_rule_that_changes_values_is_caught_with_the_inputs_that_show_it():
    report = check([Rule("sqrt-square", "sqrt(_a * _a)", "_a"), Rule("divide-self", "_a / _a", "1"),
                    Rule("commute", "_a * _b", "_b * _a")])
    assert not report and report.checked == ["sqrt-square", "divide-self", "commute"]
    found = {f.rule: f for f in report.failures}
    assert set(found) == {"sqrt-square", "divide-self"}
    square = found["sqrt-square"]  # the largest change shown: an overflow the rewrite hides, or a negative
    assert square.dtype == "float32" and (np.isinf(square.expected) or square.expected == -square.got)
    divided = found["divide-self"]
    assert np.isnan(divided.expected) and divided.got == 1  # 0 / 0, or an infinity over itself
    assert str(divided).startswith("divide-self changes float32 values: _a = ")


def test_the_sign_of_a_zero_counts():
    report = check(Rule("add-zero-anyway", "0 + _x", "_x"), dtypes=("float32",))
    (failure,) = report.failures
    assert failure.inputs == {"_x": np.float32(-0.0)} and np.signbit(failure.got) and not np.signbit(failure.expected)


def test_the_built_in_algebra_keeps_every_value_in_every_dtype_and_fast_math_does_not():
    dtypes = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool")
    report = check(ct.rules.algebra, dtypes=dtypes)
    assert not report.failures, str(report)
    assert not report  # a rule skipped (attributes) is no rule shown right: the report is no pass
    assert {"add-zero", "subtract-zero", "zero-minus", "collect-products", "self-difference"} <= set(report.checked)
    assert report.skipped["transpose-transpose"] == "attributes"
    fast = check(ct.rules.fast_math)
    assert set(fast.checked) == {r.name for r in ct.rules.fast_math}
    # each changes a value but x - 0, which does so only for a -0.0 constant: the pattern's 0 is +0.0
    assert {f.rule for f in fast.failures} == set(fast.checked) - {"subtract-zero-fast"}


def test_each_dtype_is_tried_at_its_own_extremes():
    """A rewrite that hides an overflow is caught at the dtype's largest value, whatever that is: 65504 in float16,
    about 3.4e38 in float32 and bfloat16, 1.8e308 in float64."""
    for rule in (Rule("times-four-over-four", "(_x * 4) / 4", "_x"), Rule("halve-sum", "(_x + _y) / 2", "_x / 2 + _y / 2")):
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            (failure,) = check(rule, dtypes=(dtype,)).failures
            assert np.isinf(failure.expected) and np.isfinite(failure.got), str(failure)


def test_integer_operands_with_floating_results_are_compared_as_floats():
    """``log`` of an int32 is a float: NaN for NaN and a rounding's difference are the same value there."""
    report = check(Rule("log-quarter", "log(_x / 4)", "log(_x * 0.25)"), dtypes=("int32", "int64"))
    assert report, str(report)


def test_rules_over_terms_that_combine_elements_are_tried_on_vectors_of_their_own():
    """A sum of one vector holding every hard value was NaN or infinite on both sides, so rules over reductions
    passed whatever they did: each case is now a vector of its own. Operands of other shapes are tried too: on
    vectors alone a dot product commutes, so a rule swapping a product's operands passed."""
    report = check([Rule("lse-max", "logsumexp(_x)", "max(_x)"), Rule("mean-sum", "mean(_x)", "sum(_x)"),
                    Rule("sum-scale", "sum(_x * 2)", "2 * sum(_x)"), Rule("dot-commutes", "_a @ _b", "_b @ _a")],
                   dtypes=("float32",))
    found = {f.rule: f for f in report.failures}
    assert set(found) == {"lse-max", "mean-sum", "sum-scale", "dot-commutes"}
    assert found["dot-commutes"].inputs["_a"].shape == (3, 3)  # vectors' dot product commutes; matrices' does not
    mean = found["mean-sum"]
    assert mean.inputs["_x"].shape == (4,) and mean.expected == mean.inputs["_x"].mean()
    assert str(mean).startswith("mean-sum changes float32 values: _x = [")


def test_a_rule_whose_replacement_builds_no_term_is_reported_beside_the_others():
    report = check([Rule("max-negated", "max(-_x)", "-min(_x)"), Rule("times-one", "_x * 1", "_x")])
    assert report.checked == ["times-one"]
    assert report.skipped["max-negated"].startswith("it fits no tensor term: 'min' is no cortado op")


def test_a_wrong_identity_under_a_sum_is_caught_across_its_variables():
    """The per-case vectors paired each variable's hard values with neighbours only: x = 0 never met y = 1e-45."""
    report = check(Rule("sum-div-as-mul", "sum(_x / _y)", "sum(_x * (1 / _y))"), dtypes=("float32",))
    assert [f.rule for f in report.failures] == ["sum-div-as-mul"], str(report)


def test_a_rule_of_constants_alone_and_one_that_takes_no_short_vector():
    from cortado.rules.guards import constants

    (failure,) = check(Rule("sum-const", "sum(_c)", "_c", guard=constants("_c")), dtypes=("float32",)).failures
    assert failure.inputs == {"_c": np.float32(-0.0)}  # NumPy's sum starts from +0.0
    longer = check(Rule("sum-as-max", "sum(_x)", "max(_x)", guard=lambda b: b["_x"].ndim and b["_x"].shape[0] > 8))
    assert not longer.checked and "applies to none" in longer.skipped["sum-as-max"]  # said, not passed
