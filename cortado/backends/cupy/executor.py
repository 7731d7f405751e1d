"""The GPU executor: one arena, one state block, one output block; a step as one CUDA graph.

Everything is decided when the program is built: every value's pointer (a place in the arena,
the state block or the constants, or a view of another value), every kernel's source, launch
and arguments, every cuBLASLt call. A call copies the feeds into their places, runs the step's
kernels and GEMMs, copies the outputs into the output block and writes the updates. From the
second call on (the first compiles, loads modules and warms cuBLASLt up), the whole step is a
captured CUDA graph replayed in one launch; NumPy feeds are staged in pinned host memory, so
their copies are part of the graph too. ``cuda_graph=False`` runs the same calls one by one.
"""

import math

import numpy as np

from ...errors import BackendError
from ...exprgraph.ops import gemm_operands, parameter
from ...exprgraph.term import make
from ...memplan import aligned
from .blas import Gemm
from .codegen import Operand, contiguous_strides, kernel_source
from .kernels import compiled
from .layout import ALIGNMENT, direct_outputs, gemm_copies, layouts, one_value, stored_strides


def _cupy():
    import cupy

    return cupy


class _Block:
    """One device allocation carved into aligned places."""

    def __init__(self, sizes):
        self.offsets, top = [], 0
        for size in sizes:
            self.offsets.append(top)
            top += aligned(size, ALIGNMENT)
        self.memory = _cupy().empty(max(top, 1), np.uint8)
        self.nbytes = top

    def pointer(self, k):
        return self.memory.data.ptr + self.offsets[k]

    def array(self, k, shape, dtype):
        cupy = _cupy()
        return cupy.ndarray(shape, dtype, memptr=self.memory.data + self.offsets[k])


def _region(t):
    """``(body, inputs)`` of a kernel: a fused term's own, a reshape's copy, or one op over parameters."""
    if t.op.name == "fused":
        return t.attrs[0], list(t.args)
    if t.op.name == "reshape":  # the source's elements in order, written contiguously
        return (parameter(0, t.args[0]),), [t.args[0]]
    if t.op.kind not in ("elementwise", "reduction"):
        raise BackendError(f"the cupy backend cannot run {t.op.name} yet: {t!r}, built at {t.where_built}")
    inputs = list(dict.fromkeys(t.args))
    return (make(t.op, [parameter(inputs.index(a), a) for a in t.args], t.attrs),), inputs


