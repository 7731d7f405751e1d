"""Composite elementwise ops spelled out in primitives: the last rewrite before fusion, so no backend emits them.

``sigmoid``, ``softplus``, ``gelu``, ``gelu_grad`` and ``silu`` stay whole through differentiation, stabilisation and
lowering (a GEMM takes gelu as its epilogue, a derivative rule names gelu_grad), then each becomes its record's
``formula`` over the constructors: the formula the reference evaluates with NumPy, written once in ``numerics``.
Its operands are first cast to the dtype the op computes in (float32 for float16 and bfloat16 where the op says so,
else the op's own: a float for an integer), and the result to the op's dtype, as the reference rounds it. A
composite with no derivative rule of its own is differentiated through the same spelling (``rules.derivatives``).
"""

from ..exprgraph import constructors as ct
from ..exprgraph.ops import OPS
from .decompositions import cast_to
from .engine import Postwalk, Rule, RuleSet

COMPOSITES = tuple(op for op in OPS.values() if op.formula is not None)


def _computed_in(term):
    """The dtype ``term``'s op computes in: float32 where it computes its operands' dtypes so, else its result's."""
    narrow = term.op.computes_in_float32
    return "float32" if narrow is not None and any(narrow(a.dtype) for a in term.args) else term.dtype


def in_primitives(term, operands=None):
    """``term``, an op with a formula, written in primitives over its operands (or over ``operands`` in their place),
    each cast to the dtype the op computes in, the result to the op's dtype."""
    computed = _computed_in(term)
    operands = term.args if operands is None else operands
    return cast_to(term.op.formula(*(cast_to(a, computed) for a in operands), ct), term.dtype)


def _pattern(op):
    return f"{op.name}({', '.join(f'_{k}' for k in range(op.arity))})"


spell_out = RuleSet([Rule(f"spell-out-{op.name}", _pattern(op), lambda b: in_primitives(b.term)) for op in COMPOSITES],
                    name="primitives")
primitives = Postwalk(spell_out)  # one walk: what a rule writes holds no composite
