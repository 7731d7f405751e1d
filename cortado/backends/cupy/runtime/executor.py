"""The GPU executor: one arena, one state block, one output block; a step as one CUDA graph.

Everything but the feeds' addresses is decided when the program is built: every value's pointer (a place in the
arena, the state block or the constants, or a view of another value) and every kernel's runner (``targets``: the
generated kernels' launches, the library calls). The executor walks the plan and calls the runners, naming none;
a call writes the outputs into the output block and the updates into the state. The calls, and their CUDA graph,
are made for each set of feed addresses (``feeds``: a CuPy feed packed as the program reads it is read where the
caller keeps it); from the second call on (the first compiles, loads modules and warms cuBLASLt up) a step is one
graph launch, and ``cuda_graph=False`` runs the same calls one by one. A data-parallel program's all-reduces run
on a second stream, each as soon as its gradients exist, until the first kernel that reads an average waits for
it: in a CUDA graph, a fork and a join. The kernels that only write updates run on a third (``beside``). The state
starts as rank 0's.
"""


import numpy as np

from .... import distributed
from ....errors import BackendError
from ....exprgraph.ops import CONST
from ....memplan import joins
from ... import interface
from ..codegen import channels_last_strides, contiguous_strides
from ..device import require_gpu
from ..kernels import finish
from ..layout import channels_last_for, concatenated_in_place, direct_outputs, io_strides, layouts, stored_strides
from ..targets import View, forget, runner
from ..targets.copies import BATCHED_BYTES, Copy, CopyBatch
from .beside import Beside
from .blocks import Block, captured, constants_block
from .feeds import Feeds
from .holding import Hold
from .tuning import tune
from .updates import staged_updates

HELD_CALLS = 100  # calls queued behind one hold of a profile: far fewer launches and events than a stream queues


