"""Data parallelism as a rewrite: every gradient an update reads is averaged over the ranks.

Each rank runs the same step on its own shard of the batch. Where the loss is a mean over the
batch, the mean over the ranks of each rank's gradient is the gradient of the whole batch, so the
step equals the one-rank step on the concatenated batch once each gradient an update reads is
replaced by its ``all_reduce`` (mean), as PyTorch's DistributedDataParallel averages ``.grad``.
Gradients are the terms ``ct.grad``/``ct.vjp`` returned (``grad.is_gradient``); the first one
found on each path from an update down is averaged, and what it is computed from stays local.

Gradients go into buckets in the order they are ready in the backward pass, as DDP's do: by the
length of the longest chain of terms each is computed through (the last layer's gradient, at the
start of the backward pass, has the shortest), which any schedule must run in turn. Each bucket
one dtype, the first at most ``FIRST_BUCKET_BYTES`` so that communication starts early, the others
at most ``BUCKET_BYTES``. A backend reduces a bucket with one call, as soon as its last gradient
exists, beside the rest of the backward pass.

Nothing is left to run beside the buckets of the last gradients, so over several ranks (``blocks``),
where the last product ``x^T @ dy`` among the gradients (a first layer's weight gradient) is larger
than ``BLOCK_BYTES``, it is computed in blocks of its rows (each ``x[:, a:b]^T @ dy``, the most rows
``BLOCK_BYTES`` holds in whole 128s, 128 at least), each averaged as soon as it exists while the
next is computed, and the averaged blocks joined again: only the last block's all-reduce waits at
the end of the step. Blocks are larger than buckets: each block's product runs
beside the all-reduce of the one before, and runs the slower the smaller it is (on four H200s the
8192-wide MLP's step took 14.74 ms with blocks of 12 MiB, 14.30 with 24, 14.14 with 40, 14.10 with
64; ``benchmarks/results/h200x4/experiments/``).
Each element of the gradient sums the same products (in the order the product's kernel chooses). In
a world of one the averages are copies and nothing runs beside them: blocks would cost without gain.
"""

from dataclasses import dataclass

from ..errors import FeedError
from ..exprgraph import constructors as ct
from ..exprgraph.graph import schedule
from ..exprgraph.ops import MATMUL, TRANSPOSE
from ..exprgraph.ops.collectives import ALL_REDUCE, all_reduce
from ..exprgraph.slicing import concatenate
from ..grad import is_gradient
from ..rules.engine import substitute

FIRST_BUCKET_BYTES = 1 << 20  # DDP's defaults
BUCKET_BYTES = 25 << 20
BLOCK_BYTES = 64 << 20  # the most a block of the last gradient holds
BLOCK_ROWS = 128  # a block of the last gradient's rows is a multiple of this many (a GEMM's tile of rows)


@dataclass(frozen=True)
class Bucket:
    """The gradients one all-reduce averages, in the order they lie in memory, and their averages."""

    gradients: tuple
    averages: tuple

    @property
    def nbytes(self):
        return sum(g.size * g.dtype.itemsize for g in self.gradients)


def data_parallel(updates, inputs, bucket_bytes=BUCKET_BYTES, first_bucket_bytes=FIRST_BUCKET_BYTES, blocks=False,
                  block_bytes=BLOCK_BYTES):
    """``(updates with each gradient they read averaged over the ranks, the buckets)``; with ``blocks``, the last
    product among the gradients made and averaged in blocks of its rows, at most ``block_bytes`` each, where that
    puts them in several buckets.

    ``updates``: ``{state variable: new value}``; ``inputs``: the fed variables, which hold each rank's
    shard of the batch. A FeedError where no update reads a gradient of the inputs, or where an update
    reads the inputs other than through a gradient (a running mean of the batch, say): the ranks' states
    would differ after one step.
    """
    fed = frozenset(inputs)
    order = schedule(list(updates.values()))
    local = _local_terms(order, fed)
    found = _read_gradients(updates.values(), local)
    if not found:
        raise FeedError("compile(data_parallel=True): no update reads a gradient of the fed inputs (a term ct.grad "
                        "returned): there is nothing to average over the ranks")
    depth = _depths(order)
    ready = _by_readiness(found, order, depth)
    last, parts = _last_product_in_blocks(ready, block_bytes) if blocks else (None, [])
    buckets = None
    if parts:  # before the gradients ready with it (its bias's, say), which may be made after every block
        at = next(i for i, g in enumerate(ready) if depth[g] >= depth[last])
        buckets = _buckets(ready[:at] + parts + [g for g in ready[at:] if g is not last], bucket_bytes,
                           first_bucket_bytes)
        if sum(bool(set(b.gradients) & set(parts)) for b in buckets) < 2:  # one bucket: nothing runs beside them
            parts, buckets = [], None
    buckets = buckets or _buckets(ready, bucket_bytes, first_bucket_bytes)
    averaged = {g: a for bucket in buckets for g, a in zip(bucket.gradients, bucket.averages)}
    if parts:
        averaged[last] = concatenate([averaged.pop(b) for b in parts], axis=0)
    rewritten = {var: substitute(value, averaged) for var, value in updates.items()}
    for var, value in rewritten.items():
        leaked = _fed_outside_averages(value, fed)
        if leaked:
            raise FeedError(f"compile(data_parallel=True): the update of {var.name!r} reads the fed "
                            f"{', '.join(sorted(repr(v.name) for v in leaked))} other than through a gradient; "
                            f"each rank would update its state from its own shard, and the ranks would part ways")
    return rewritten, buckets


