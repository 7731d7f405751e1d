"""NCCL's all-reduce: a bucket's gradients averaged over the ranks (``all_reduce`` terms, which
``compile(data_parallel=True)`` inserts), one call on the side stream as soon as they exist, beside the kernels
after it; ``finished`` holds the event that the first kernel reading an average waits for."""

import numpy as np

from .... import distributed
from ....errors import BackendError
from ....exprgraph.ops.collectives import ALL_REDUCE
from ....memplan import aligned
from ..layout import ALIGNMENT
from . import Runner, Target
from .copies import Copy

_NCCL_TYPES = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "float16": "NCCL_FLOAT16",
               "bfloat16": "NCCL_BFLOAT16"}


class AllReduce(Runner):
    """Averages the bucket's gradients into its results (side by side in the arena): from the gradients where the
    plan put them side by side as well (in place where the results took their places), else from copies of them
    packed into the results first. In a world of one, the averages are copies, where they are not in the gradients'
    places already."""

    def __init__(self, kernel, view):
        self.results = tuple(kernel.terms)
        self.gradients = kernel.term.args
        self.values = tuple(self.gradients) + self.results
        self.strides, self.side = view.strides, view.side
        sizes = [g.size * g.dtype.itemsize for g in self.gradients]
        self.offsets = np.cumsum([0] + [aligned(n, ALIGNMENT) for n in sizes[:-1]]).tolist()
        self.count = (self.offsets[-1] + sizes[-1]) // self.gradients[0].dtype.itemsize
        self.world = distributed.world()
        self.nccl = distributed.nccl_module() if self.world.size > 1 else None
        if self.nccl is not None and self.gradients[0].dtype.name not in _NCCL_TYPES:
            raise BackendError(f"compile(data_parallel=True): NCCL averages float gradients, not "
                               f"{self.gradients[0].dtype.name}")
        self.finished = [None]  # the event its last call recorded on the side stream
        self.detail = f"bucket {kernel.term.attrs.bucket} ({len(self.gradients)} values)"

    def bind(self, addresses, workspace, stream):
        placed = dict(zip(self.values, addresses))
        send, receive = placed[self.gradients[0]], placed[self.results[0]]
        in_place = [placed[g] == send + at and self.strides[g] == self.strides[r]
                    for g, r, at in zip(self.gradients, self.results, self.offsets)]
        copies = [] if all(in_place) and self.nccl is not None else [
            Copy(g.shape, g.dtype, self.strides[g], self.strides[r]).bind(placed[g], receive + at, stream)
            for g, r, at in zip(self.gradients, self.results, self.offsets)
            if placed[g] != receive + at or self.strides[g] != self.strides[r]]
        source = receive if copies else send
        if self.nccl is None:
            return lambda: [copy() for copy in copies]
        dtype = getattr(self.nccl, _NCCL_TYPES[self.gradients[0].dtype.name])
        communicator, side, finished, nccl = self.world.communicator, self.side, self.finished, self.nccl

        def call():
            for copy in copies:
                copy()
            side.wait_event(stream.record())
            communicator.allReduce(source, receive, self.count, dtype, nccl.NCCL_AVG, side.ptr)
            finished[0] = side.record()

        return call

    def describe(self):
        return f"NCCL all-reduce of {len(self.gradients)} values"


TARGET = Target("collectives", (ALL_REDUCE,), AllReduce, lambda kernel, view: 0)
