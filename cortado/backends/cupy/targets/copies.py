"""Copies of a value on the device: one memcpy where source and destination are packed alike, else a generated copy
kernel; many small packed ones at once, one kernel for all (``CopyBatch``). The executor copies results out of the
arena and updates into the state with them, and library calls copy the operands they cannot read where they are
into their workspace."""

import numpy as np

from ....memplan import aligned
from ..codegen import PRELUDE, Operand, Source, contiguous_strides, kernel_name, memory_order
from ..kernels import launcher, prepare
from ..launch import WAIT_PRIOR_GRIDS
from ..sources import copy_source
from ..window_kernels import pad_source

BATCHED_BYTES = 1 << 20  # a packed copy up to this size may join a batch; a larger one is a memcpy at the copy rate
BATCH_THREADS = 256
BATCH_BLOCKS = 64  # at most, a copy: 1 MiB is 64 blocks' turns of 16 bytes a thread
GRID_ROWS = 65535  # copies a launch (a grid's second axis)


def _memcpy(destination, source, nbytes, stream):
    import cupy

    runtime = cupy.cuda.runtime
    return lambda: runtime.memcpyAsync(destination, source, nbytes, runtime.memcpyDeviceToDevice, stream.ptr)


def nothing():
    """The call of a kernel over no elements."""


class Copy:
    """Writes a value of ``shape`` and ``dtype`` stored at ``strides`` packed with ``to`` (C order if None); or, given
    ``padded`` (a shape at least as large along every axis), into a C-order block of that shape, zeros after it."""

    def __init__(self, shape, dtype, strides, to=None, padded=None):
        dtype = np.dtype(dtype)
        self.pads = padded is not None and tuple(padded) != tuple(shape)
        written = tuple(padded) if self.pads else tuple(shape)
        to = contiguous_strides(written) if self.pads else to or contiguous_strides(shape)
        self.nbytes = int(np.prod(written, dtype=np.int64)) * dtype.itemsize  # what it writes
        self.kernel = None
        if self.pads:
            self.kernel = pad_source(Operand(shape, dtype, strides), Operand(written, dtype, to), (0,) * len(shape), 0)
        elif self.nbytes and strides != to and int(np.prod(shape, dtype=np.int64)) != 1:
            self.kernel = copy_source(Operand(shape, dtype, strides), memory_order(shape, to))
        if self.kernel is not None:
            prepare(self.kernel)  # compiled beside the program's other kernels; the build waits for them

    def bind(self, source, destination, stream):
        """The call copying from address ``source`` to ``destination`` on ``stream``."""
        if not self.nbytes:
            return nothing
        if self.kernel is None:
            return _memcpy(destination, source, self.nbytes, stream)
        return launcher(self.kernel, [source, destination])


def staged(copied, strides, alignment):
    """Copies of the operands ``copied`` (``(value, strides of its copy)`` pairs, or ``(value, strides, padded shape)``
    where the copy is padded with zeros) into a workspace, for a library call that cannot read them where they are
    (or is slower there): ``(copies, the strides the call reads, the bytes they take)``, each copy ``(value, its
    offset in the workspace, Copy)``."""
    copies, reads, top = [], dict(strides), 0
    for x, copy_strides, *padded in copied:
        copy = Copy(x.shape, x.dtype, strides[x], copy_strides, *padded)
        copies.append((x, top, copy))
        reads[x] = copy_strides
        top += aligned(copy.nbytes, alignment)
    return copies, reads, top


_BATCH_TEXT = f"""extern "C" __global__ void copies(const unsigned long long* __restrict__ jobs) {{
  {WAIT_PRIOR_GRIDS}
  const unsigned long long from = jobs[3 * blockIdx.y], to = jobs[3 * blockIdx.y + 1], bytes = jobs[3 * blockIdx.y + 2];
  const unsigned long long first = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long step = gridDim.x * (unsigned long long)blockDim.x;
  unsigned long long done = 0;
  if (((from | to) & 15) == 0) {{  // 16 bytes at a time, then the tail byte by byte
    const unsigned long long words = bytes / 16;
    for (unsigned long long w = first; w < words; w += step)
      reinterpret_cast<uint4*>(to)[w] = reinterpret_cast<const uint4*>(from)[w];
    done = words * 16;
  }}
  for (unsigned long long b = done + first; b < bytes; b += step)
    reinterpret_cast<unsigned char*>(to)[b] = reinterpret_cast<const unsigned char*>(from)[b];
}}
"""


def _batch_source():
    name = kernel_name(_BATCH_TEXT)
    return Source(name, PRELUDE + _BATCH_TEXT.replace(" copies(", f" {name}(", 1), (1, 1, 1), (BATCH_THREADS, 1, 1))


class CopyBatch:
    """Packed copies, each of ``nbytes`` (at most ``BATCHED_BYTES``), none reading what another writes, made by one
    kernel launch: a row of blocks a copy, its addresses read from a table on the device. A step whose many small
    updates are copied into their state at its end (a float8 layer's amax histories, 96 in the float8 GPT) launches
    one kernel where it made a memcpy each, each with its gap on the device."""

    def __init__(self, nbytes):
        self.nbytes = [int(n) for n in nbytes]
        if not self.nbytes or min(self.nbytes) <= 0 or max(self.nbytes) > BATCHED_BYTES:
            raise ValueError(f"a batch copies values of 1 to {BATCHED_BYTES} bytes, not {self.nbytes}")
        self.source = _batch_source()
        prepare(self.source)  # compiled beside the program's other kernels; the build waits for them
        self.blocks = min(BATCH_BLOCKS, -(-max(self.nbytes) // (BATCH_THREADS * 16)))
        self.table_bytes = 0  # on the device, over the tables of every binding

    def bind(self, places, stream):
        """The call copying from each ``(source, destination)`` address pair of ``places`` (as many as ``nbytes``, in
        its order) on ``stream``: the table of addresses is written to the device here, on ``stream``."""
        import cupy

        if len(places) != len(self.nbytes):
            raise ValueError(f"{len(places)} pairs of addresses for a batch of {len(self.nbytes)} copies")
        jobs = np.array([(s, d, n) for (s, d), n in zip(places, self.nbytes)], np.uint64)
        with stream:
            table = cupy.asarray(jobs)
        self.table_bytes += jobs.nbytes
        launches = [launcher(self.source, [table.data.ptr + jobs.itemsize * 3 * first],
                             grid=(self.blocks, min(GRID_ROWS, len(jobs) - first), 1))
                    for first in range(0, len(jobs), GRID_ROWS)]
        return _Launches(launches, table)


class _Launches:
    """Launches made one after another, holding the device table they read for as long as they may be made."""

    def __init__(self, launches, table):
        self.launches, self.table = launches, table

    def __call__(self):
        for launch in self.launches:
            launch()
