"""Where a call's feeds are read from, and the staging of those that cannot be read where the caller keeps them.

A CuPy feed packed as the program reads it (C order; images channels last with ``channels_last_io``), on this GPU,
aligned and apart from the program's own buffers, is read in place. NumPy feeds go through pinned host memory (so
that their copies are part of the step's CUDA graph) into a feed block allocated on first need; other CuPy feeds
are copied into that block; and feeds at more than ``ADDRESS_SETS`` sets of addresses are staged too, since each
set costs a prepared set of calls and a graph.
"""

import numpy as np

from ....exprgraph.dtypes import as_strided
from ..codegen import contiguous_strides
from ..layout import ALIGNMENT
from .blocks import Block

ADDRESS_SETS = 8  # sets of feed addresses a program reads in place (a graph each) before it stages device feeds
IN_PLACE, HOST, DEVICE = "in place", "host", "device"  # where a call's feed is read from (HOST, DEVICE: staged)


class Feeds:
    """The program's feeds (``terms``, held by the caller at ``io_strides``), read on ``device`` by calls on
    ``stream``; ``own_blocks()`` gives the program's blocks, which a feed read in place must not overlap."""

    def __init__(self, terms, io_strides, device, stream, own_blocks):
        self.terms, self.io_strides, self.device, self.stream = terms, io_strides, device, stream
        self.names = [t.name for t in terms]
        self.own_blocks = own_blocks
        self.block = self.pinned = None  # made on first need
        self.in_place = {}  # (feed, address, strides, device) -> whether a value there is read in place (a call's
        # checks, made once for each place: a step fed the same arrays again costs a lookup)

    def _readable_in_place(self, k, value):
        """Whether feed ``k`` can be read where ``value`` lies: remembered for each place (the shape is the feed's,
        checked before; the program's blocks never move)."""
        memory = value.data
        key = (k, memory.ptr, value.strides, memory.device_id)
        found = self.in_place.get(key)
        if found is None:
            if len(self.in_place) > 64 * len(self.terms):  # feeds at ever new places
                self.in_place.clear()
            found = self.in_place[key] = self._placed_as_read(self.terms[k], value)
        return found

    def _placed_as_read(self, t, value):
        """Packed as the program reads ``t``, on this GPU, aligned as the arena's buffers are (kernels load 16-byte
        vectors; a slice ``x[1:]`` may start anywhere), apart from the program's buffers (a program's own output fed
        back in would be written while it is read)."""
        expected = self.io_strides[t]
        if value.data.device_id != self.device or value.data.ptr % ALIGNMENT or not all(
                n == 1 or s == e * value.itemsize for n, s, e in zip(value.shape, value.strides, expected)):
            return False
        return not any(b.overlaps(value.data.ptr, value.data.ptr + value.nbytes) for b in self.own_blocks())

    def sources(self, values, prepared):
        """Where each feed of ``values`` (``{name: array}``) is read from in this call: ``(IN_PLACE, address)``,
        ``(HOST, None)`` or ``(DEVICE, None)``; ``prepared``: the sources the program has calls for already."""
        import cupy

        sources = []
        for k, name in enumerate(self.names):
            value = values[name]
            if not isinstance(value, cupy.ndarray):
                sources.append((HOST, None))
            elif self._readable_in_place(k, value):
                sources.append((IN_PLACE, value.data.ptr))
            else:
                sources.append((DEVICE, None))
        sources = tuple(sources)
        if sources in prepared:
            return sources
        in_place = sum(any(kind == IN_PLACE for kind, _ in key) for key in prepared)
        if in_place >= ADDRESS_SETS:  # feeds at ever new addresses: staged
            sources = tuple((DEVICE, None) if kind == IN_PLACE else (kind, at) for kind, at in sources)
        return sources

    def _staging(self):
        """The feed block, and pinned host memory for NumPy feeds."""
        import cupy

        if self.block is None:
            sizes = [t.size * t.dtype.itemsize for t in self.terms]
            self.block = Block(sizes)
            self.pinned_memory = cupy.cuda.alloc_pinned_memory(max(self.block.nbytes, 1))
            host = np.frombuffer(self.pinned_memory, np.uint8, max(self.block.nbytes, 1))
            self.pinned = {t.name: _strided(host[offset:offset + size].view(t.dtype), t.shape, self.io_strides[t])
                           for t, offset, size in zip(self.terms, self.block.offsets, sizes)}
        return self.block

    def places(self, sources):
        """Each feed's address in a call reading them from ``sources``, and the calls copying NumPy feeds there from
        pinned memory (part of the step's calls, and so of its graph)."""
        import cupy

        places = [at if kind == IN_PLACE else self._staging().pointer(k) for k, (kind, at) in enumerate(sources)]
        runtime = cupy.cuda.runtime
        copies = [lambda d=place, h=self.pinned[t.name]: runtime.memcpyAsync(d, h.ctypes.data, h.nbytes,
                                                                             runtime.memcpyHostToDevice, self.stream.ptr)
                  for t, place, (kind, _) in zip(self.terms, places, sources) if kind == HOST]
        return places, copies

    @staticmethod
    def staged(sources):
        """Whether a call reading from ``sources`` stages any feed."""
        return any(kind != IN_PLACE for kind, _ in sources)

    def stage_host(self, values, sources):
        """Copy NumPy feeds into pinned memory, once the last step's copies out of it are done (for ``sources`` that
        stage a feed: ``staged``)."""
        self._staging()
        self.stream.synchronize()
        for t, (kind, _) in zip(self.terms, sources):
            if kind == HOST:
                np.copyto(self.pinned[t.name], values[t.name])

    def stage_device(self, values, sources):
        """Copy CuPy feeds that are not read in place into the feed block, on the program's stream."""
        import cupy

        for k, (t, (kind, _)) in enumerate(zip(self.terms, sources)):
            if kind != DEVICE:
                continue
            if self.io_strides[t] == contiguous_strides(t.shape):
                value = cupy.ascontiguousarray(values[t.name])  # (a copy between GPUs is one memcpy)
                cupy.cuda.runtime.memcpyAsync(self.block.pointer(k), value.data.ptr, value.nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToDevice, self.stream.ptr)
            else:  # channels last, by CuPy's copy on the program's stream
                value = values[t.name]
                if value.device.id != self.device:  # CuPy's kernels read this GPU's memory only
                    value = cupy.asarray(value.get())
                self.block.array(k, t.shape, t.dtype, self.io_strides[t])[...] = value

    @property
    def nbytes(self):
        return 0 if self.block is None else self.block.nbytes


def _strided(flat, shape, strides):
    """The elements of 1-d ``flat`` as an array of ``shape`` at element ``strides`` (a view of them)."""
    return as_strided(flat, shape, tuple(s * flat.itemsize for s in strides))
