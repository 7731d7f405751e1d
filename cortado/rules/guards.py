"""Guards and replacement helpers that rule sets share: predicates over a match's bindings.

Each works on tensor and text matches alike, asking the match's domain what a constant is; the
tensor-only ones (shapes, dtypes) are simply false on text, where there are none.
"""

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
