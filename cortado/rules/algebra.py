"""``algebra``: the identities of + - * / **, constant folding and collecting, layout algebra.

Every rule gives every input the value the written form gives, the sign of a zero included (``1 / x`` tells
``+0.0`` from ``-0.0``), up to rounding:

- collecting constants (``3*(2*x)`` to ``6*x``) fires only where no value can change: integers and
  booleans (their arithmetic wraps, so any grouping gives the same bits), and float products whose
  folded constant is exact, whose inner constant is a power of two and whose two constants scale
  the same way (both at least 1 in magnitude, or both at most 1): both forms then round the one
  exact product once (or, all at most 1, differ by a unit in the subnormals' last place), and
  neither overflows where the other does not. Float sums are never regrouped;
- a float ``x + 0`` becomes ``x`` only where the zero is ``-0.0`` (``-0.0 + 0.0`` is ``+0.0``), ``x - 0`` only
  where it is ``+0.0``, ``0 - x`` becomes ``-x`` only for ``-0.0``, and ``-(x - y)`` stays (``-(x - x)`` is
  ``-0.0``, ``y - x`` then ``+0.0``); integers and text take them all.

A negation moves into the op that reads it (``x - (-y)`` to ``x + y``) only where the negated operand has the
result's dtype or is a float: a narrower integer wraps where it is negated (int8 ``-(-128)`` is -128), before the
op widens it.

``x - x`` becomes zeros for integers and booleans only (an infinite or nan float gives nan).
``fast_math``, a separate rule set that ``compile(..., fast_math=True)`` adds, regroups float sums
and products, takes ``x - x`` as 0 whatever ``x`` holds, and counts ``+0.0`` and ``-0.0`` as one value, as
PyTensor and XLA do by default.

A constant of one value broadcast against other operands is written as that one value (a 0-d
constant). An identity whose operand must be broadcast or cast to stand for the term (``1 * s``
with a scalar ``s`` in a matrix's shape) becomes that ``broadcast_to`` or ``cast``; otherwise
tensor rewrites keep shape and dtype. ``where`` with a constant condition is the branch it picks.
``x + x`` becomes ``2 * x``, exact in every dtype. An einsum operand of ones that stretches no
axis is dropped, and a one-operand einsum that only permutes axes is a transpose.

``x * 0`` becomes zeros only for integers and booleans (and text), since ``inf * 0`` is nan.
``exp`` and ``log`` pairs are rewritten only where the identity has no domain restriction:
``log(exp(x))`` is ``x`` for every real ``x``, and in floating point the rewritten form is the
accurate one where ``exp`` overflows or underflows; ``exp(log(x))`` is not ``x`` for ``x < 0``
and stays. Constant-only terms fold (with exactly what the reference interpreter computes) when
the result has at most 65536 elements or is one value broadcast.

The rules are data: text patterns, with a function where the replacement needs arithmetic on
attributes. They apply to text too, so ``simplify("2 * (3 * x) + 0")`` is ``"6 * x"``.
"""

import math
from fractions import Fraction

import numpy as np

from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float
from ..exprgraph.ops import CONST, MATMUL, TRANSPOSE
from ..exprgraph.term import Term
from .engine import Rule, RuleSet
from .guards import (
    all_of, constants, exact_for_every_input, negated_as_the_result, not_constant, same_type, signed_zero_kept,
)
from .text import literal_value


def _fold(b):
    return b.domain.fold(b.term)


def _standing_for(b, x):
    """``x`` made to stand for the matched term: itself, or broadcast to the term's shape, or
    cast to its dtype (never both: simplify does not add work). None where neither will do."""
    term = b.term
    if not isinstance(x, Term) or (x.shape, x.dtype) == (term.shape, term.dtype):
        return x
    if x.dtype == term.dtype:
        return ct.broadcast_to(x, term.shape)  # a ShapeError here means the rule does not apply
    if x.shape == term.shape:
        return ct.cast(x, term.dtype)
    return None


def _identity(name):
    """The replacement of an identity such as ``1 * x``: ``x``, as it can stand for the term."""
    return lambda b: _standing_for(b, b[name])


