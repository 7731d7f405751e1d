"""``written_transposed``: a float8 product's operand that is the transpose of a kernel's float8 result is written
transposed by that kernel, instead of copied by the product's call.

cuBLASLt multiplies float8 matrices only with the contracted axis innermost (``lowering/float8.py``), so a weight
gradient ``x8^T @ dy8`` of a float8 layer reads both its operands transposed, and an input gradient ``dy8 @ w8`` its
weight: a call copies such an operand into its workspace first, a read and a write of every element. The kernel that
casts the operand to float8 (its scale is a value the step computes, so the cast is a kernel of its own) writes it
transposed as well, for one more write and no copy; where nothing reads it in order, it writes it only transposed.
The values are the same: the same elements, stored in another order.

An elementwise kernel (a gradient's e5m2 cast) writes a tile at a time through shared memory (``transposed_kernels``).
A row kernel (a layer norm's float8 output, a weight's cast folding its rows' maxima) keeps a block of rows in
shared memory and writes them a column at a time (``row_kernels``), where they fit 24 KiB (rows of up to 1536
float8 values; longer ones stay copied by the call).

    roots = written_transposed(roots, trace)   # after fusion (``Backend.after_fusion``)
"""

import math

from ....exprgraph import constructors as ct
from ....exprgraph.graph import post_order, readers_of
from ....exprgraph.ops import FUSED_OP, TRANSPOSE
from ....exprgraph.term import make
from ....rules.engine import Rewrite
from ....rules.fusion import ELEMENTWISE_KERNEL, ROW_KERNEL, kernel_shape, row_shape, untransposed
from ....rules.scalar_epilogues import fused_kernels, kernel_key, substituted
from ..row_kernels import writes_rows_transposed
from ..transposed_kernels import writes_transposed
from .float8_op import FLOAT8_GEMM

MOST_TRANSPOSED = 2  # transposed results a kernel writes: each keeps a tile, or a block's rows, in shared memory


def _transposed_result(operand):
    """``(result, matrix)`` where ``operand`` is the transpose of ``matrix``, the float8 ``result`` of an elementwise
    kernel or a row kernel's result of its row shape (with its leading axes merged into rows, or a matrix itself),
    that its kernel can write transposed; else None."""
    if operand.op is not TRANSPOSE or operand.ndim != 2:
        return None
    matrix, result = operand.args[0], untransposed(operand)
    rows, cols = matrix.shape
    if (result.op is not FUSED_OP or result.attr("again") or result.ndim < 2 or result.shape[-1] != cols
            or math.prod(result.shape[:-1]) != rows):
        return None
    kind = result.attr("kernel")
    if kind == ROW_KERNEL and row_shape(result.attr("outputs")) == result.shape:
        return (result, matrix) if writes_rows_transposed(rows, cols, [result.dtype]) else None
    return (result, matrix) if kind == ELEMENTWISE_KERNEL and writes_transposed(rows, cols, result.dtype) else None


def _taken(operands):
    """The first of ``operands`` (``{transposed operand: (result, matrix)}`` of one kernel, never empty) that its
    kernel can write transposed together: ``MOST_TRANSPOSED``, and a row kernel's block of rows of each within its
    shared memory."""
    taken = list(operands.items())[:MOST_TRANSPOSED]
    _, (result, matrix) = taken[0]
    if result.attr("kernel") == ROW_KERNEL:
        while len(taken) > 1 and not writes_rows_transposed(*matrix.shape, [r.dtype for _, (r, _) in taken]):
            taken.pop()
    return dict(taken)


def _read_otherwise(t, operands, users, final):
    """Whether a root, or a term other than the transposes ``operands`` taken, reads result ``t`` (or the matrix it
    is, its leading axes merged)."""
    through = {m for r, m in operands.values() if r is t and m is not t}
    others = users.get(t, set()) - through - set(operands)
    return t in final or bool(others) or any(users.get(m, set()) - set(operands) for m in through)


def written_transposed(roots, trace):
    """``roots`` with each float8 product's operand that is the transpose of a kernel's float8 result written
    transposed by that kernel (see the module docstring); the result kept where others read it."""
    roots = tuple(roots)
    users = readers_of(post_order(roots))
    wanted = {}  # kernel key -> {transposed operand: (result, matrix)}
    for t in post_order(roots):
        if t.op is FLOAT8_GEMM:
            for operand in t.args[:2]:
                found = _transposed_result(operand)
                if found is not None:
                    wanted.setdefault(kernel_key(found[0]), {})[operand] = found
    if not wanted:
        return roots
    kernels, _ = fused_kernels(roots)
    final = set(roots)
    replaced = {}
    for key, operands in wanted.items():
        operands = _taken(operands)
        body, inputs = key[1], key[0]
        made = kernels[key]
        kept = sorted((t for t in made if _read_otherwise(t, operands, users, final)), key=lambda t: t.attr("index"))
        turned = [ct.transpose(body[r.attr("index")] if m is r else ct.reshape(body[r.attr("index")], m.shape))
                  for r, m in operands.values()]
        new_body = tuple(body[t.attr("index")] for t in kept) + tuple(turned)
        kind = kernel_shape(new_body)
        for j, t in enumerate(kept):
            replaced[t] = make(FUSED_OP, inputs, (new_body, j, False, kind))
        for j, operand in enumerate(operands, start=len(kept)):
            replaced[operand] = make(FUSED_OP, inputs, (new_body, j, False, kind))
            trace.append(Rewrite("float8-operand-written-transposed", operand, replaced[operand]))
    return substituted(roots, replaced)
