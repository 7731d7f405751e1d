"""Ops that a data-parallel program's ranks run together: ``all_reduce``.

Users never build these: ``compile(..., data_parallel=True)`` inserts them on the gradients an
update reads (``cortado.distributed.rewrite``), after differentiation. They are outside the op
table, as a backend's lowered ops are, and carry their reference semantics: a program of one rank,
which is all the reference interpreter sees, reduces over itself.
"""

import numpy as np

from ..term import dtype_violation, make, shape_violation
from .base import Op

COLLECTIVE = "collective"


def _shape(args, bucket, count, index):
    if count != len(args) or not 0 <= index < count:
        raise shape_violation(f"result {index} of an all-reduce of {len(args)} values")
    return args[index].shape


def _dtype(args, bucket, count, index):
    if len({a.dtype for a in args}) > 1:
        raise dtype_violation(f"the values of one all-reduce bucket share a dtype, not {sorted({a.dtype.name for a in args})}")
    return args[index].dtype


def _evaluate(args, bucket, count, index):
    """The mean over one rank: the value itself."""
    return np.asarray(args[index])


# ``all_reduce(*values, bucket=b, count=len(values), index=k)`` is value ``k`` averaged over every rank. The terms
# of one bucket share their values and ``bucket`` and differ in ``index``; a backend reduces a bucket with one call,
# on a stream of its own, while the kernels after it run (``asynchronous``), reading and writing each side of it in
# one piece of the arena (``grouped``).
ALL_REDUCE = Op("all_reduce", None, ("bucket", "count", "index"), _shape, _dtype, COLLECTIVE, evaluate=_evaluate,
                results=lambda bucket, count, index: count, result_attr="index", grouped=True, asynchronous=True)


def all_reduce(values, bucket):
    """The results of one bucket's all-reduce (mean) of ``values``, in order."""
    return tuple(make(ALL_REDUCE, tuple(values), (bucket, len(values), k)) for k in range(len(values)))