def _where_constant(b):
    """``where`` with a condition of one truth value: the branch it picks."""
    condition = b["_c"]
    try:
        value = condition.attr("value").scalar if isinstance(condition, Term) else literal_value(condition)
    except ValueError:
        return None
    if value is None:
        return None  # a constant whose elements differ
    return _standing_for(b, b["_x"] if bool(value) else b["_y"])


def _scalar_splats(b):
    """An elementwise op's one-value constant operands as 0-d constants, where the other operands
    give the result its shape anyway: ``multiply(full(6.0), x)`` is ``multiply(6.0, x)``."""
    term = b.term
    if not isinstance(term, Term) or not term.op.elementwise:
        return None
    splats = [a.op is CONST and a.ndim > 0 and a.attr("value").scalar is not None for a in term.args]
    if not any(splats) or all(splats):
        return None
    args = [ct.const(a.attr("value").scalar) if splat else a for a, splat in zip(term.args, splats)]
    return term.rebuild(args)


def _folded(b, op, left, right):
    """``left op right`` of two constants folded now, where the fold computes as the written form would (both of the
    result's dtype) and is finite (an overflow that the written grouping avoids is not baked in); else None."""
    if isinstance(b["_x"], Term) and not left.dtype == right.dtype == b.term.dtype:
        return None
    folded = b.domain.fold(b.domain.build(op, [left, right], {}))
    return folded if folded is not None and b.domain.is_finite(folded) else None


def _collect_difference(b):
    """``(b + x) - a`` as ``(b - a) + x``, ``b - a`` folded now (``_folded``): ``collect-sums-fast`` for a
    constant subtracted."""
    folded = _folded(b, "-", b["_b"], b["_a"])
    return None if folded is None else b.domain.build("+", [folded, b["_x"]], {})


def _collect(op, regroups=lambda op, a, c, folded: True):
    """``a op (b op x)`` as ``c op x``, ``c`` being ``a op b`` folded now (``_folded``), where ``regroups`` says the
    new grouping gives every ``x`` the value the written one gives."""

    def replace(b):
        a, c, x = b["_a"], b["_b"], b["_x"]
        folded = _folded(b, op, a, c)
        if folded is None or (isinstance(x, Term) and not regroups(op, a, c, folded)):
            return None
        return b.domain.build(op, [folded, x], {})

    return replace


def _regroups_exactly(op, a, c, folded):
    """Whether ``a op (c op x)`` and ``folded op x`` give every ``x`` the same value: integer and
    boolean arithmetic wraps, so it regroups exactly; a float sum never does (``(x + 1e8) - 1e8``
    is not ``x``); a float product does where ``folded`` is ``a * c`` exactly, the inner ``c`` is a
    power of two (or 0), so that ``c * x`` is exact but where it overflows or lands among the
    subnormals, and ``a`` scales the same way as ``c`` (both at least 1 in magnitude, or both at
    most 1), so that ``c * x`` overflows only where ``folded * x`` does too (``(x * 1e30) * 1e-30``
    overflows, ``x`` does not). Then both forms round the one exact product once, the same way,
    or (all at most 1) differ by a unit of the subnormals' last place."""
    if folded.dtype.kind in "biu":
        return True
    if op != "*":
        return False
    a, c, folded = (_values(t) for t in (a, c, folded))
    if not _exact_product(a, c, folded):
        return False
    a, c = (np.abs(np.asarray(v, np.float64)) for v in (a, c))
    powers_of_two = (np.frexp(c)[0] == 0.5) | (c == 0)
    return bool((powers_of_two & (((a >= 1) & (c >= 1)) | ((a <= 1) & (c <= 1)))).all())


def _values(constant):
    """A constant's elements as an array: its one element where all are equal (a constant of one
    value stands for any shape; its broadcast array is not expanded)."""
    value = constant.attr("value")
    return value.scalar if value.scalar is not None else value.array