class Executor:
    """Runs one compiled step on the GPU; see the module docstring."""

    def __init__(self, kernels, steps, plan, signature, outputs, updates, sinks, cuda_graph=True, tf32=False, autotune=True):
        cupy = _cupy()
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise BackendError("the cupy backend needs an NVIDIA GPU, and none is visible")
        self.use_graph = bool(cuda_graph)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.strides, _ = layouts(kernels)
        for t in list(outputs) + list(updates.values()):  # state read by no kernel, say
            self.strides.setdefault(t, stored_strides(t))
        self.arena = _Block([plan.peak_bytes])
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
        self.outputs = [self.output_block.array(k, t.shape, t.dtype) for k, t in enumerate(outputs)]
        direct = {t: self.output_block.pointer(outputs.index(t)) for t in direct_outputs(kernels, steps, outputs, sinks)}
        self.pointers.update(direct)
        self.calls, self.labels = [], []
        self.loads, self.gemms = [], []
        for i, (kernel, step) in enumerate(zip(kernels, steps)):
            t = kernel.term
            if step.view_of is not None:
                self.pointers[t] = self.pointers[step.view_of]
            elif t.op.name == "var":
                self.loads.append((t, self.pointers[t]))
            elif t.op.name == "gemm":
                workspace = ("workspace", i)
                self.calls.append(self._gemm(t, self.arena.memory.data.ptr + plan[workspace].offset, tf32))
                self.labels.append(f"k{i}.gemm {t.attrs[4]} {t.shape}")
            else:
                self.calls.append(self._kernel(t, kernel.terms))
                self.labels.append(f"k{i}.{t.op.name} {t.shape}")
        self.finish = [self._copy(t, self.output_block.pointer(k)) for k, t in enumerate(outputs)
                       if direct.get(t) != self.output_block.pointer(k)]
        self.direct_outputs = frozenset(direct)
        final = [(var, value) for var, value in updates.items() if sinks.get(value) is not var and value is not var]
        self.finish += self._updates(final)
        if autotune and self.gemms:  # before the state is written: a gemm may write over a parameter in place
            self._random_fill(self.gemms[0][0].operands[0].dtype)
            for gemm, pointers in self.gemms:
                gemm.tune(pointers, self.stream)
        for v, value in signature.state.items():
            self.state[v].set(np.ascontiguousarray(value))
        self._staging_pinned()
        self.graphs = {}
        self.warm = set()

    # -- building ------------------------------------------------------------------------------

    def _constants(self, kernels, outputs, updates):
        """Every constant a kernel or a copy reads, uploaded once into one block."""
        found = {a for k in kernels for a in k.reads if a.op.name == "const"}
        found |= {t for t in list(outputs) + list(updates.values()) if t.op.name == "const"}
        found = sorted(found, key=id)
        arrays = [np.ascontiguousarray(c.attrs[0].array.reshape(-1)[:1] if one_value(c) else c.attrs[0].array)
                  for c in found]
        self.constant_block = _Block([a.nbytes for a in arrays])
        for k, (c, array) in enumerate(zip(found, arrays)):
            self.constant_block.array(k, array.shape, array.dtype).set(array)
            self.pointers[c] = self.constant_block.pointer(k)
            self.strides[c] = stored_strides(c)

    def _operand(self, t):
        return Operand(t.shape, t.dtype, self.strides[t])

    def _launch(self, source, pointers):
        function = compiled(source)
        args = tuple(np.uint64(p) for p in pointers)
        return lambda: function((source.blocks,), source.block, args)

    def _kernel(self, t, defined):
        """A generated kernel computing the terms ``defined`` (all outputs of ``t``'s region)."""
        body, inputs = _region(t)
        if math.prod(body[0].shape) == 0:
            return lambda: None
        out = [self.pointers[d] for d in defined]
        aliased = {j for j, a in enumerate(inputs) if self.pointers[a] in out}
        source = kernel_source(body, [self._operand(a) for a in inputs], aliased)
        return self._launch(source, [self.pointers[a] for a in inputs] + out)

    def _memcpy(self, destination, source, nbytes):
        """A call copying ``nbytes`` contiguous bytes on the device, on the program's stream."""
        runtime = _cupy().cuda.runtime
        return lambda: runtime.memcpyAsync(destination, source, nbytes, runtime.memcpyDeviceToDevice, self.stream.ptr)

    def _copy(self, t, destination):
        """A call writing value ``t`` contiguously at ``destination``."""
        nbytes = t.size * t.dtype.itemsize
        if nbytes == 0:
            return lambda: None
        if self.strides[t] == contiguous_strides(t.shape) or t.size == 1:
            return self._memcpy(destination, self.pointers[t], nbytes)
        source = kernel_source((parameter(0, t),), [self._operand(t)])
        return self._launch(source, [self.pointers[t], destination])

    def _gemm(self, t, workspace, tf32):
        """The cuBLASLt call of gemm ``t``, after copying the operands it cannot read where they are."""
        calls, strides, pointers = [], dict(self.strides), dict(self.pointers)
        top = workspace
        for x in gemm_copies(t, self.strides):
            calls.append(self._copy(x, top))
            strides[x], pointers[x] = contiguous_strides(x.shape), top
            top += aligned(x.size * x.dtype.itemsize, ALIGNMENT)
        gemm = Gemm(t, strides, tf32)
        a, b, c, bias, aux = gemm_operands(t.args, t.attrs[3], t.attrs[4])
        if bias is not None:
            gemm.set_bias(pointers[bias])
        if aux is not None:
            gemm.set_aux(pointers[aux])
        d = self.pointers[t]
        operands = (pointers[a], pointers[b], pointers[c] if c is not None else d, d, top)
        self.gemms.append((gemm, operands))
        calls.append(lambda: gemm.call(*operands, self.stream.ptr))
        return lambda: [call() for call in calls]

    def _updates(self, final):
        """Copies of update values into the state; sources that another update overwrites go through a stage."""
        destinations = {self.pointers[var] for var, _ in final}
        staged = [value for _, value in final if self.pointers.get(value) in destinations]
        self.stage_block = _Block([v.size * v.dtype.itemsize for v in staged])
        calls, stage = [], {}
        for k, value in enumerate(staged):
            stage[value] = self.stage_block.pointer(k)
            calls.append(self._copy(value, stage[value]))
        for var, value in final:
            if value in stage:
                calls.append(self._memcpy(self.pointers[var], stage[value], value.size * value.dtype.itemsize))
            else:
                calls.append(self._copy(value, self.pointers[var]))
        return calls

    def _random_fill(self, dtype):
        """Standard normal ``dtype`` values over the arena, state and outputs, for timing GEMMs on data like
        a step's: tensor cores draw more power on random values than on zeros, and may run slower."""
        cupy = _cupy()
        for block in (self.arena, self.state_block, self.output_block):
            count = block.nbytes // dtype.itemsize
            values = cupy.random.standard_normal(count, np.float64 if dtype == np.float64 else np.float32)
            cupy.ndarray((count,), dtype, memptr=block.memory.data)[...] = values.astype(dtype)
        cupy.cuda.Device().synchronize()

    def _staging_pinned(self):
        """Pinned host memory for NumPy feeds, so their copies can be captured with the step."""
        cupy = _cupy()
        sizes = [t.size * t.dtype.itemsize for t, _ in self.loads]
        total = sum(aligned(s, ALIGNMENT) for s in sizes)
        self.pinned_memory = cupy.cuda.alloc_pinned_memory(max(total, 1))
        host = np.frombuffer(self.pinned_memory, np.uint8, max(total, 1))
        self.pinned, top = {}, 0
        for (t, _), size in zip(self.loads, sizes):
            self.pinned[t.name] = host[top:top + size].view(t.dtype).reshape(t.shape)
            top += aligned(size, ALIGNMENT)

    @property
    def device_bytes(self):
        blocks = (self.arena, self.state_block, self.output_block, self.constant_block, self.stage_block)
        return sum(b.nbytes for b in blocks)

    # -- running -------------------------------------------------------------------------------

    def write_state(self, var, value):
        """Replace a state value (checked by the caller) once the steps in flight are done."""
        self.stream.synchronize()
        if isinstance(value, np.ndarray):
            self.state[var].set(np.ascontiguousarray(value))
        else:
            self.state[var][...] = value

    def _feed_copies(self, on_device):
        """The copies of the feeds into their places: from pinned memory (NumPy) or device arrays."""
        cupy = _cupy()
        calls = []
        for t, pointer in self.loads:
            if t.name in on_device:
                continue
            host = self.pinned[t.name]
            calls.append(lambda d=pointer, h=host: cupy.cuda.runtime.memcpyAsync(
                d, h.ctypes.data, h.nbytes, cupy.cuda.runtime.memcpyHostToDevice, self.stream.ptr))
        return calls

    def _steps(self, on_device):
        return self._feed_copies(on_device) + self.calls + self.finish

    def run(self, feeds):
        """Run one step on checked ``feeds`` (``{name: NumPy or CuPy array}``); returns the output arrays."""
        return self._on_stream(feeds, self._run_step)

    def profile(self, feeds):
        """Run one step eagerly with a device event around each call: ``[(kernel label, milliseconds)]``."""
        cupy = _cupy()
        marks = []

        def timed(on_device):
            for call in self._feed_copies(on_device):
                call()
            for label, call in zip(self.labels, self.calls):
                start = self.stream.record()
                call()
                marks.append((label, start, self.stream.record()))
            for call in self.finish:
                call()

        self._on_stream(feeds, timed)
        self.stream.synchronize()
        return [(label, cupy.cuda.get_elapsed_time(start, end)) for label, start, end in marks]

    def _on_stream(self, feeds, step):
        """Copy the feeds in and run ``step(on_device)`` on the program's stream, ordered after the caller's work."""
        cupy = _cupy()
        on_device = frozenset(name for name, value in feeds.items() if isinstance(value, cupy.ndarray))
        caller = cupy.cuda.get_current_stream()
        if len(on_device) < len(feeds):
            self.stream.synchronize()  # the last step's copies out of the pinned staging are done
            for name, value in feeds.items():
                if name not in on_device and name in self.pinned:
                    np.copyto(self.pinned[name], value)
        self.stream.wait_event(caller.record())
        with self.stream:
            for t, pointer in self.loads:
                if t.name in on_device:
                    value = cupy.ascontiguousarray(feeds[t.name])
                    self._memcpy(pointer, value.data.ptr, value.nbytes)()
            step(on_device)
        caller.wait_event(self.stream.record())
        return list(self.outputs)

    def _run_step(self, on_device):
        graph = self.graphs.get(on_device)
        if graph is not None:
            graph.launch(self.stream)
            return
        calls = self._steps(on_device)
        if not self.use_graph or on_device not in self.warm:
            for call in calls:
                call()
            self.warm.add(on_device)
            return
        self.stream.begin_capture()
        try:
            for call in calls:
                call()
        finally:
            graph = self.stream.end_capture()
        self.graphs[on_device] = graph
        graph.launch(self.stream)
