"""The CPU executor: every value an array at a fixed place, every kernel a list of NumPy calls.

Everything is decided when the program is built: the arena and the state block are allocated
once, each value is a view into one of them (or a constant's own array), and each kernel is a
list of ``functools.partial`` calls with their ``out=`` arrays bound. A call then copies the feeds
in, runs the calls, copies the outputs out and writes the updates.
"""

import contextlib
import time

import numpy as np

from ...errors import BackendError, IndexRangeError
from ...exprgraph import gathering, windowing
from ...exprgraph.ops import BROADCAST_TO, CONST, FLIP, FUSED_OP, TRANSPOSE, VAR, WINDOWS
from ...exprgraph.ops.collectives import ALL_REDUCE
from ...memplan import aligned, unallocatable
from .. import interface
from . import blas, native
from .fused import emit_fused
from .kernels import Emitter, emit

ALIGNMENT = 64
# NumPy's ufuncs allocate an iteration buffer of this many elements per operand whenever they
# broadcast; 8192 by default. At 1024 a float32 broadcast add allocates 4 KiB an operand instead of
# 32 KiB, and ran as fast or faster (measured: 1024x1024 + 1024, 144 us against 208 us).
UFUNC_BUFFER = 1024


try:  # NumPy 2's context variable of ufunc settings
    from numpy._core.umath import _extobj_contextvar as _settings, _make_extobj

    _QUIET = _make_extobj(all="ignore", bufsize=UFUNC_BUFFER)
except ImportError:
    _settings = None


class _Quiet:
    """NumPy's floating-point errors ignored and its ufunc buffers ``UFUNC_BUFFER`` elements, while in ``with``: both
    set at once through NumPy 2's context variable of ufunc settings (0.2 us a step, where ``np.errstate`` and
    ``np.setbufsize`` took 3), or through those where a NumPy has moved its private names."""

    def __enter__(self):
        if _settings is not None:
            self.token = _settings.set(_QUIET)
        else:
            self.buffer = np.setbufsize(UFUNC_BUFFER)
            self.errors = np.seterr(all="ignore")

    def __exit__(self, *raised):
        if _settings is not None:
            _settings.reset(self.token)
        else:
            np.seterr(**self.errors)
            np.setbufsize(self.buffer)


def aligned_bytes(nbytes, what="a block"):
    """A zeroed uint8 array of ``nbytes`` whose first byte is ``ALIGNMENT``-aligned; a PlanError naming ``what``
    if the machine cannot allocate it."""
    try:
        raw = np.zeros(nbytes + ALIGNMENT, np.uint8)
    except (MemoryError, ValueError) as error:  # ValueError: more bytes than an array may hold
        raise unallocatable(what, nbytes, error) from None
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes]


def _view(block, offset, shape, dtype):
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return block[offset:offset + nbytes].view(dtype).reshape(shape)


def _derived(t, source):
    """The array of a view kernel: a transpose, a broadcast, a flip, the windows or a copy-free reshape
    of ``source``."""
    if t.op is TRANSPOSE:
        return np.transpose(source, t.attr("axes"))
    if t.op is BROADCAST_TO:
        return np.broadcast_to(source, t.shape)
    if t.op is FLIP:  # indexed with an ellipsis so that a 0-d source gives a view, not a copy
        axes = t.attr("axes")
        return source[tuple(slice(None, None, -1) if a in axes else slice(None) for a in range(t.ndim)) + (...,)]
    if t.op is WINDOWS:
        return windowing.window_view(source, t.attrs.window_shape, t.attrs.strides, t.attrs.dilation)
    return np.reshape(source, t.shape, copy=False)


def _load(destination, feeds, name):
    np.copyto(destination, feeds[name])


def _memory(a):
    """Where ``a``'s elements lie and their layout: equal for the same elements in the same layout (not, say, for
    ``x`` and ``x.T``)."""
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype


def _same_memory(a, b):
    """Whether ``a`` and ``b`` are the same elements in the same layout."""
    return _memory(a) == _memory(b)


