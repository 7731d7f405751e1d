"""The GPU executor: one arena, one state block, one output block; a step as one CUDA graph.

Everything but the feeds' addresses is decided when the program is built: every value's pointer
(a place in the arena, the state block or the constants, or a view of another value), every
kernel's source and launch, every cuBLASLt call. A call runs the step's kernels and GEMMs, writes
the outputs into the output block and the updates into the state.

Feeds cost no memory of the program's own where it can help it: a CuPy feed packed as the program
reads it (C order; images channels last with ``channels_last_io``, as are then the images it
returns) is read where the caller keeps it. The step's calls, and its CUDA graph, are made for each set of feed
addresses; a loop that feeds the same arrays, or a few arrays in turn, replays a few graphs.
Only NumPy feeds, CuPy feeds that cannot be read in place (strided, on another GPU, overlapping
the program's own buffers) and feeds at more than ``ADDRESS_SETS`` sets of addresses are staged:
copied into a feed block allocated on first need (NumPy feeds through pinned host memory, so
that their copies are part of the graph). From the second call on (the first compiles, loads
modules and warms cuBLASLt up), a step is one graph launch; ``cuda_graph=False`` runs the same
calls one by one.

A data-parallel program's all-reduces run on a second stream through NCCL, each bucket one call
as soon as its gradients exist, beside the kernels after it, until the first kernel that reads an
average waits for it: in a CUDA graph, a fork and a join. The state starts as rank 0's.
"""


import numpy as np

from ... import distributed
from ...errors import BackendError
from ...exprgraph.ops import CONST, FLIP, FUSED_OP, OVERLAP_ADD, PAD, RESHAPE, TAKE, TAKE_ALONG_AXIS
from ...exprgraph.ops.collectives import ALL_REDUCE
from .lowering.attention import DNN_ATTENTION, DNN_ATTENTION_GRAD
from .lowering.conv import DNN_CONV
from .lowering.gemm import GEMM, gemm_operands
from .lowering.int8 import INT8_GEMM
from ...memplan import aligned, joins, unallocatable
from .. import interface
from .blas import Gemm
from .codegen import Operand, channels_last_strides, contiguous_strides, memory_order
from .device import require_gpu
from .kernels import compiled, launcher
from .dnn import Conv
from .dnn_attention import Attention, attention_copies
from .mma.runner import Int8Gemm
from .layout import (
    ALIGNMENT, channels_last_for, concatenated_in_place, direct_outputs, dnn_copies, gemm_copies, io_strides, layouts, one_value,
    stored_strides,
)
from .index_kernels import take_along_axis_source, take_source
from .sources import copy_source, kernel_sources
from .window_kernels import flip_source, overlap_add_source, pad_source


def _cupy():
    import cupy

    return cupy


class _Block:
    """One device allocation carved into aligned places."""

    def __init__(self, sizes, what="a device block"):
        self.offsets, top = [], 0
        for size in sizes:
            self.offsets.append(top)
            top += aligned(size, ALIGNMENT)
        cupy = _cupy()
        try:
            self.memory = cupy.empty(max(top, 1), np.uint8)
        except (cupy.cuda.memory.OutOfMemoryError, MemoryError, ValueError) as error:
            raise unallocatable(what, top, error) from None
        self.nbytes = top

    def pointer(self, k):
        return self.memory.data.ptr + self.offsets[k]

    def array(self, k, shape, dtype, strides=None):
        """The ``k``-th place as an array, its elements at ``strides`` (C order if None)."""
        cupy = _cupy()
        byte_strides = None if strides is None else tuple(s * np.dtype(dtype).itemsize for s in strides)
        return cupy.ndarray(shape, dtype, memptr=self.memory.data + self.offsets[k], strides=byte_strides)


WINDOW_KERNELS = {  # op -> the source of its kernel, from its operand and its term
    PAD: lambda x, t: pad_source(x, t, [low for low, _ in t.attr("pad_width")], t.attr("constant_values")),
    FLIP: lambda x, t: flip_source(x, t, t.attr("axes")),
    OVERLAP_ADD: lambda x, t: overlap_add_source(x, t, t.attr("strides"), t.attr("dilation")),
}
INDEX_KERNELS = {  # op -> the source of its kernel, from its operand, its indices and its term
    TAKE: lambda x, indices, t: take_source(x, indices, t, t.attr("axis")),
    TAKE_ALONG_AXIS: lambda x, indices, t: take_along_axis_source(x, indices, t, t.attr("axis")),
}
ADDRESS_SETS = 8  # sets of feed addresses a program reads in place (a graph each) before it stages device feeds
IN_PLACE, HOST, DEVICE = "in place", "host", "device"  # where a call's feed is read from (HOST, DEVICE: staged)


