"""Guards and replacement helpers that rule sets share: predicates over a match's bindings.

Each works on tensor and text matches alike, asking the match's world what a constant is; the
tensor-only ones (shapes, dtypes) are simply false on text, where there are none.
"""

from ..exprgraph.term import Term
from .matching import instantiate
from .patterns import as_pattern


def constants(*names):
    """Guard: every named binding is a constant."""
    return lambda b: all(b.world.is_constant(b[name]) for name in names)


def all_of(*guards):
    return lambda b: all(guard(b) for guard in guards)


def not_constant(name):
    """Guard: the named binding is not a constant."""
    return lambda b: not b.world.is_constant(b[name])


def same_type(name):
    """Guard: the named binding has the matched term's shape and dtype (tensors only)."""

    def guard(b):
        value = b[name]
        return isinstance(value, Term) and value.shape == b.term.shape and value.dtype == b.term.dtype

    return guard


def exact_for_every_input(b):
    """Guard for rewrites that are exact only without inf and nan (``x * 0`` is 0): integer and
    boolean tensors, and untyped text, whose symbols stand for finite numbers."""
    return not isinstance(b.term, Term) or b.term.dtype.kind in "biu"


def folding(replacement):
    """A replacement function: ``replacement`` built from the bindings with the constant parts
    it creates folded at once (``(_a * _b) * _x`` with numbers for ``_a`` and ``_b``: ``6 * x``)."""
    pattern = as_pattern(replacement)
    return lambda b: instantiate(pattern, b, b.world, fold=True)
