"""Device allocations carved into aligned places (the arena, the state, the outputs, the constants, the staging),
and the CUDA graph a step's calls are captured into."""

import numpy as np

from ....memplan import aligned, unallocatable
from ..layout import ALIGNMENT, one_value


class Block:
    """One device allocation carved into aligned places of ``sizes`` bytes."""

    def __init__(self, sizes, what="a device block"):
        import cupy

        self.offsets, top = [], 0
        for size in sizes:
            self.offsets.append(top)
            top += aligned(size, ALIGNMENT)
        try:
            self.memory = cupy.empty(max(top, 1), np.uint8)
        except (cupy.cuda.memory.OutOfMemoryError, MemoryError, ValueError) as error:
            raise unallocatable(what, top, error) from None
        self.nbytes = top

    def pointer(self, k):
        return self.memory.data.ptr + self.offsets[k]

    def array(self, k, shape, dtype, strides=None):
        """The ``k``-th place as an array, its elements at ``strides`` (C order if None)."""
        import cupy

        byte_strides = None if strides is None else tuple(s * np.dtype(dtype).itemsize for s in strides)
        return cupy.ndarray(shape, dtype, memptr=self.memory.data + self.offsets[k], strides=byte_strides)

    def overlaps(self, low, high):
        """Whether the bytes ``[low, high)`` of device memory reach into this block."""
        return low < self.memory.data.ptr + self.nbytes and high > self.memory.data.ptr


def constants_block(constants):
    """Every constant a kernel or a copy reads, uploaded once into one block (a constant of one repeated value as
    that one element): ``(block, {constant: its address})``."""
    found = sorted(constants, key=id)
    arrays = [np.ascontiguousarray(c.attrs.value.array.reshape(-1)[:1] if one_value(c) else c.attrs.value.array)
              for c in found]
    block = Block([a.nbytes for a in arrays])
    for k, array in enumerate(arrays):
        block.array(k, array.shape, array.dtype).set(array)
    return block, {c: block.pointer(k) for k, c in enumerate(found)}


def captured(calls, stream):
    """The CUDA graph of ``calls`` captured on ``stream`` (the capture ends even where a call fails)."""
    stream.begin_capture()
    try:
        for call in calls:
            call()
    finally:
        graph = stream.end_capture()
    return graph
