"""``canonical``: the normal form later lowering expects.

Contractions that are one (batched) GEMM are ``matmul`` with transposes around them, so lowering
to cuBLAS needs to recognise one op; ``maximum(x, 0)`` is ``relu``, the epilogue cuBLASLt fuses;
a float32 or float64 ``mean`` is a ``sum`` divided by the count, exactly as NumPy computes it,
so the backends implement one reduction; ``x ** 2`` is ``x * x``, which needs no pow. As in
``algebra``, +0.0 and -0.0 count as equal (``maximum(0, -0.0)`` is +0.0, ``relu(-0.0)`` -0.0).
"""

import math

from ..exprgraph import constructors as ct
from ..exprgraph.term import Term
from .engine import Rule, RuleSet


def _mean_as_sum(b):
    x = b["_x"]
    if not isinstance(x, Term) or x.dtype.name not in ("float32", "float64"):
        return None  # float16 and bfloat16 means divide in float32 and round once; sum / n would round twice
    count = math.prod(x.shape[a] for a in b["_a"])
    return ct.sum(x, axis=b["_a"], keepdims=b["_k"]) / count


def _gemm_roles(subscripts):
    """For ``"ab,bc->ac"``-like subscripts: (batch, m, n, k) labels, or None if it is no GEMM."""
    inputs, output = subscripts.split("->")
    left, right = inputs.split(",") if "," in inputs else (None, None)
    if left is None or len(set(left)) != len(left) or len(set(right)) != len(right):
        return None
    batch = [c for c in output if c in left and c in right]
    m = [c for c in left if c in output and c not in right]
    n = [c for c in right if c in output and c not in left]
    k = [c for c in left if c in right and c not in output]
    if len(m) != 1 or len(n) != 1 or len(k) != 1 or len(batch) + 2 != len(output):
        return None
    if len(left) != len(batch) + 2 or len(right) != len(batch) + 2:
        return None  # a label summed in one operand only is no GEMM
    return "".join(batch), m[0], n[0], k[0]


def _einsum_as_matmul(b):
    operands = b["_xs"]
    if len(operands) != 2 or not all(isinstance(x, Term) for x in operands):
        return None
    subscripts = b["_s"]
    roles = _gemm_roles(subscripts)
    if roles is None:
        return None
    batch, m, n, k = roles
    left, right = subscripts.split("->")[0].split(",")
    output = subscripts.split("->")[1]
    if operands[0].shape[left.index(k)] != operands[1].shape[right.index(k)]:
        return None  # einsum broadcasts a size-1 contraction; matmul does not

    def arranged(term, labels, order):
        perm = tuple(labels.index(c) for c in order)
        return term if perm == tuple(range(len(perm))) else ct.transpose(term, perm)

    product = ct.matmul(arranged(operands[0], left, batch + m + k), arranged(operands[1], right, batch + k + n))
    return arranged(product, batch + m + n, output)


canonical = RuleSet([
    Rule("square", "_x ** 2", "_x * _x"),
    Rule("relu", "maximum(_x, 0)", "relu(_x)"),
    Rule("relu-left", "maximum(0, _x)", "relu(_x)"),
    Rule("mean-as-sum", "mean(_x, axis=_a, keepdims=_k)", _mean_as_sum),
    Rule("einsum-as-matmul", "einsum(*_xs, subscripts=_s)", _einsum_as_matmul),
], name="canonical")