def _exact_product(a, c, folded):
    """Whether every element of ``folded`` is the exact product of ``a``'s and ``c``'s: in float64
    for the narrower floats (their products fit 53 bits), as fractions for float64."""
    if folded.dtype.itemsize <= 4:
        return bool((a.astype(np.float64) * c.astype(np.float64) == folded.astype(np.float64)).all())
    shape = np.broadcast_shapes(a.shape, c.shape, folded.shape)
    if math.prod(shape) > _EXACT_CHECK_LIMIT:
        return False
    pairs = zip(*(np.broadcast_to(v, shape).ravel().tolist() for v in (a, c, folded)))
    return all(Fraction(x) * Fraction(y) == Fraction(z) for x, y, z in pairs)


_EXACT_CHECK_LIMIT = 4096  # float64 constants checked element by element as fractions, at most this many


def _permutation(value):
    """An axes attribute as a tuple of ints, whether bound from a tensor term or from text; None
    if it is no permutation (text may say anything)."""
    try:
        axes = value if isinstance(value, tuple) else tuple(literal_value(value))
    except (ValueError, TypeError):
        return None
    if sorted(a for a in axes if type(a) is int) != list(range(len(axes))):
        return None
    return axes


def _compose_transposes(b):
    inner, outer = _permutation(b["_p"]), _permutation(b["_q"])
    if inner is None or outer is None or len(inner) != len(outer):
        return None
    composed = tuple(inner[i] for i in outer)
    if composed == tuple(range(len(composed))):
        return b["_x"]
    return b.domain.build("transpose", [b["_x"]], {"axes": composed})


def _is_identity_permutation(b):
    axes = _permutation(b["_p"])
    return axes is not None and axes == tuple(range(len(axes)))


def _transposed_product(b):
    """``transpose(a @ b)`` over the last two axes as ``b^T @ a^T``: the same products summed for every element, so a
    product whose operands are stored transposed (a weight gradient, ``x @ W^T``'s) needs no transpose after it.
    Only for tensors, operands of two or more axes, a product read nowhere else (else it would be made twice), and an
    operand that is itself a transpose, which the new one composes with: else two transposes would take one's place."""
    product = b["_m"]
    if not isinstance(product, Term) or product.op is not MATMUL or b.shared(product):
        return None
    (x, y), axes = product.args, _permutation(b["_p"])
    if axes is None or min(x.ndim, y.ndim) < 2 or axes != _last_two_swapped(len(axes)):
        return None
    if not any(isinstance(a, Term) and a.op is TRANSPOSE for a in (x, y)):
        return None
    return ct.matmul(ct.transpose(y, _last_two_swapped(y.ndim)), ct.transpose(x, _last_two_swapped(x.ndim)))


def _last_two_swapped(ndim):
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def _sum_of_broadcast(b):
    """``sum(broadcast_to(x, S), A)`` as ``n * sum(x, A')`` when every stretched axis is summed.

    Declined where it would not pay: when the result would still need a broadcast or a reshape
    and a multiply, when the broadcast has other users (it would stay, and the multiply come on
    top), or when ``n`` is no exact value of the dtype. Where no sum is left (``n * x``, or ``x``), a
    float's ``+ 0.0`` stays, as a sum adds from ``+0.0``: the sum of copies of ``-0.0`` is ``+0.0``.
    """
    x, shape, axes, keepdims = b["_x"], b["_s"], b["_a"], b["_k"]
    if not isinstance(x, Term):
        return None
    lead = len(shape) - x.ndim
    padded = (1,) * lead + x.shape
    stretched = {i for i in range(len(shape)) if padded[i] != shape[i] or (i < lead and shape[i] != 1)}
    if not stretched <= set(axes):
        return None
    factor = math.prod(shape[i] for i in axes if i < lead or padded[i] != shape[i])
    if factor == 0:
        return 0  # a sum over nothing
    if factor != 1 and (b.shared(b.term.args[0]) or b.domain.full_like(b.term, factor) is None):
        return None
    own = tuple(i - lead for i in axes if i >= lead)
    result = x if not own and x.dtype == b.term.dtype else ct.sum(x, axis=own, keepdims=keepdims)
    if result.shape != b.term.shape:
        if factor != 1:
            return None  # sum, reshape and multiply would be more terms than the two we replace
        result = ct.reshape(result, b.term.shape)
    result = result if factor == 1 else factor * result
    return result + 0.0 if not own and is_float(b.term.dtype) else result


