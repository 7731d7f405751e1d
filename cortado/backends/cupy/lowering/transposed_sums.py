"""``sums_into_transposed``: a column sum of a value that a transposed kernel reads as rows (a float8 layer's bias
gradient, its optimizer's step in the sum's epilogue, beside the cast of that gradient to float8 written transposed)
joins that kernel, which reads every row of it anyway.

A bfloat16 product adds a bias's gradient in its GEMM's epilogue; a float8 product cannot, so a float8 layer's bias
gradient is a column reduction of its own, reading the whole gradient again (on the H100, 8192 rows of 3072 bfloat16:
about 50 us, where the cast kernel takes 38). Joined, each block of the cast kernel adds the columns of its tile's rows
into the workspace, and a second kernel adds those parts in order and runs the sum's epilogue
(``transposed_kernels.transposed_sum_sources``). The parts are of other rows than the column reduction's own, so a
sum may round otherwise, never by more than a reassociation of its terms; each is the same every run.

    roots = sums_into_transposed(roots, trace)   # after ``written_transposed``
"""

from ....exprgraph.dtypes import is_float
from ....exprgraph.graph import post_order
from ....exprgraph.ops import FUSED_OP, PAD, REDUCTION, SUM
from ....exprgraph.term import make
from ....rules.engine import Rewrite
from ....rules.fusion import (
    REDUCTION_KERNEL, TRANSPOSED_KERNEL, TRANSPOSED_SUMS_KERNEL, own_parameters, transposed_outputs, untransposed,
)
from ....rules.scalar_epilogues import Joining, appended, fused_kernels, substituted
from ..transposed_kernels import keeps_in_shared


def _column_sums(results):
    """The shape whose columns every reduction of fused kernel ``results`` sums over all its rows, of floating values
    (added in float32; one kernel, its epilogue per column); else None."""
    t = results[0]
    body = t.attr("outputs")
    if t.attr("kernel") != REDUCTION_KERNEL or t.attr("again") or len(results) != len(body):
        return None
    reductions = [s for s in post_order(body) if s.op.kind == REDUCTION]
    shape = reductions[0].args[0].shape
    if any(s.op is not SUM or s.args[0].shape != shape or s.attr("axes") != tuple(range(len(shape) - 1))
           or not is_float(s.dtype) for s in reductions):
        return None
    if any(s.op is PAD for red in reductions for s in post_order([red.args[0]])):
        return None
    return shape if len(shape) >= 2 and 0 not in shape and all(o.shape == shape[-1:] for o in body) else None


def _tiles_shape(results):
    """The shape a transposed kernel's rows are of; None for any other kernel."""
    t = results[0]
    if t.attr("kernel") != TRANSPOSED_KERNEL or t.attr("again") or len(results) != len(t.attr("outputs")):
        return None
    return untransposed(t.attr("outputs")[0]).shape


def _fits(tiles, sums):
    """Whether the transposed kernel of ``tiles`` keeps its tiles and the column sums of ``sums`` in shared memory."""
    turned = len(transposed_outputs(tiles.attr("outputs")))
    return keeps_in_shared(turned, [s for s in post_order(sums.attr("outputs")) if s.op.kind == REDUCTION])


def _apart(results):
    """``[(its results, a fused term of it alone)]``: each reduction of fused column sums ``results`` with the
    outputs that read it (sibling sums of two layers' bias gradients are one kernel, ``rules.fusion``), each over
    only the operands it reads; None where an output reads two of them."""
    t = results[0]
    body = t.attr("outputs")
    reductions = [s for s in post_order(body) if s.op.kind == REDUCTION]
    owners = []
    for o in body:
        mine = [j for j, red in enumerate(reductions) if red in set(post_order([o]))]
        if len(mine) != 1:
            return None
        owners.append(mine[0])
    parts = []
    for j in range(len(reductions)):
        own, read = own_parameters(tuple(o for o, k in zip(body, owners) if k == j))
        parts.append(([r for r, k in zip(results, owners) if k == j],
                      make(FUSED_OP, tuple(t.args[i] for i in read), (own, 0, False, REDUCTION_KERNEL))))
    return parts


def sums_into_transposed(roots, trace):
    """``roots`` with each column sum (a fused reduction, see ``_column_sums``; sibling sums taken apart) of values of
    a shape that a transposed kernel reads as rows joined to that kernel, where the sum reads no value of that shape
    that the kernel does not, and neither waits for the other's results (nor, through the joins before it, for its
    own: ``Joining``); a sum of a kernel of several that joins none stays a reduction of its own."""
    roots = tuple(roots)
    kernels, _ = fused_kernels(roots)
    by_shape = {}
    for key, results in kernels.items():
        shape = _tiles_shape(results)
        if shape is not None:
            by_shape.setdefault(shape, []).append(key)
    replaced, taken, joining = {}, set(), Joining()
    for results in kernels.values():
        shape = _column_sums(results)
        parts = _apart(results) if shape is not None else None
        joins = {}
        for k, (old, sums) in enumerate(parts or ()):
            wide = {a for a in sums.args if a.shape == shape}
            for tkey in by_shape.get(shape, ()) if wide else ():
                tiles = kernels[tkey]
                if tkey in taken or not wide <= set(tkey[0]) or not _fits(tiles[0], sums):
                    continue
                if not joining.accept((old, sums.args), (tiles, tkey[0])):
                    continue
                joins[k] = appended(tkey, tiles, sums, old, TRANSPOSED_SUMS_KERNEL)
                taken.add(tkey)
                trace.append(Rewrite("column-sum-into-transposed", results[0], joins[k][old[0]]))
                break
        for k, (old, sums) in enumerate(parts if joins else ()):
            apart = {t: make(FUSED_OP, sums.args, (sums.attr("outputs"), j, False, REDUCTION_KERNEL))
                     for j, t in enumerate(old)}
            replaced.update(joins.get(k, apart))
    return substituted(roots, replaced) if replaced else roots