class Executor(interface.Executor):
    """Runs one compiled step on the CPU; see the module docstring."""

    def __init__(self, kernels, steps, plan, signature, outputs, updates, sinks):
        self.arena = aligned_bytes(plan.peak_bytes, "an arena")
        self.state_block, self.state = self._state_block(signature.state)
        self.feeds = {}
        arrays = {v: self.state[v] for v in signature.state}
        arrays.update({value: self.state[var] for value, var in sinks.items()})
        self.calls, self.call_kernel, self.labels = [], [], []
        launched = []
        self.native = native.Batch() if native.toolchain() else None
        numpy_blas = False
        for i, (kernel, step) in enumerate(zip(kernels, steps)):
            for args in {id(t.args): t.args for t in kernel.terms}.values():  # a kernel's results share their args
                for a in args:
                    if a not in arrays and a.op is CONST:
                        arrays[a] = a.attr("value").array
            for t in kernel.terms:
                if t in plan and t not in arrays:
                    arrays[t] = _view(self.arena, plan[t].offset, t.shape, t.dtype)
            if step.view_of is not None:
                arrays[kernel.term] = _derived(kernel.term, arrays[step.view_of])
                continue
            workspace = ("workspace", i)
            size = plan[workspace].nbytes if workspace in plan else 0
            em = Emitter(_view(self.arena, plan[workspace].offset if size else 0, (size,), np.uint8), self.native)
            self._emit(em, kernel, arrays)
            numpy_blas |= em.numpy_blas
            self.calls += em.calls
            self.call_kernel += [kernel] * len(em.calls)
            what = f"load {kernel.term.name}" if kernel.term.op is VAR else kernel.term.op.name  # as explain says
            self.labels += [f"k{i}.{what} {kernel.term.shape}"] * len(em.calls)
            launched += [i] if em.calls else []
        self.launched = frozenset(launched)
        self.kernel_calls, self.kernel_of_call = self.calls, self.call_kernel  # each kernel's calls apart (``profile``)
        if self.native is not None:  # regions on one thread where NumPy's BLAS runs: its idle threads spin on the other cores
            self.calls, firsts = self.native.bind(self.calls, parted=not numpy_blas)
            self.kernel_calls = self.native.unmerged(self.kernel_calls)
            self.call_kernel = [self.call_kernel[i] for i in firsts]  # a merged run of C calls raises nothing
        # OpenBLAS's threads held to one while the step's own threads compute (``blas.one_thread``), where every
        # product is C's, checked to give NumPy's bits on one thread: NumPy's own may give others there
        held = self.native is not None and self.native.pooled and not numpy_blas
        self.threads = blas.one_thread() if held else contextlib.nullcontext()
        for t in list(outputs) + list(updates.values()):
            if t not in arrays and t.op is CONST:
                arrays[t] = t.attr("value").array
        self.outputs = [arrays[t] for t in outputs]
        self.final = [(self.state[var], arrays[value]) for var, value in updates.items()
                      if sinks.get(value) is not var and value is not var]
        self.staged = self._staging()

    @staticmethod
    def _state_block(state):
        offsets, top = {}, 0
        for v, value in state.items():
            offsets[v] = top
            top += aligned(value.nbytes, ALIGNMENT)
        block = aligned_bytes(top, "a state block")
        arrays = {}
        for v, value in state.items():
            arrays[v] = _view(block, offsets[v], v.shape, v.dtype)
            arrays[v][...] = value
        return block, arrays

    def _emit(self, em, kernel, arrays):
        t = kernel.term
        if t.op is VAR:
            em.call(_load, arrays[t], self.feeds, t.name)
            return
        args = [arrays[a] for a in t.args]
        if t.op is FUSED_OP:
            outs = [arrays[d] for d in kernel.terms]
            held = {_memory(arg): j for j, arg in enumerate(args)}  # (by memory, not every output against every input)
            alias = {k: held[_memory(out)] for k, out in enumerate(outs) if _memory(out) in held}
            emit_fused(em, t.attr("outputs"), args, outs, alias, self.native)
        elif t.op is ALL_REDUCE:  # the mean over a world of one rank: a copy, unless written in place
            for result, arg in zip(kernel.terms, args):
                if not _same_memory(arrays[result], arg):
                    em.call(np.copyto, arrays[result], arg)
        else:
            outs = tuple(arrays[d] for d in kernel.terms)
            emit(em, t, args, outs if len(outs) > 1 else outs[0])

    def _staging(self):
        """Update sources that share memory with a state buffer another update writes: copied aside first.

        ``updates={W: V, V: W}`` swaps: both values must be read before either is written.
        """
        staged = []
        for k, (destination, source) in enumerate(self.final):
            if any(np.shares_memory(source, other) for other, _ in self.final):
                stage = aligned_bytes(source.nbytes, "a staging buffer").view(source.dtype).reshape(source.shape)
                staged.append((stage, source))
                self.final[k] = (destination, stage)
        return staged

    def write_state(self, var, value):
        np.copyto(self.state[var], value)

    def run(self, feeds):
        """Run one step on checked ``feeds`` (``{name: array}``); returns copies of the outputs."""
        def step():
            return self._step(feeds, self.calls, self.call_kernel, lambda call, done: call())

        pacing = self.native.pacing if self.native is not None else None
        return step() if pacing is None else pacing.run(step)

    def profile(self, feeds):
        """``[(kernel label, milliseconds)]`` for one step on ``feeds``, which updates the state as ``run`` does: the
        host's clock around each kernel's calls, made one by one (a step makes consecutive calls of C as one)."""
        kernels = dict.fromkeys(self.labels, 0.0)

        def timed(call, done):
            start = time.perf_counter()
            call()
            kernels[self.labels[done]] += (time.perf_counter() - start) * 1e3

        self._step(feeds, self.kernel_calls, self.kernel_of_call, timed)
        return list(kernels.items())

    def _step(self, feeds, calls, call_kernel, make):
        """Run ``calls`` (``call_kernel[k]``: the kernel call ``k`` belongs to) on checked ``feeds``, each through
        ``make(call, its index)``; write the updates; return copies of the outputs."""
        for name, value in feeds.items():  # a feed of the program's own state must be its value before the call
            self.feeds[name] = value.copy() if np.may_share_memory(value, self.state_block) else value
        done = 0
        try:
            with _Quiet(), self.threads:
                for call in calls:
                    make(call, done)
                    done += 1
        except (ArithmeticError, ValueError) as error:
            term = call_kernel[done].term
            raise BackendError(f"{term!r}, built at {term.where_built}, failed on these values: {error}") from None
        except IndexRangeError as error:  # only gathers raise it
            raise gathering.out_of_range(call_kernel[done].term, error) from None
        finally:
            self.feeds.clear()  # the caller's arrays are not kept
        results = [np.array(out) for out in self.outputs]
        for stage, source in self.staged:
            np.copyto(stage, source)
        for destination, source in self.final:
            np.copyto(destination, source)
        return results
