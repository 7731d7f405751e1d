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
    assert report, str(report)
    assert {"add-zero", "subtract-zero", "zero-minus", "collect-products", "self-difference"} <= set(report.checked)
    assert report.skipped["transpose-transpose"] == "attributes"
    fast = check(ct.rules.fast_math)
    assert set(fast.checked) == {r.name for r in ct.rules.fast_math}
    # each changes a value but x - 0, which does so only for a -0.0 constant: the pattern's 0 is +0.0
    assert {f.rule for f in fast.failures} == set(fast.checked) - {"subtract-zero-fast"}
