"""A library call as a runner: cuBLASLt's, cuDNN's or an int8 kernel's, after copies of the operands it cannot read
where they are into the front of its workspace (``copies.staged``), the library's own workspace after them."""

from ..layout import ALIGNMENT
from . import Runner
from .copies import staged


class LibraryCall(Runner):
    """Runs ``library`` (built from the strides it reads) on the arguments ``arguments(placed, workspace)`` gives:
    ``placed`` maps each of ``values`` to its address, an operand copied to its copy's."""

    tuned = True

    def __init__(self, kernel, view, copied, build, arguments, detail=""):
        self.values = tuple(dict.fromkeys(kernel.term.args)) + tuple(kernel.terms)
        self.copies, reads, self.copied_bytes = staged(copied, view.strides, ALIGNMENT)
        self.library = build(reads)
        self.arguments, self.detail = arguments, detail
        self.workspace_bytes = self.copied_bytes + self.library.workspace_bytes
        self.dtype = getattr(self.library, "dtype", kernel.term.dtype)  # what timing fills the buffers with

    def _arguments(self, addresses, workspace):
        placed = dict(zip(self.values, addresses))
        placed.update({x: workspace + at for x, at, _ in self.copies})
        return self.arguments(placed, workspace + self.copied_bytes)

    def tune(self, addresses, workspace, stream):
        self.library.tune(self._arguments(addresses, workspace), stream)

    def bind(self, addresses, workspace, stream):
        placed = dict(zip(self.values, addresses))
        copies = [copy.bind(placed[x], workspace + at, stream) for x, at, copy in self.copies]
        arguments, call = self._arguments(addresses, workspace), self.library.call
        if not copies:
            return lambda: call(*arguments, stream.ptr)
        return lambda: [copy() for copy in copies] + [call(*arguments, stream.ptr)]