def _einsum_without_ones(b):
    """``einsum`` with an operand of ones dropped, where every label of that operand is carried,
    at full size, by another operand: then it neither adds an axis nor stretches one."""
    operands, subscripts = b["_xs"], b["_s"]
    if len(operands) < 2 or not all(isinstance(x, Term) for x in operands):
        return None
    inputs = subscripts.split("->")[0].split(",")
    for k, x in enumerate(operands):
        if x.op is not CONST or x.attr("value").scalar != 1 or "." in inputs[k]:
            continue
        others = [(labels, y) for j, (labels, y) in enumerate(zip(inputs, operands)) if j != k]
        carried = {label: size for labels, y in others if "." not in labels for label, size in zip(labels, y.shape)}
        if all(carried.get(label) == size for label, size in zip(inputs[k], x.shape)):
            return ct.einsum(",".join(labels for labels, _ in others) + "->" + subscripts.split("->")[1],
                             *(y for _, y in others))
    return None


def _einsum_as_transpose(b):
    """A one-operand einsum that only permutes axes (no diagonal, no sum): a transpose, or nothing."""
    operands, subscripts = b["_xs"], b["_s"]
    if len(operands) != 1 or not isinstance(operands[0], Term):
        return None
    source, target = subscripts.split("->")
    if "." in source or len(set(source)) != len(source) or sorted(source) != sorted(target):
        return None
    axes = tuple(source.index(label) for label in target)
    return operands[0] if axes == tuple(range(len(axes))) else ct.transpose(operands[0], axes)


# why a guarded rewrite was not made, for explain() (``Rule``'s ``declined``)
NOT_FINITE = "kept: a float may be infinite or NaN there, where the rewrite changes the value"
FAST = "; fast_math=True makes it"
ZERO_SIGN = "kept: it would change the sign of a zero result" + FAST

# the markers only a gradient reads, which a compiled program computes as their operand (its gradients are taken);
# gradients themselves keep them, since a gradient may be differentiated again (ct.hvp, a gradient penalty), where
# stop_gradient(x) taken out as x gave a wrong Hessian
gradient_markers = RuleSet([
    Rule("stop-gradient", "stop_gradient(_x)", _identity("_x")),
    Rule("float8-gradient", "float8_gradient(_x, *_history, dtype=_d)", _identity("_x")),
])

