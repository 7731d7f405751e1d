"""``into_readers``: an elementwise kernel whose every operand another elementwise kernel of its shape reads too joins
that kernel.

gelu(z) made again for a gelu layer's weight gradient (from the kept z, where it is read, so that the forward pass's
gelu is not held across the step) is an elementwise kernel reading what gelu's backward reads too, where that is a
kernel of its own (``lowering.gemm``): apart, each reads z and each computes gelu's sigmoid of it. Joined, one kernel
reads z once and computes what both bodies share once (``rebased`` rebuilds the guest's body over the host's
parameters, so their common terms are one term).

The guest reads nothing the host does not, so the joined kernel waits for nothing more than the host did and holds
no operand longer. ``Joining`` refuses a join that would make a kernel wait for its own results. A host coming after
the guest in post-order makes the guest's results later, never earlier; a host coming before it makes them earlier,
so it is joined only where every other operand of the guest's readers exists by then (gelu's weight gradient reads
the layer's output gradient, which the host's product was made from): those readers need not hold the results
longer than before, and a value made late for readers after the memory peak stays after it. Kernels reading
shifted operands (pads) join none. Every value is computed by the same expressions.

    roots = into_readers(roots, trace)   # after ``fusion.fuse``, for a backend that declares ``horizontal``
"""

from ..exprgraph.graph import post_order, readers_of
from ..exprgraph.ops import LEAF, PAD
from .engine import Rewrite
from .fusion import ELEMENTWISE_KERNEL
from .scalar_epilogues import Joining, appended, fused_kernels, substituted


def _elementwise_over(results):
    """The shape of fused kernel ``results`` where it is an elementwise kernel of outputs of one shape reading no
    shifted operand, else None."""
    first = results[0]
    body = first.attr("outputs")
    if first.attr("kernel") != ELEMENTWISE_KERNEL or first.attr("again") or any(t.op is PAD for t in post_order(body)):
        return None
    if [r.attr("index") for r in results] != list(range(len(body))):
        return None  # a result nothing reads: ``appended`` takes a kernel's results in their order, all of them
    shapes = {o.shape for o in body}
    return shapes.pop() if len(shapes) == 1 else None


def _readers_ready(results, first, users, position):
    """Whether every operand of the readers of ``results`` other than those results is a leaf or comes before
    post-order position ``first``."""
    return all(a in results or a.op.kind == LEAF or position[a] < first
               for r in results for reader in users.get(r, ()) for a in reader.args)


def into_readers(roots, trace):
    """``roots`` with each elementwise kernel whose operands another elementwise kernel of its shape all reads joined
    to that kernel (the module's docstring says where)."""
    roots = tuple(roots)
    kernels, position = fused_kernels(roots)
    users, readers = readers_of(position), {}
    for key in kernels:
        for a in set(key[0]):
            readers.setdefault(a, []).append(key)
    replaced, taken, joining = {}, set(), Joining()
    for key, results in kernels.items():
        shape = _elementwise_over(results)
        if shape is None or key in taken or not key[0]:
            continue
        first = min(position[r] for r in results)
        for host in readers[key[0][0]]:
            hosted = kernels[host]
            if host == key or host in taken or _elementwise_over(hosted) != shape or not set(key[0]) <= set(host[0]):
                continue
            earlier = min(position[r] for r in hosted)
            if earlier < first and not _readers_ready(results, earlier, users, position):
                continue
            if not joining.accept((results, key[0]), (hosted, host[0])):
                continue
            replaced.update(appended(host, hosted, results[0], results, ELEMENTWISE_KERNEL))
            trace.append(Rewrite("elementwise-into-reader", results[0], replaced[results[0]]))
            taken |= {key, host}
            break
    return substituted(roots, replaced) if replaced else roots
