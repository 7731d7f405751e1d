"""Guards and replacement helpers that rule sets share: predicates over a match's bindings.

Each works on tensor and text matches alike, asking the match's domain what a constant is; the
tensor-only ones (shapes, dtypes) are simply false on text, where there are none.
"""

import numpy as np

from ..exprgraph.dtypes import is_float
from ..exprgraph.term import Term


def constants(*names):
    """Guard: every named binding is a constant."""
    return lambda b: all(b.domain.is_constant(b[name]) for name in names)


def all_of(*guards):
    return lambda b: all(guard(b) for guard in guards)


def not_constant(name):
    """Guard: the named binding is not a constant."""
    return lambda b: not b.domain.is_constant(b[name])


def same_type(name):
    """Guard: the named binding has the matched term's shape and dtype (tensors only)."""

    def guard(b):
        value = b[name]
        return isinstance(value, Term) and value.shape == b.term.shape and value.dtype == b.term.dtype

    return guard


def negated_as_the_result(*names):
    """Guard for moving a negation out of the named bindings into the op that reads them (``x - (-y)`` to ``x + y``):
    each negated operand has the result's dtype or is a float. An integer of a narrower dtype is negated where it is,
    wrapping there (int8 ``-(-128)`` is -128; uint8 ``-1`` is 255) before the op widens it; text stands for reals."""

    def guard(b):
        if not isinstance(b.term, Term):
            return True
        return all(b[name].dtype == b.term.dtype or is_float(b[name].dtype) for name in names)

    return guard


def signed_zero_kept(position, negative):
    """Guard for dropping the zero at operand ``position`` of the matched op (``x + 0`` to ``x``, ``0 - x`` to
    ``-x``): the result keeps the sign of every zero only where the zero dropped is ``-0.0`` (``negative``: ``x +
    -0.0`` is ``x`` for every ``x``, ``-0.0 - x`` is ``-x``) or ``+0.0`` (``x - 0.0`` is ``x``), or where the other
    operand and the result cannot hold a negative zero: integers, booleans, and text, whose symbols stand for reals.
    Else ``-0.0 + 0.0`` is ``+0.0`` where ``x`` is ``-0.0``, and ``1 / x`` an infinity of the other sign."""

    def guard(b):
        t = b.term
        if not isinstance(t, Term) or not is_float(t.dtype) or not is_float(t.args[1 - position].dtype):
            return True
        return bool(np.signbit(t.args[position].attr("value").scalar)) == negative

    return guard


def exact_for_every_input(b):
    """Guard for rewrites that are exact only without inf and nan (``x * 0`` is 0): integer and
    boolean tensors, and untyped text, whose symbols stand for finite numbers."""
    return not isinstance(b.term, Term) or b.term.dtype.kind in "biu"


def floating(name):
    """Guard: the named binding is a floating tensor, or text (whose symbols stand for reals).

    Stability rules need it: on integers ``1 + x`` and ``-x`` wrap around, so ``log(1 + x)`` is
    not ``log1p(x)`` there.
    """
    return lambda b: not isinstance(b[name], Term) or is_float(b[name].dtype)
