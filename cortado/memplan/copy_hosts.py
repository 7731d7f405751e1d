"""``into_row_kernels``: a copy made again after the memory peak (``memplan.recompute``) joins a row kernel of the
backward pass that reads everything it reads, instead of being a kernel of its own.

A layer norm's output, which the weight gradient of the product after it reads, is made again late from the layer's
input, its statistics, gain and bias: an elementwise kernel reading the input again and writing the output. The
layer norm's input gradient, a row kernel of the same rows, reads the input and the statistics too, and runs where
the weight gradient's other operand (the product's output gradient) already exists. Joined, that row kernel also
writes the output, from the rows it holds, and one kernel's reads and launch go.

A copy joins a row kernel of its shape (not one made again, nor the kernel it was made from) where the kernel reads
every operand of the copy of its shape or of one value a row, the kernel already depends on every other operand of
the copy's readers (so it makes the copy no earlier than they could run, and holds it no longer), and neither the
copy nor any of its readers' results flows into the kernel (no cycle: a kernel that reads the copy, or reads what
was made from it, cannot make it). Every value is computed by the same expressions.

    roots, copies = into_row_kernels(roots, copies)   # after ``recomputed``
"""

from ..exprgraph.graph import post_order
from ..exprgraph.ops import BROADCAST_TO, FUSED_OP, RESHAPE, TRANSPOSE
from ..rules.fusion import ROW_KERNEL, row_shape
from ..rules.scalar_epilogues import appended, fused_kernels, kernel_key, substitution


def _ancestors(t):
    """Every term ``t`` reads, directly or through others."""
    return set(post_order(list(t.args)))


def _viewed(a):
    """The value ``a`` is, or is a chain of views of."""
    while a.op in (RESHAPE, TRANSPOSE, BROADCAST_TO) and a.args:
        a = a.args[0]
    return a


def _host(copy_key, copy_results, readers, hosts, taken):
    """The key of the row kernel among ``hosts`` that the copy ``copy_key`` (its leaves, its body; its results
    ``copy_results``) may join, or None."""
    leaves, body = copy_key
    shape = body[0].shape
    rows = shape[:-1] + (1,)
    read = {v for v in leaves if v.shape in (shape, rows)}
    results = set()
    for reader in readers:
        results |= set(reader.op.results_of(reader))
    needed = {_viewed(a) for reader in readers for a in reader.args}
    needed = {a for a in needed if not (a.op is FUSED_OP and kernel_key(a) == copy_key)}
    for key, first in hosts.items():
        if key in taken or row_shape(key[1]) != shape or not read <= set(key[0]):
            continue
        above = _ancestors(first)
        if needed <= above and not (results | set(copy_results)) & above:
            return key
    return None


def into_row_kernels(roots, copies):
    """``(roots, copies, joined)`` with each copy that may join a row kernel (the module's docstring says which)
    computed by that kernel; ``copies``: ``{copy's output term: the terms reading it}``, as ``recompute.recomputed``
    gives them, without the joined ones and over the terms of the rewritten graph (``remapped``); ``joined``:
    ``{copy's output term: the row kernel's result computing it}``."""
    roots = tuple(roots)
    kernels, _ = fused_kernels(roots)
    hosts = {key: results[0] for key, results in kernels.items()
             if results[0].attr("kernel") == ROW_KERNEL and not results[0].attr("again")}
    by_copy = {}
    for copy, readers in copies.items():
        by_copy.setdefault(kernel_key(copy), []).extend(readers)
    replaced, taken = {}, set()
    for copy_key, readers in by_copy.items():
        host = _host(copy_key, kernels[copy_key], readers, hosts, taken)
        if host is None:
            continue
        guest = kernels[copy_key]
        replaced.update(appended(host, kernels[host], guest[0], guest, ROW_KERNEL))
        taken.add(host)
    if not replaced:
        return roots, copies, {}
    joined = {c: replaced[c] for c in copies if c in replaced}
    roots, made = substitution(roots, replaced)
    return roots, remapped({c: rs for c, rs in copies.items() if c not in joined}, made), joined


def remapped(copies, made):
    """``copies`` (``{copy: its readers}``) over the terms they became in a rewritten graph (``made``: each old term's
    new one, ``rules.scalar_epilogues.substitution``): a reader rebuilt over a rewritten operand is another term,
    which the compiler must find to order the copy before it."""
    return {made.get(c, c): [made.get(r, r) for r in readers] for c, readers in copies.items()}