class Executor(interface.Executor):
    """Runs one compiled step on the GPU; see the module docstring."""

    def __init__(self, kernels, steps, plan, signature, outputs, updates, sinks, cuda_graph=True, tf32=False, autotune=True,
                 nhwc="auto", deterministic=True, channels_last_io=False):
        cupy = _cupy()
        require_gpu()
        self.use_graph = bool(cuda_graph)
        self.device = cupy.cuda.Device().id
        self.stream = cupy.cuda.Stream(non_blocking=True)
        layout_options = {"nhwc": nhwc, "tf32": tf32, "channels_last_io": channels_last_io}
        self.strides, views = layouts(kernels, layout_options)
        self.view_bytes = {t: offset * t.dtype.itemsize for t, offset in views.items() if offset}  # crops
        self.channels_last_for = channels_last_for(kernels, layout_options)
        for t in list(outputs) + list(updates.values()):  # state read by no kernel, say
            self.strides.setdefault(t, stored_strides(t))
        self.arena = _Block([plan.peak_bytes], "an arena on the GPU")
        state = list(signature.state)
        self.state_block = _Block([v.size * v.dtype.itemsize for v in state])
        self.state = {v: self.state_block.array(i, v.shape, v.dtype) for i, v in enumerate(state)}
        self.pointers = {v: self.state_block.pointer(i) for i, v in enumerate(state)}
        self.pointers.update({value: self.pointers[var] for value, var in sinks.items()})
        self._constants(kernels, outputs, updates)
        for placed in plan.placements:
            if not isinstance(placed.key, tuple):  # ("workspace", i) keys are scratch, not values
                self.pointers.setdefault(placed.key, self.arena.memory.data.ptr + placed.offset)
        self.output_block = _Block([t.size * t.dtype.itemsize for t in outputs])
        self.io_strides = {t: io_strides(t, layout_options) for t in list(outputs) + [k.term for k in kernels if k.is_load]}
        self.outputs = [self.output_block.array(k, t.shape, t.dtype, self.io_strides[t]) for k, t in enumerate(outputs)]
        direct = {t: self.output_block.pointer(outputs.index(t))
                  for t in direct_outputs(kernels, steps, outputs, sinks, layout_options)}
        self.pointers.update(direct)
        self.direct_outputs = frozenset(direct)
        parts, _ = concatenated_in_place(kernels)  # written straight into their columns of a concatenation
        self.pointers.update({d: self.pointers[whole] + offset * d.dtype.itemsize for d, (whole, offset) in parts.items()})
        self.feeds = [k.term for k in kernels if k.is_load]
        self.views = [(k.term, s.view_of) for k, s in zip(kernels, steps) if s.view_of is not None]
        self.pointers = self._resolved([None] * len(self.feeds))  # feeds, and views of them, have no place yet
        self.makers, self.labels, self.tuned, self.choices = [], [], [], {}
        self.world = distributed.world()
        self.side = cupy.cuda.Stream(non_blocking=True)  # where all-reduces run
        asynchronous = [i for i, k in enumerate(kernels) if k.term.op.asynchronous]
        done = {i: [None] for i in asynchronous}  # the event each records when its call is made
        waits = {}
        for i, j in joins(steps, asynchronous).items():
            waits.setdefault(j, []).append(done[i])
        for i, (kernel, step) in enumerate(zip(kernels, steps)):
            t = kernel.term
            if step.view_of is not None or kernel.is_load or not step.defines:  # no defines: concatenated in place
                continue
            if i in waits:
                self.makers.append(self._join(waits[i]))
                self.labels.append(f"k{i} waits for all-reduce")
            scratch = self.arena.memory.data.ptr + (plan["workspace", i].offset if ("workspace", i) in plan else 0)
            if t.op is GEMM:
                self.makers.append(self._gemm(kernel.terms, scratch, tf32))
                self.labels.append(f"k{i}.gemm {t.attr('epilogue')} {t.shape}")
            elif t.op is DNN_CONV:
                self.makers.append(self._convolution(t, scratch, tf32, deterministic))
                self.labels.append(f"k{i}.dnn_conv {t.attr('mode')} {t.shape}")
            elif t.op is INT8_GEMM:
                self.makers.append(self._int8_gemm(t, scratch))
                self.labels.append(f"k{i}.int8_gemm {t.shape}")
            elif t.op in (DNN_ATTENTION, DNN_ATTENTION_GRAD):
                self.makers.append(self._attention(kernel.terms, scratch, deterministic))
                self.labels.append(f"k{i}.{t.op.name} {t.args[0].shape}")
            elif t.op is ALL_REDUCE:
                self.makers.append(self._all_reduce(kernel.terms, done[i]))
                self.labels.append(f"k{i}.all_reduce bucket {t.attr('bucket')} ({len(kernel.terms)} values)")
            else:
                self.makers.append(self._kernel(t, kernel.terms, scratch))
                self.labels.append(f"k{i}.{t.op.name} {t.shape}")
        if len(steps) in waits:
            self.makers.append(self._join(waits[len(steps)]))
        self.makers += [self._copy(t, self.output_block.pointer(k), self.io_strides[t]) for k, t in enumerate(outputs)
                        if direct.get(t) != self.output_block.pointer(k)]
        final = [(var, value) for var, value in updates.items() if sinks.get(value) is not var and value is not var]
        self.makers += self._updates(final)
        self.feed_block = self.pinned = None  # made on first need
        self.prepared, self.graphs = {}, {}
        if autotune and self.tuned:  # before the state is written: a gemm may write over a parameter in place
            self._tune()
        for v, value in signature.state.items():
            self.state[v].set(np.asarray(value, order="C"))  # (ascontiguousarray makes a 0-d value 1-d)
        if asynchronous and self.world.size > 1:  # every rank starts from rank 0's parameters
            nccl = distributed.nccl_module()
            self.world.communicator.broadcast(self.state_block.memory.data.ptr, self.state_block.memory.data.ptr,
                                              self.state_block.nbytes, nccl.NCCL_UINT8, 0, self.stream.ptr)
            self.stream.synchronize()

    def layout(self, t):
        strides = self.strides.get(t)
        if strides is None or t.ndim < 3 or strides == contiguous_strides(t.shape):
            return ""
        return "channels-last" if strides == channels_last_strides(t.shape) else ""

    # -- building ------------------------------------------------------------------------------

    def _constants(self, kernels, outputs, updates):
        """Every constant a kernel or a copy reads, uploaded once into one block."""
        found = {a for k in kernels for a in k.reads if a.op is CONST}
        found |= {t for t in list(outputs) + list(updates.values()) if t.op is CONST}
        found = sorted(found, key=id)
        arrays = [np.ascontiguousarray(c.attr("value").array.reshape(-1)[:1] if one_value(c) else c.attr("value").array)
                  for c in found]
        self.constant_block = _Block([a.nbytes for a in arrays])
        for k, (c, array) in enumerate(zip(found, arrays)):
            self.constant_block.array(k, array.shape, array.dtype).set(array)
            self.pointers[c] = self.constant_block.pointer(k)
            self.strides[c] = stored_strides(c)

    def _viewed(self, t):
        """The value ``t`` is a view of (through views of views), or ``t``."""
        viewed = dict(self.views)
        while t in viewed:
            t = viewed[t]
        return t

    def _constant(self, t):
        """Whether ``t`` is a constant of the program or a view of one: no kernel writes it."""
        return self._viewed(t).op is CONST

    def _operand(self, t):
        return Operand(t.shape, t.dtype, self.strides[t])

    def _launch(self, source, places):
        """A maker of calls of the kernel ``source`` over ``places`` (inputs, then outputs): values, whose
        pointers the maker is given, or fixed addresses."""
        compiled(source)  # now, so that a kernel NVRTC rejects fails the build

        def make(pointers):
            return launcher(source, [p if isinstance(p, int) else pointers[p] for p in places])

        return make

    def _kernel(self, t, defined, workspace):
        """A maker of calls of the generated kernels computing the terms ``defined`` (all outputs of ``t``'s region);
        ``workspace``: the address of their scratch, where they need some."""
        if t.op not in (FUSED_OP, RESHAPE, *WINDOW_KERNELS, *INDEX_KERNELS):
            raise BackendError(f"the cupy backend cannot run {t.op.name} yet: {t!r}, built at {t.where_built}")
        if t.size == 0:
            return lambda pointers: _nothing
        if t.op is RESHAPE:  # not a view: the source's elements in order, written contiguously
            return self._launch(copy_source(self._operand(t.args[0])), [t.args[0], t])
        if t.op in WINDOW_KERNELS:
            return self._launch(WINDOW_KERNELS[t.op](self._operand(t.args[0]), t), [t.args[0], t])
        if t.op in INDEX_KERNELS:
            return self._launch(INDEX_KERNELS[t.op](*map(self._operand, t.args), t), [*t.args, t])
        body, inputs = t.attr("outputs"), list(t.args)
        out = [self.pointers[d] for d in defined]
        aliased = {j for j, a in enumerate(inputs) if self.pointers.get(a) in out}  # feeds alias nothing of ours
        order = memory_order(t.shape, self.strides[defined[0]])
        sources = kernel_sources(body, [self._operand(a) for a in inputs], aliased, order, t.attr("kernel"))
        places = list(inputs) + list(defined) + ([workspace] if len(sources) > 1 else [])
        makers = [self._launch(source, places) for source in sources]
        if len(makers) == 1:
            return makers[0]

        def make(pointers):
            calls = [maker(pointers) for maker in makers]
            return lambda: [call() for call in calls]

        return make

    def _memcpy(self, destination, source, nbytes):
        """A call copying ``nbytes`` contiguous bytes on the device, on the program's stream."""
        runtime = _cupy().cuda.runtime
        return lambda: runtime.memcpyAsync(destination, source, nbytes, runtime.memcpyDeviceToDevice, self.stream.ptr)

    def _copy(self, t, destination, strides=None):
        """A maker of calls writing value ``t`` at ``destination``, packed with ``strides`` (C order if None)."""
        nbytes = t.size * t.dtype.itemsize
        strides = strides or contiguous_strides(t.shape)
        if nbytes == 0:
            return lambda pointers: _nothing
        if self.strides[t] == strides or t.size == 1:
            return lambda pointers: self._memcpy(destination, pointers[t], nbytes)
        return self._launch(copy_source(self._operand(t), memory_order(t.shape, strides)), [t, destination])

    def _staged(self, copied, workspace):
        """Copies of the operands ``copied`` (``(value, strides of its copy)`` pairs) into the workspace at
        ``workspace`` (a pointer), for a library call that cannot read them where they are, or is slower there:
        ``(copies, the strides the call reads, the first free byte after the copies)``."""
        copies, strides, top = [], dict(self.strides), workspace
        for x, copy_strides in copied:
            copies.append((x, top, self._copy(x, top, copy_strides)))
            strides[x] = copy_strides
            top += aligned(x.size * x.dtype.itemsize, ALIGNMENT)
        return copies, strides, top

    def _library_call(self, runner, copies, operands):
        """A maker of calls of ``runner`` (a ``Gemm`` or a ``Conv``) on ``operands(pointers)``, after its ``copies``;
        the runner is tuned on the program's buffers when the program is built."""
        def bound(pointers):
            return operands({**pointers, **{x: at for x, at, _ in copies}})

        def make(pointers):
            calls, arguments = [copy(pointers) for _, _, copy in copies], bound(pointers)
            return lambda: [call() for call in calls] + [runner.call(*arguments, self.stream.ptr)]

        self.tuned.append((runner, bound))
        return make

    def _gemm(self, terms, workspace, tf32):
        """A maker of the cuBLASLt call computing gemm ``terms`` (the product, and a bias gradient where the epilogue
        makes one, which cuBLASLt writes through its bias pointer)."""
        t = terms[0]
        copies, strides, top = self._staged(gemm_copies(t, self.strides), workspace)
        gemm = Gemm(t, strides, tf32)
        a, b, c, bias, aux = gemm_operands(t.args, t.attr("beta"), t.attr("epilogue"))

        def operands(pointers):
            bias_pointer = pointers[terms[1]] if len(terms) > 1 else pointers[bias] if bias is not None else None
            return (pointers[a], pointers[b], pointers[c if c is not None else t], pointers[t], top,
                    bias_pointer, pointers[aux] if aux is not None else None)

        return self._library_call(gemm, copies, operands)

    def _convolution(self, t, workspace, tf32, deterministic):
        """A maker of the cuDNN call computing ``dnn_conv`` ``t``."""
        copies, strides, top = self._staged(dnn_copies(t, self.strides, self.channels_last_for), workspace)
        conv = Conv(t, strides, tf32, deterministic)
        self.choices[t] = conv
        a, b, *extras = t.args
        return self._library_call(conv, copies, lambda pointers: (pointers[a], pointers[b], pointers[t], top,
                                                                  tuple(pointers[e] for e in extras)))

    def _int8_gemm(self, t, workspace):
        """A maker of the call computing ``int8_gemm`` ``t``: our tensor-core kernel or cuBLASLt's, with the
        epilogue."""
        a, b, *extras = t.args
        runner = Int8Gemm(t, self.strides, (self._constant(a), self._constant(b)))
        self.choices[t] = runner
        return self._library_call(runner, [], lambda pointers: (pointers[a], pointers[b],
                                                                tuple(pointers[e] for e in extras), pointers[t],
                                                                workspace))

    def _attention(self, terms, workspace, deterministic):
        """A maker of the cuDNN call computing the results ``terms`` of a flash attention, forward or backward, after
        copies of the operands it cannot read where they are."""
        t = terms[0]
        copies, strides, top = self._staged(attention_copies(t, self.strides), workspace)
        runner = Attention(t, strides, deterministic)
        self.choices[t] = runner

        def make(pointers):
            calls = [copy(pointers) for _, _, copy in copies]
            placed = {**pointers, **{x: at for x, at, _ in copies}}
            addresses = [placed[x] for x in runner.values]
            return lambda: [call() for call in calls] + [runner.call(addresses, top, self.stream.ptr)]

        return make

    def _all_reduce(self, terms, done):
        """A maker of the call averaging a bucket's gradients over the ranks, into ``terms`` (its results, side by
        side in the arena): one NCCL all-reduce on the side stream, from the gradients where the plan put them side
        by side as well (in place where the results took their places), else from copies of them packed into the
        results first. ``done[0]`` is set to the event that the kernels reading the results wait for. In a world of
        one, the averages are copies, where they are not in the gradients' places already."""
        gradients = terms[0].args
        sizes = [g.size * g.dtype.itemsize for g in gradients]
        offsets = np.cumsum([0] + [aligned(n, ALIGNMENT) for n in sizes[:-1]]).tolist()
        count = (offsets[-1] + sizes[-1]) // gradients[0].dtype.itemsize
        nccl = distributed.nccl_module() if self.world.size > 1 else None

        def make(pointers):
            send, receive = pointers[gradients[0]], pointers[terms[0]]
            in_place = [pointers[g] == send + at and self.strides[g] == self.strides[r]
                        for g, r, at in zip(gradients, terms, offsets)]
            copies = [] if all(in_place) and nccl is not None else [
                self._copy(g, receive + at, self.strides[r])(pointers) for g, r, at in zip(gradients, terms, offsets)
                if pointers[g] != receive + at or self.strides[g] != self.strides[r]]
            source = receive if copies else send
            if nccl is None:
                return lambda: [copy() for copy in copies]
            dtype = _nccl_dtype(nccl, gradients[0].dtype)
            communicator = self.world.communicator

            def call():
                for copy in copies:
                    copy()
                self.side.wait_event(self.stream.record())
                communicator.allReduce(source, receive, count, dtype, nccl.NCCL_AVG, self.side.ptr)
                done[0] = self.side.record()

            return call

        return make

    def _join(self, events):
        """A maker of the call that makes the program's stream wait for the all-reduces whose ``events`` (each a
        one-item list, set by its call) say they are done."""
        def make(pointers):
            def call():
                for event in events:
                    if event[0] is not None:
                        self.stream.wait_event(event[0])
            return call

        return make

    def _updates(self, final):
        """Makers of the copies of update values into the state; sources that another update overwrites (a state
        variable, or a view of one: a slice starts inside it) go through a stage."""
        destinations = {self.pointers[var] for var, _ in final}
        staged = [value for _, value in final
                  if {self.pointers.get(value), self.pointers.get(self._viewed(value))} & destinations]
        self.stage_block = _Block([v.size * v.dtype.itemsize for v in staged])
        makers, stage = [], {}
        for k, value in enumerate(staged):
            stage[value] = self.stage_block.pointer(k)
            makers.append(self._copy(value, stage[value]))
        for var, value in final:
            if value in stage:
                nbytes = value.size * value.dtype.itemsize
                makers.append(lambda pointers, d=self.pointers[var], s=stage[value], n=nbytes: self._memcpy(d, s, n))
            else:
                makers.append(self._copy(value, self.pointers[var]))
        return makers

    def _tune(self):
        """Time each library call's candidates (cuBLASLt's algorithms, cuDNN's plans) on standard normal values in
        the program's buffers (and in a feed block, freed after): tensor cores draw more power on random values
        than on zeros, and may run slower."""
        cupy = _cupy()
        dtype = self.tuned[0][0].dtype
        self.feed_block = _Block([t.size * t.dtype.itemsize for t in self.feeds])
        for block in (self.arena, self.state_block, self.output_block, self.feed_block):
            count = block.nbytes // dtype.itemsize
            values = cupy.random.standard_normal(count, np.float64 if dtype == np.float64 else np.float32)
            cupy.ndarray((count,), dtype, memptr=block.memory.data)[...] = values.astype(dtype)
        cupy.cuda.Device().synchronize()
        pointers = self._resolved([self.feed_block.pointer(k) for k in range(len(self.feeds))])
        with self.stream:  # the current stream, where a call's own kernels launch
            for runner, operands in self.tuned:
                runner.tune(operands(pointers), self.stream)
        self.feed_block = None

    def _resolved(self, feed_pointers):
        """Every value's pointer when the feeds are at ``feed_pointers``: views follow what they view (a crop its
        first element)."""
        pointers = {**self.pointers, **dict(zip(self.feeds, feed_pointers))}
        for t, source in self.views:
            pointers[t] = None if pointers[source] is None else pointers[source] + self.view_bytes.get(t, 0)
        return pointers

    @property
    def device_bytes(self):
        blocks = (self.arena, self.state_block, self.output_block, self.constant_block, self.stage_block, self.feed_block)
        return sum(b.nbytes for b in blocks if b is not None)

    # -- feeds ---------------------------------------------------------------------------------

    def _readable_in_place(self, t, value):
        """Whether CuPy feed ``value`` of ``t`` can be read where it is: packed as the program reads ``t`` (C order,
        or channels last with ``channels_last_io``), on this GPU, aligned as the arena's buffers are (kernels load
        16-byte vectors; a slice ``x[1:]`` may start anywhere), apart from the program's buffers (a program's own
        output fed back in would be written while it is read)."""
        expected = self.io_strides[t]
        if value.device.id != self.device or value.data.ptr % ALIGNMENT or not all(
                n == 1 or s == e * value.itemsize for n, s, e in zip(value.shape, value.strides, expected)):
            return False
        low, high = value.data.ptr, value.data.ptr + value.nbytes
        blocks = (self.arena, self.state_block, self.output_block, self.constant_block, self.stage_block)
        return all(high <= b.memory.data.ptr or low >= b.memory.data.ptr + b.nbytes for b in blocks)

    def _sources(self, feeds):
        """Where each feed is read from in this call: ``(IN_PLACE, address)``, ``(HOST, None)`` or ``(DEVICE, None)``."""
        cupy = _cupy()
        sources = []
        for t in self.feeds:
            value = feeds[t.name]
            if not isinstance(value, cupy.ndarray):
                sources.append((HOST, None))
            elif self._readable_in_place(t, value):
                sources.append((IN_PLACE, value.data.ptr))
            else:
                sources.append((DEVICE, None))
        sources = tuple(sources)
        if sources in self.prepared:
            return sources
        in_place = sum(any(kind == IN_PLACE for kind, _ in key) for key in self.prepared)
        if in_place >= ADDRESS_SETS:  # feeds at ever new addresses: staged
            sources = tuple((DEVICE, None) if kind == IN_PLACE else (kind, at) for kind, at in sources)
        return sources

    def _staging(self):
        """The feed block, and pinned host memory for NumPy feeds (so their copies can be captured with the step)."""
        if self.feed_block is None:
            sizes = [t.size * t.dtype.itemsize for t in self.feeds]
            self.feed_block = _Block(sizes)
            self.pinned_memory = _cupy().cuda.alloc_pinned_memory(max(self.feed_block.nbytes, 1))
            host = np.frombuffer(self.pinned_memory, np.uint8, max(self.feed_block.nbytes, 1))
            self.pinned = {t.name: _strided(host[offset:offset + size].view(t.dtype), t.shape, self.io_strides[t])
                           for t, offset, size in zip(self.feeds, self.feed_block.offsets, sizes)}
        return self.feed_block

    def _calls(self, sources):
        """The step's calls for feeds read from ``sources``: made once for each, then kept."""
        calls = self.prepared.get(sources)
        if calls is None:
            places = [at if kind == IN_PLACE else self._staging().pointer(k) for k, (kind, at) in enumerate(sources)]
            calls = [self._host_copy(t, place) for t, place, (kind, _) in zip(self.feeds, places, sources) if kind == HOST]
            pointers = self._resolved(places)
            calls += [make(pointers) for make in self.makers]
            self.prepared[sources] = calls
        return calls

    def _host_copy(self, t, destination):
        cupy = _cupy()
        host = self.pinned[t.name]
        return lambda: cupy.cuda.runtime.memcpyAsync(destination, host.ctypes.data, host.nbytes,
                                                    cupy.cuda.runtime.memcpyHostToDevice, self.stream.ptr)

    # -- running -------------------------------------------------------------------------------

    def write_state(self, var, value):
        """Replace a state value (checked by the caller) once the steps in flight are done."""
        self.stream.synchronize()
        if isinstance(value, np.ndarray):
            self.state[var].set(np.asarray(value, order="C"))
        else:
            self.state[var][...] = value

    def run(self, feeds):
        """Run one step on checked ``feeds`` (``{name: NumPy or CuPy array}``); returns the output arrays."""
        return self._on_stream(feeds, self._run_step)

    def profile(self, feeds):
        """Run one step eagerly with a device event around each call: ``[(kernel label, milliseconds)]``."""
        cupy = _cupy()
        marks = []

        def timed(sources):
            calls = self._calls(sources)
            staged = len(calls) - len(self.makers)
            for call in calls[:staged]:
                call()
            for label, call in zip(self.labels, calls[staged:]):
                start = self.stream.record()
                call()
                marks.append((label, start, self.stream.record()))
            for call in calls[staged + len(self.labels):]:
                call()

        self._on_stream(feeds, timed)
        self.stream.synchronize()
        return [(label, cupy.cuda.get_elapsed_time(start, end)) for label, start, end in marks]

    def _on_stream(self, feeds, step):
        """Stage the feeds that need it and run ``step(sources)`` on the program's stream, ordered after the
        caller's work."""
        cupy = _cupy()
        sources = self._sources(feeds)
        caller = cupy.cuda.get_current_stream()
        if any(kind != IN_PLACE for kind, _ in sources):
            block = self._staging()
            self.stream.synchronize()  # the last step's copies out of the pinned staging are done
            for t, (kind, _) in zip(self.feeds, sources):
                if kind == HOST:
                    np.copyto(self.pinned[t.name], feeds[t.name])
        self.stream.wait_event(caller.record())
        with self.stream:
            for k, (t, (kind, _)) in enumerate(zip(self.feeds, sources)):
                if kind == DEVICE and self.io_strides[t] == contiguous_strides(t.shape):
                    value = cupy.ascontiguousarray(feeds[t.name])  # (a copy between GPUs is one memcpy)
                    self._memcpy(block.pointer(k), value.data.ptr, value.nbytes)()
                elif kind == DEVICE:  # channels last, by CuPy's copy on the program's stream
                    value = feeds[t.name]
                    if value.device.id != self.device:  # CuPy's kernels read this GPU's memory only
                        value = cupy.asarray(value.get())
                    block.array(k, t.shape, t.dtype, self.io_strides[t])[...] = value
            step(sources)
        caller.wait_event(self.stream.record())
        return list(self.outputs)

    def _run_step(self, sources):
        graph = self.graphs.get(sources)
        if graph is not None:
            graph.launch(self.stream)
            return
        first = not self.prepared
        calls = self._calls(sources)
        if not self.use_graph or first:  # the first call compiles, loads modules and warms cuBLASLt up
            for call in calls:
                call()
            return
        self.stream.begin_capture()
        try:
            for call in calls:
                call()
        finally:
            graph = self.stream.end_capture()
        self.graphs[sources] = graph
        graph.launch(self.stream)


def _nccl_dtype(nccl, dtype):
    names = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16"}
    if dtype.name not in names:
        raise BackendError(f"compile(data_parallel=True): NCCL averages float gradients, not {dtype.name}")
    return getattr(nccl, names[dtype.name])


def _strided(flat, shape, strides):
    """The elements of 1-d ``flat`` as an array of ``shape`` at element ``strides`` (a view of them)."""
    return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * flat.itemsize for s in strides))


def _nothing():
    """The call of a kernel over no elements."""