algebra = RuleSet([
    Rule("fold-constants", "_e", _fold),
    Rule("scalar-constants", "_e", _scalar_splats),
    gradient_markers,
    Rule("add-zero", "0 + _x", _identity("_x"), guard=signed_zero_kept(0, negative=True), declined=ZERO_SIGN),
    Rule("add-zero-right", "_x + 0", _identity("_x"), guard=signed_zero_kept(1, negative=True), declined=ZERO_SIGN),
    Rule("subtract-zero", "_x - 0", _identity("_x"), guard=signed_zero_kept(1, negative=False), declined=ZERO_SIGN),
    Rule("zero-minus", "0 - _x", "-_x", guard=signed_zero_kept(0, negative=True), declined=ZERO_SIGN),
    Rule("multiply-one", "1 * _x", _identity("_x")),
    Rule("multiply-one-right", "_x * 1", _identity("_x")),
    Rule("multiply-zero", "0 * _x", "0", guard=exact_for_every_input, declined=NOT_FINITE),
    Rule("multiply-zero-right", "_x * 0", "0", guard=exact_for_every_input, declined=NOT_FINITE),
    Rule("divide-one", "_x / 1", _identity("_x")),
    Rule("constant-first-add", "_x + _c", "_c + _x", guard=all_of(constants("_c"), not_constant("_x"))),
    Rule("constant-first-multiply", "_x * _c", "_c * _x", guard=all_of(constants("_c"), not_constant("_x"))),
    Rule("power-one", "_x ** 1", _identity("_x")),
    Rule("power-zero", "_x ** 0", "1"),
    Rule("double-negation", "-(-_x)", "_x"),
    Rule("subtract-negative", "_x - (-_y)", "_x + _y", guard=negated_as_the_result("_y")),
    Rule("add-negative", "_x + (-_y)", "_x - _y", guard=negated_as_the_result("_y")),
    Rule("negative-plus", "(-_x) + _y", "_y - _x", guard=negated_as_the_result("_x")),
    Rule("negate-difference", "-(_x - _y)", "_y - _x", guard=exact_for_every_input,
         declined="kept: -(x - y) is -0.0 where x equals y" + FAST),
    Rule("negative-product", "(-_x) * (-_y)", "_x * _y", guard=negated_as_the_result("_x", "_y")),
    Rule("self-difference", "_x - _x", "0", guard=exact_for_every_input, declined=NOT_FINITE + FAST),
    Rule("self-sum", "_x + _x", "2 * _x"),
    Rule("collect-sums", "_a + (_b + _x)", _collect("+", _regroups_exactly), guard=constants("_a", "_b")),
    Rule("collect-products", "_a * (_b * _x)", _collect("*", _regroups_exactly), guard=constants("_a", "_b")),
    Rule("log-exp", "log(exp(_x))", "_x", guard=exact_for_every_input),  # exp overflows, or rounds to 1
    Rule("log1p-expm1", "log1p(expm1(_x))", "_x", guard=exact_for_every_input),
    Rule("where-same", "where(_c, _x, _x)", _identity("_x")),
    Rule("where-constant", "where(_c, _x, _y)", _where_constant, guard=constants("_c")),
    Rule("transpose-transpose", "transpose(transpose(_x, axes=_p), axes=_q)", _compose_transposes),
    Rule("transpose-identity", "transpose(_x, axes=_p)", "_x", guard=_is_identity_permutation),
    Rule("transpose-of-product", "transpose(_m, axes=_p)", _transposed_product),
    Rule("reshape-reshape", "reshape(reshape(_x, shape=_s), shape=_t)", "reshape(_x, shape=_t)"),
    Rule("reshape-identity", "reshape(_x, shape=_s)", "_x", guard=same_type("_x")),
    Rule("broadcast-broadcast", "broadcast_to(broadcast_to(_x, shape=_s), shape=_t)", "broadcast_to(_x, shape=_t)"),
    Rule("broadcast-identity", "broadcast_to(_x, shape=_s)", "_x", guard=same_type("_x")),
    Rule("cast-identity", "cast(_x, dtype=_d)", "_x", guard=same_type("_x")),
    Rule("sum-of-broadcast", "sum(broadcast_to(_x, shape=_s), axis=_a, keepdims=_k)", _sum_of_broadcast),
    Rule("einsum-ones", "einsum(*_xs, subscripts=_s)", _einsum_without_ones),
    Rule("einsum-transpose", "einsum(*_xs, subscripts=_s)", _einsum_as_transpose),
], name="algebra")

fast_math = RuleSet([
    Rule("self-difference-fast", "_x - _x", "0"),
    Rule("add-zero-fast", "0 + _x", _identity("_x")),
    Rule("add-zero-right-fast", "_x + 0", _identity("_x")),
    Rule("subtract-zero-fast", "_x - 0", _identity("_x")),
    Rule("zero-minus-fast", "0 - _x", "-_x"),
    Rule("negate-difference-fast", "-(_x - _y)", "_y - _x"),
    Rule("difference-collected-fast", "(_b + _x) - _a", _collect_difference, guard=constants("_a", "_b")),
    Rule("collect-sums-fast", "_a + (_b + _x)", _collect("+"), guard=constants("_a", "_b")),
    Rule("collect-products-fast", "_a * (_b * _x)", _collect("*"), guard=constants("_a", "_b")),
], name="fast_math")
"""What ``compile(..., fast_math=True)`` adds to ``algebra``: rewrites that can change a float
result by more than rounding. ``x - x`` is 0 even where ``x`` is inf or nan; constants are
collected whatever the grouping did in ``a + (b + x)``, ``a * (b * x)`` and ``(b + x) - a`` (``(x + 1e8) - 1e8``
becomes ``x``, ``(x * 1e30) * 1e-30`` does not overflow), as ``-ffast-math`` lets a C compiler."""