class Executor(interface.Executor):
    """Runs one compiled step on the GPU; see the module docstring."""

    def __init__(self, kernels, steps, plan, signature, outputs, updates, sinks, beside, cuda_graph=True, tf32=False,
                 autotune=True, nhwc="auto", deterministic=True, channels_last_io=False):
        import cupy

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
        self.arena = Block([plan.peak_bytes], "an arena on the GPU")
        state = list(signature.state)
        self.state_block = Block([v.size * v.dtype.itemsize for v in state])
        self.state = {v: self.state_block.array(i, v.shape, v.dtype) for i, v in enumerate(state)}
        self.pointers = {v: self.state_block.pointer(i) for i, v in enumerate(state)}
        self.pointers.update({value: self.pointers[var] for value, var in sinks.items()})
        found = {a for k in kernels for a in k.reads if a.op is CONST}
        found |= {t for t in list(outputs) + list(updates.values()) if t.op is CONST}
        self.constant_block, placed = constants_block(found)
        self.pointers.update(placed)
        self.strides.update({c: stored_strides(c) for c in placed})
        for placed in plan.placements:
            if not isinstance(placed.key, tuple):  # ("workspace", i) keys are scratch, not values
                self.pointers.setdefault(placed.key, self.arena.memory.data.ptr + placed.offset)
        self.output_block = Block([t.size * t.dtype.itemsize for t in outputs])
        self.io_strides = {t: io_strides(t, layout_options) for t in list(outputs) + [k.term for k in kernels if k.is_load]}
        self.outputs = [self.output_block.array(k, t.shape, t.dtype, self.io_strides[t]) for k, t in enumerate(outputs)]
        direct = {t: self.output_block.pointer(outputs.index(t))
                  for t in direct_outputs(kernels, steps, outputs, sinks, layout_options)}
        self.pointers.update(direct)
        self.direct_outputs = frozenset(direct)
        parts, _ = concatenated_in_place(kernels)  # written straight into their columns of a concatenation
        self.pointers.update({d: self.pointers[whole] + offset * d.dtype.itemsize for d, (whole, offset) in parts.items()})
        self.feeds = [k.term for k in kernels if k.is_load]
        self.staging = Feeds(self.feeds, self.io_strides, self.device, self.stream, self._blocks)
        self.views = [(k.term, s.view_of) for k, s in zip(kernels, steps) if s.view_of is not None]
        self.pointers = self._resolved([None] * len(self.feeds))  # feeds, and views of them, have no place yet
        self.world = distributed.world()
        self.side = cupy.cuda.Stream(non_blocking=True)  # where asynchronous calls (all-reduces) run
        # the events that order a call on the program's stream after the caller's work and the caller's next work
        # after it (a stream waits for an event as it was recorded then, so one pair serves every call); the second,
        # ``done``, marks the end of the last step or state write, on whichever stream it ran
        self.handoff = (cupy.cuda.Event(disable_timing=True), cupy.cuda.Event(disable_timing=True))
        view = View(self.strides, self.pointers, self._constant, frozenset(self.channels_last_for),
                    {"tf32": tf32, "deterministic": deterministic}, self.side)
        asynchronous = [i for i, k in enumerate(kernels) if k.term.op.asynchronous]
        self.overlap = Beside(self.stream, cupy.cuda.Stream(non_blocking=True))  # runs the updates beside the step
        self.beside = frozenset(beside)
        finished = {i: [None] for i in beside}  # the event each kernel beside recorded last
        waits = {}
        for i, j in joins(steps, asynchronous).items():  # the kernel that first reads an average waits for it
            waits.setdefault(j, []).append(i)
        for i, j in beside.items():
            waits.setdefault(j, []).append(i)
        self.binders, self.labels, self.runners, self.tuned = [], [], {}, []
        launched = []
        for i, (kernel, step) in enumerate(zip(kernels, steps)):
            if i in waits:
                self.binders.append(self._join([finished.get(k) or self.runners[kernels[k].term].finished
                                                for k in waits[i]]))
                self.labels.append(f"k{i} waits for " + ("all-reduce" if set(waits[i]) - set(beside) else "updates"))
            if step.view_of is not None or kernel.is_load or not step.defines:  # no defines: concatenated in place
                continue
            scratch = self.arena.memory.data.ptr + (plan["workspace", i].offset if ("workspace", i) in plan else 0)
            self.runners[kernel.term] = made = runner(kernel, view)
            self.binders.append(self._bound(made, scratch) if i not in beside else self._beside(made, scratch, finished[i]))
            self.labels.append(" ".join(filter(None, (f"k{i}.{kernel.term.op.name}", made.detail, str(kernel.term.shape)))))
            launched.append(i)
            if made.tuned:
                self.tuned.append((made, scratch))
        self.launched = frozenset(launched)
        forget()  # the runners the planner asked are this program's now: no other program gets them
        finish()  # the kernels the runners asked for, compiled side by side: one NVRTC rejects fails the build here
        self.choices = {t: made for t, made in self.runners.items() if made.describe()}  # for explain()
        if len(steps) in waits:
            self.binders.append(self._join([finished.get(k) or self.runners[kernels[k].term].finished
                                            for k in waits[len(steps)]]))
        self.binders += [self._copy(t, self.output_block.pointer(k), self.io_strides[t]) for k, t in enumerate(outputs)
                         if direct.get(t) != self.output_block.pointer(k)]
        final = [(var, value) for var, value in updates.items() if sinks.get(value) is not var and value is not var]
        self.stage_block, phases = staged_updates(final, self.pointers, self._viewed)
        self.batches = []
        for copies in phases:
            self.binders += self._update_copies(copies)
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

    def _viewed(self, t):
        """The value ``t`` is a view of (through views of views), or ``t``."""
        viewed = dict(self.views)
        while t in viewed:
            t = viewed[t]
        return t

    def _constant(self, t):
        """Whether ``t`` is a constant of the program or a view of one: no kernel writes it."""
        return self._viewed(t).op is CONST

    def _bound(self, made, workspace):
        """A binder of the calls of runner ``made``: given every value's address, its call at them."""
        return lambda pointers: made.bind([pointers[v] for v in made.values], workspace, self.stream)

    def _beside(self, made, workspace, finished):
        """A binder of the calls of runner ``made`` beside the step (``beside.py``)."""
        def bind(pointers):
            addresses = [pointers[v] for v in made.values]
            return self.overlap.call(made.bind(addresses, workspace, self.stream),
                                     made.bind(addresses, workspace, self.overlap.stream), finished)

        return bind

    def _copy(self, t, destination, strides=None, source=None):
        """A binder of calls writing value ``t`` at ``destination``, packed with ``strides`` (C order if None); from
        ``source``, where given, an address holding it packed."""
        return self._copy_binder(self._made_copy(t, strides, source), t, destination, source)

    def _made_copy(self, t, strides=None, source=None):
        """The ``Copy`` of value ``t`` into a place packed with ``strides``, from where it is or from ``source``."""
        return Copy(t.shape, t.dtype, self.strides[t] if source is None else contiguous_strides(t.shape), strides)

    def _copy_binder(self, copy, t, destination, source):
        return lambda pointers: copy.bind(pointers[t] if source is None else source, destination, self.stream)

    def _update_copies(self, copies):
        """Binders writing ``copies`` (``(value, source, destination)`` triples, none reading what another writes):
        the small memcpys, where there are several, by one batch (``CopyBatch``), the others one by one."""
        made = [self._made_copy(t, source=source) for t, source, _ in copies]
        small = [k for k, copy in enumerate(made) if copy.kernel is None and 0 < copy.nbytes <= BATCHED_BYTES]
        small = small if len(small) > 1 else []
        binders = [self._copy_binder(made[k], t, destination, source)
                   for k, (t, source, destination) in enumerate(copies) if k not in small]
        if small:
            batch = CopyBatch([made[k].nbytes for k in small])
            self.batches.append(batch)
            chosen = [copies[k] for k in small]
            binders.append(lambda pointers: batch.bind(
                [(pointers[t] if source is None else source, destination) for t, source, destination in chosen],
                self.stream))
        return binders

    def _join(self, events):
        """A binder of the call that makes the program's stream wait for the asynchronous calls whose ``events`` (each
        a one-item list, set by its call) say they are done."""
        return lambda pointers: lambda: [self.stream.wait_event(e[0]) for e in events if e[0] is not None]

    def _tune(self):
        feed_block = Block([t.size * t.dtype.itemsize for t in self.feeds])  # freed after
        pointers = self._resolved([feed_block.pointer(k) for k in range(len(self.feeds))])
        tune(self.tuned, (self.arena, self.state_block, self.output_block, feed_block), pointers, self.stream)
        self.stream.synchronize()  # a candidate that failed may have queued work: the state is written after it

    def _resolved(self, feed_pointers):
        """Every value's pointer when the feeds are at ``feed_pointers``: views follow what they view (a crop its
        first element)."""
        pointers = {**self.pointers, **dict(zip(self.feeds, feed_pointers))}
        for t, source in self.views:
            pointers[t] = None if pointers[source] is None else pointers[source] + self.view_bytes.get(t, 0)
        return pointers

    def _blocks(self):
        """The program's own device blocks (a feed read in place must lie apart from them)."""
        return self.arena, self.state_block, self.output_block, self.constant_block, self.stage_block

    @property
    def device_bytes(self):
        return (sum(b.nbytes for b in self._blocks()) + self.staging.nbytes
                + sum(batch.table_bytes for batch in self.batches))

    def _sources(self, feeds):
        return self.staging.sources(feeds, self.prepared)

    def _calls(self, sources):
        """The step's calls for feeds read from ``sources``: made once for each, then kept."""
        calls = self.prepared.get(sources)
        if calls is None:
            places, calls = self.staging.places(sources)
            pointers = self._resolved(places)
            calls += [bind(pointers) for bind in self.binders]
            self.prepared[sources] = calls
        return calls

    # -- running -------------------------------------------------------------------------------

    def write_state(self, var, value):
        """Replace a state value (checked by the caller) once the steps in flight are done, on the current stream;
        the next step waits for the write wherever it runs."""
        import cupy

        self._on_its_device()
        done = self.handoff[1]
        done.synchronize()
        if isinstance(value, np.ndarray):
            self.state[var].set(np.asarray(value, order="C"))
        else:
            self.state[var][...] = value
        done.record(cupy.cuda.get_current_stream())

    def run(self, feeds):
        """Run one step on checked ``feeds`` (``{name: NumPy or CuPy array}``); returns the output arrays.

        A step whose graph exists and whose feeds are all read in place is launched on the caller's stream: that
        orders it after the caller's work and the caller's next work after it without the hand-over between streams
        (a few microseconds of a call). It waits for ``done`` first, since the last step may have run on another
        stream and steps share the arena (a wait the device passes at once on the same stream). Any other step runs
        on the program's stream (``_on_stream``)."""
        import cupy

        self._on_its_device()
        sources = self._sources(feeds)
        graph = self.graphs.get(sources)
        if graph is None or self.staging.staged(sources):
            return self._on_stream(feeds, sources, self._run_step)
        caller, done = cupy.cuda.get_current_stream(), self.handoff[1]
        caller.wait_event(done)
        graph.launch(caller)
        done.record(caller)
        return list(self.outputs)

    def _on_its_device(self):
        """Refuse a call made while another GPU is current: the program's buffers, streams and graphs are its own
        GPU's."""
        import cupy

        current = cupy.cuda.runtime.getDevice()
        if current != self.device:
            raise BackendError(f"this program was built on GPU {self.device} and runs there, but GPU {current} is "
                               f"current: call it under `with cupy.cuda.Device({self.device}):`")

    def profile(self, feeds):
        """Run one step eagerly with a device event around each call: ``[(kernel label, milliseconds)]``. Once
        the step has run (its first call compiles and loads its kernels, which may wait for the GPU), the calls
        are queued behind holds of ``HELD_CALLS`` calls each (``holding``), so that they run back to back."""
        import cupy

        self._on_its_device()
        marks = []

        def timed(sources):
            self.overlap.in_order = True  # every kernel on the program's stream, between its events
            hold = Hold(self.stream) if self.prepared else None
            calls = self._calls(sources)
            staged = len(calls) - len(self.binders)
            for call in calls[:staged]:
                call()
            labelled = list(zip(self.labels, calls[staged:]))
            for first in range(0, len(labelled), HELD_CALLS):
                if hold:
                    hold.hold()
                for label, call in labelled[first:first + HELD_CALLS]:
                    start = self.stream.record()
                    call()
                    marks.append((label, start, self.stream.record()))
                if hold:
                    hold.release()
            for call in calls[staged + len(self.labels):]:
                call()

        try:
            self._on_stream(feeds, self._sources(feeds), timed)
        finally:
            self.overlap.in_order = False
        self.stream.synchronize()
        return [(label, cupy.cuda.get_elapsed_time(start, end)) for label, start, end in marks]

    def _on_stream(self, feeds, sources, step):
        """Stage the feeds that need it and run ``step(sources)`` on the program's stream, ordered after the
        caller's work."""
        import cupy

        caller = cupy.cuda.get_current_stream()
        started, done = self.handoff
        staged = self.staging.staged(sources)
        if staged:
            self.staging.stage_host(feeds, sources)
        started.record(caller)
        self.stream.wait_event(started)
        self.stream.wait_event(done)  # the last step, where it ran on another stream
        try:
            with self.stream:
                if staged:
                    self.staging.stage_device(feeds, sources)
                step(sources)
        finally:  # what a failed step queued is waited for too
            done.record(self.stream)
            caller.wait_event(done)
        return list(self.outputs)

    def _run_step(self, sources):
        """The step's graph for ``sources`` replayed, or captured (from the second call: the first compiles, loads
        modules and warms cuBLASLt up) and launched; without CUDA graphs, its calls one by one."""
        graph = self.graphs.get(sources)
        if graph is None:
            first, calls = not self.prepared, self._calls(sources)
            if not self.use_graph or first:
                return [call() for call in calls]
            self.graphs[sources] = graph = captured(calls, self.stream)
        graph.launch(self.stream)