def _local_terms(order, fed):
    """The terms of ``order`` (a schedule) that depend on a fed input: they differ from rank to rank."""
    local = set()
    for t in order:
        if t in fed or any(a in local for a in t.args):
            local.add(t)
    return local


def _read_gradients(values, local):
    """The gradients of local values that the update ``values`` read, the first on each path down."""
    found, seen, stack = {}, set(), list(values)
    while stack:
        t = stack.pop()
        if t in seen or t not in local:
            continue
        seen.add(t)
        if is_gradient(t):
            found[t] = None
        else:
            stack.extend(t.args)
    return list(found)


def _depths(order):
    """``{term: the length of the longest chain of terms that computes it}`` over ``order``, a schedule."""
    depth = {}
    for t in order:
        depth[t] = 1 + max((depth[a] for a in t.args), default=0)
    return depth


def _by_readiness(gradients, order, depth):
    """``gradients`` by their ``depth`` (``_depths`` of ``order``, a schedule of them all), ties in schedule order."""
    position = {t: i for i, t in enumerate(order)}
    return sorted(gradients, key=lambda g: (depth[g], position[g]))


def _last_product_in_blocks(ready, block_bytes):
    """``(the gradient, its blocks of rows)`` for the last of ``ready`` that is a product ``x^T @ dy`` of more than
    ``block_bytes``: blocks of the most rows ``block_bytes`` holds in whole ``BLOCK_ROWS`` (``BLOCK_ROWS`` at least),
    the last the rest; ``(None, ())`` where there is none, or it has too few rows for two blocks."""
    for g in reversed(ready):
        nbytes = g.size * g.dtype.itemsize
        if g.op is MATMUL and g.ndim == 2 and g.args[0].op is TRANSPOSE and nbytes > block_bytes:
            rows = g.shape[0]
            per = max(BLOCK_ROWS, block_bytes // (nbytes // rows) // BLOCK_ROWS * BLOCK_ROWS)
            if per >= rows:
                return None, ()
            x, dy = g.args[0].args[0], g.args[1]
            return g, [ct.transpose(x[:, a:a + per]) @ dy for a in range(0, rows, per)]
    return None, ()


def _buckets(gradients, bucket_bytes, first_bucket_bytes):
    """``gradients`` (in the order they are ready) cut into buckets of one dtype and at most the byte caps each
    (a gradient larger than its cap makes a bucket alone)."""
    groups, current, size = [], [], 0
    for g in gradients:
        nbytes = g.size * g.dtype.itemsize
        cap = first_bucket_bytes if not groups else bucket_bytes
        if current and (g.dtype != current[0].dtype or size + nbytes > cap):
            groups.append(current)
            current, size = [], 0
        current.append(g)
        size += nbytes
    groups.append(current)
    return [Bucket(tuple(group), all_reduce(group, k)) for k, group in enumerate(groups)]


def _fed_outside_averages(value, fed):
    """The fed inputs ``value`` reads other than through an all-reduce."""
    leaked, seen, stack = set(), set(), [value]
    while stack:
        t = stack.pop()
        if t in seen or t.op is ALL_REDUCE:
            continue
        seen.add(t)
        if t in fed:
            leaked.add(t)
        stack.extend(t.args)
    return leaked
