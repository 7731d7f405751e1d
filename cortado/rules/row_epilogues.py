"""``into_producers``: a row max of a kernel's result (a float8 amax's first stage) joins the kernel that makes it.

A float8 layer takes the largest magnitude of its input, its weight and its gradient each step
(``maxima_in_two_stages``: a max of each row, then of the rows). Apart, each row max is a kernel reading back a
whole activation that the kernel before it has just written; joined, the kernel that writes the rows folds their
maxima as it writes them (a row kernel's pass, ``backends/cupy/row_kernels``: a reduction only outputs of one value a
row read costs no pass of its own), and a value that only the max read is no longer stored at all (a layer norm's
bfloat16 output, whose float8 copy is what the product reads).

Only a max joins: it is the same value in any order, so folding it elsewhere changes no bit. The max reads what a
reader of the stored value would: a bfloat16 result rounded as it is stored (``_as_stored``).

A row max of a value no kernel of ours makes, or none that may fold it (an attention's output; a concatenation,
whose kernel reads shifted operands), joins instead a sibling: an elementwise kernel reading that value as rows (a
float8 cast at a delayed scale), which then folds the maxima of the rows it reads (``into_siblings``).

    roots = into_producers(roots, trace)   # after ``fusion.fuse``, for a backend that declares ``horizontal``
    roots = into_siblings(roots, trace)
"""

from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_narrow_float
from ..exprgraph.graph import post_order, readers_of
from ..exprgraph.ops import CAST, FUSED_OP, MAX, PAD
from ..exprgraph.term import make
from .engine import Rewrite
from .fusion import ELEMENTWISE_KERNEL, REDUCTION_KERNEL, ROW_KERNEL, kernel_shape, rebased, row_reduction, row_shape
from .scalar_epilogues import Joining, appended, fused_kernels, kernel_key, substituted


def _as_stored(t):
    """Body term ``t`` as a reader of its stored value sees it: a float16/bfloat16 value rounded (a kernel computes
    them in float32 and rounds only where it stores or casts)."""
    return ct.cast(t, t.dtype) if is_narrow_float(t.dtype) and t.op is not CAST else t


def into_producers(roots, trace):
    """``roots`` with each fused reduction that is one ``max`` over the last axis of a row or elementwise kernel's
    result (a float8 amax's first stage) joined to that kernel, its rows reduced where they are made instead of
    read back; the kernel's results kept where others read them. Only a max: it is the same bits in any order."""
    roots = tuple(roots)
    kernels, position = fused_kernels(roots)
    users = readers_of(post_order(roots))
    final = set(roots)
    replaced, taken = {}, set()
    for key, results in kernels.items():
        r = results[0]
        if r.attr("kernel") != REDUCTION_KERNEL or r.attr("again") or len(key[1]) != 1:
            continue
        red = key[1][0]
        shape = red.args[0].shape
        if red.op is not MAX or not row_reduction(red, shape):  # a max is the same bits in any order; a sum is not
            continue
        wide = [a for a in r.args if a.shape == shape]
        if len(wide) != 1 or wide[0].op is not FUSED_OP or wide[0].attr("again"):
            continue
        pkey = kernel_key(wide[0])
        made = kernels[pkey]
        kind = wide[0].attr("kernel")
        if pkey in taken or key in taken:
            continue
        if not (kind == ROW_KERNEL and row_shape(pkey[1]) == shape
                or kind == ELEMENTWISE_KERNEL and all(o.shape == shape for o in pkey[1])):
            continue
        if any(t.op is PAD for t in post_order(pkey[1])):
            continue  # a row kernel reads no shifted operand (fusion makes none)
        first = min(position[t] for t in made)
        if any(position[a] >= first for a in r.args if a not in made):
            continue
        body = pkey[1]
        kept = [t for t in made if t in final or users.get(t, set()) - {r}]
        inputs, index_of = list(pkey[0]), {a: i for i, a in enumerate(pkey[0])}
        known = {t: _as_stored(body[t.attr("index")]) for t in made}
        keep = sorted(t.attr("index") for t in kept)
        new_body = tuple([body[i] for i in keep] + rebased(r, inputs, index_of, known))
        shape_kind = kernel_shape(new_body)
        for t in kept:
            replaced[t] = make(FUSED_OP, inputs, (new_body, keep.index(t.attr("index")), False, shape_kind))
        replaced[r] = make(FUSED_OP, inputs, (new_body, len(keep), False, shape_kind))
        trace.append(Rewrite("row-reduction-into-producer", r, replaced[r]))
        taken |= {key, pkey}
    return substituted(roots, replaced) if replaced else roots


def _row_max(r):
    """The row shape where fused term ``r`` is a kernel of one row ``max`` over the last axis; else None."""
    body = r.attr("outputs")
    if r.attr("kernel") != REDUCTION_KERNEL or r.attr("again") or len(body) != 1 or body[0].op is not MAX:
        return None
    shape = body[0].args[0].shape
    return shape if row_reduction(body[0], shape) else None


def _rows_reader(key, results, shape):
    """Whether kernel ``key`` is elementwise over ``shape`` alone, reading no shifted operand: it can fold a row
    reduction of what it reads."""
    return (results[0].attr("kernel") == ELEMENTWISE_KERNEL and not results[0].attr("again")
            and all(o.shape == shape for o in key[1]) and not any(t.op is PAD for t in post_order(key[1])))


def into_siblings(roots, trace):
    """``roots`` with each fused row max (a float8 amax's first stage) of a value ``x`` joined to an elementwise
    kernel over ``x``'s shape that reads ``x`` too, where neither kernel waits for the other's results (nor, through
    the joins before it, for its own: ``Joining``): the maxima are folded as that kernel reads the rows. Only a max:
    it is the same bits in any order."""
    roots = tuple(roots)
    kernels, _ = fused_kernels(roots)
    readers = {}
    for key in kernels:
        for a in set(key[0]):
            readers.setdefault(a, []).append(key)
    replaced, taken, joining = {}, set(), Joining()
    for key, results in kernels.items():
        shape = _row_max(results[0])
        wide = [a for a in key[0] if shape and a.shape == shape]
        if len(wide) != 1 or key in taken:
            continue
        r = results[0]
        for skey in readers.get(wide[0], ()):
            sibling = kernels[skey]
            if skey in taken or skey == key or not _rows_reader(skey, sibling, shape):
                continue
            if not joining.accept((results, key[0]), (sibling, skey[0])):
                continue
            replaced.update(appended(skey, sibling, r, results, None))
            trace.append(Rewrite("row-reduction-into-sibling", r, replaced[r]))
            taken |= {key, skey}
            break
    return substituted(roots, replaced) if replaced else roots
