"""Turning what users pass to an op into terms, with NumPy 2's rules for Python scalars.

A Python ``int`` or ``float`` operand (or a ``ct.const`` made from one) is *weak* (NEP 50): it
takes the dtype of what it meets, so ``x * 2.0`` stays float32. It stays a ``Scalar`` until the
op's dtype is settled and only then becomes a constant term of that dtype. NumPy arrays, NumPy
scalars and lists are strong, as in NumPy.
"""

import numpy as np

from .dtypes import SUPPORTED
from .ops import CONST, Constant
from .term import Identity, RuleViolation, Term, dtype_violation, make, rejection

WEAK_TYPES = (int, float)


class Scalar:
    """A Python scalar operand whose dtype is still open."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    @property
    def promotion_key(self):
        """What NumPy's dtype resolution takes for it: the Python type (bool is never weak)."""
        return type(self.value) if type(self.value) in WEAK_TYPES else np.dtype(bool)

    def __repr__(self):
        return repr(self.value)


def is_weak_const(term):
    return term.op is CONST and term.attr("value").weak


def const_array(value, dtype=None):
    """``value`` as a read-only-able array of a supported dtype, or a RuleViolation saying why not."""
    try:
        array = np.asarray(value, dtype=dtype)
    except OverflowError as error:
        message = str(error)
        if type(value) is int:  # NumPy's own words, whichever check of NumPy's caught it
            message = f"Python integer {value} out of bounds for {np.dtype(dtype).name}"
        raise dtype_violation(message) from None
    except (TypeError, ValueError) as error:
        raise dtype_violation(f"cannot make a tensor of {type(value).__name__} {value!r}: {error}") from None
    if array.dtype not in SUPPORTED:
        if isinstance(value, int) and not isinstance(value, bool):
            raise dtype_violation(f"the Python int {value} fits in neither int64 nor uint64")
        raise dtype_violation(
            f"cannot make a tensor of {type(value).__name__} {value!r} (its dtype would be {array.dtype}, "
            f"which cortado does not support)"
        )
    return array


def strong_const(value, dtype=None):
    return make(CONST, (), (Constant(const_array(value, dtype)),))


def operand(value):
    """A term, or a ``Scalar`` for a weak Python scalar; raises RuleViolation for non-tensors."""
    if isinstance(value, Term):
        return Scalar(value.attr("value").array.item()) if is_weak_const(value) else value
    if type(value) in WEAK_TYPES or type(value) is bool:
        return Scalar(value)
    return strong_const(value)


def operands(op_name, values):
    """Every value as an operand; a value that is no tensor is refused, naming the op, and so is what ``==`` or
    ``!=`` between two terms gives (``Identity``: ``where(x == y, ...)`` would have chosen by the terms' identity)."""
    result = []
    for value in values:
        if isinstance(value, Identity):
            raise rejection(op_name, [*result], dtype_violation(
                f"an operand is {value!r}, which == or != between two terms gives: they compare the terms "
                f"themselves (terms are dict keys); ct.equal(x, y) and ct.not_equal(x, y) compare their elements"))
        try:
            result.append(operand(value))
        except RuleViolation as violation:
            raise rejection(op_name, [*result, value], violation) from None
    return result


def materialise(x, dtype, op_name, all_operands):
    """A ``Scalar`` as a constant term of ``dtype`` (terms pass through); out-of-range ints refused."""
    if isinstance(x, Term):
        return x
    try:
        return strong_const(x.value, dtype)
    except RuleViolation as violation:
        raise rejection(op_name, all_operands, violation) from None


def at_default_dtypes(op_name, all_operands):
    """Every ``Scalar`` at the dtype NumPy gives it alone (float64, int64, bool)."""
    return [materialise(x, None, op_name, all_operands) for x in all_operands]
