"""A library call as a runner: cuBLASLt's, cuDNN's or an int8 kernel's, after copies of the operands it cannot read
where they are into the front of its workspace (``copies.staged``), the library's own workspace after them; a
result it writes in its workspace (a product padded, ``gemm.gemm_padding``) is copied where it belongs after the
call."""

import math

from ....memplan import aligned
from ..layout import ALIGNMENT
from . import Runner
from .copies import Copy, staged


class LibraryCall(Runner):
    """Runs ``library`` (built from the strides it reads) on the arguments ``arguments(placed, workspace)`` gives:
    ``placed`` maps each of ``values`` to its address, an operand copied to its copy's. ``written``: ``(result,
    strides, shape)`` where the call writes ``result`` at ``strides`` in its workspace, within a block of ``shape``,
    then packs it where it belongs."""

    tuned = True

    def __init__(self, kernel, view, copied, build, arguments, detail="", written=None):
        self.values = tuple(dict.fromkeys(kernel.term.args)) + tuple(kernel.terms)
        self.copies, reads, self.copied_bytes = staged(copied, view.strides, ALIGNMENT)
        self.packed = None
        if written is not None:
            result, strides, shape = written
            self.packed = (result, self.copied_bytes, Copy(result.shape, result.dtype, strides, view.strides[result]))
            self.copied_bytes += aligned(math.prod(shape) * result.dtype.itemsize, ALIGNMENT)
        self.library = build(reads)
        self.arguments, self.detail = arguments, detail
        self.workspace_bytes = self.copied_bytes + self.library.workspace_bytes
        self.dtype = getattr(self.library, "dtype", kernel.term.dtype)  # what timing fills the buffers with

    def describe(self):
        said = [super().describe()]
        if any(copy.pads for _, _, copy in self.copies):
            said.append("operands copied padded with zeros to whole 16-byte vectors")
        if self.packed is not None:
            said.append("product written padded, then packed")
        return "; ".join(s for s in said if s)

    def _arguments(self, addresses, workspace):
        placed = dict(zip(self.values, addresses))
        placed.update({x: workspace + at for x, at, _ in self.copies})
        if self.packed is not None:
            placed[self.packed[0]] = workspace + self.packed[1]
        return self.arguments(placed, workspace + self.copied_bytes)

    def tune(self, addresses, workspace, stream):
        self.library.tune(self._arguments(addresses, workspace), stream)

    def bind(self, addresses, workspace, stream):
        placed = dict(zip(self.values, addresses))
        calls = [copy.bind(placed[x], workspace + at, stream) for x, at, copy in self.copies]
        arguments, call = self._arguments(addresses, workspace), self.library.call
        calls.append(lambda: call(*arguments, stream.ptr))
        if self.packed is not None:
            result, at, copy = self.packed
            calls.append(copy.bind(workspace + at, placed[result], stream))
        if len(calls) == 1:
            return calls[0]
        return lambda: [made() for made in calls]
