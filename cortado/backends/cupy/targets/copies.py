"""Copies of a value on the device: one memcpy where source and destination are packed alike, else a generated copy
kernel. The executor copies results out of the arena and updates into the state with them, and library calls copy
the operands they cannot read where they are into their workspace."""

import numpy as np

from ....memplan import aligned
from ..codegen import Operand, contiguous_strides, memory_order
from ..kernels import launcher, prepare
from ..sources import copy_source


def _memcpy(destination, source, nbytes, stream):
    import cupy

    runtime = cupy.cuda.runtime
    return lambda: runtime.memcpyAsync(destination, source, nbytes, runtime.memcpyDeviceToDevice, stream.ptr)


def nothing():
    """The call of a kernel over no elements."""


class Copy:
    """Writes a value of ``shape`` and ``dtype`` stored at ``strides`` packed with ``to`` (C order if None)."""

    def __init__(self, shape, dtype, strides, to=None):
        to = to or contiguous_strides(shape)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.kernel = None
        if self.nbytes and strides != to and int(np.prod(shape, dtype=np.int64)) != 1:
            self.kernel = copy_source(Operand(shape, np.dtype(dtype), strides), memory_order(shape, to))
            prepare(self.kernel)  # compiled beside the program's other kernels; the build waits for them

    def bind(self, source, destination, stream):
        """The call copying from address ``source`` to ``destination`` on ``stream``."""
        if not self.nbytes:
            return nothing
        if self.kernel is None:
            return _memcpy(destination, source, self.nbytes, stream)
        return launcher(self.kernel, [source, destination])


def staged(copied, strides, alignment):
    """Copies of the operands ``copied`` (``(value, strides of its copy)`` pairs) into a workspace, for a library call
    that cannot read them where they are (or is slower there): ``(copies, the strides the call reads, the bytes they
    take)``, each copy ``(value, its offset in the workspace, Copy)``."""
    copies, reads, top = [], dict(strides), 0
    for x, copy_strides in copied:
        copies.append((x, top, Copy(x.shape, x.dtype, strides[x], copy_strides)))
        reads[x] = copy_strides
        top += aligned(x.size * x.dtype.itemsize, alignment)
    return copies, reads, top
