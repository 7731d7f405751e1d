"""A fused region on the CPU: its body, op by op, into the region's outputs and a small workspace.

NumPy has no fused kernels, so a region runs as a sequence of ufunc calls; what fusion buys here
is that the body's intermediates live in the step's workspace, reused as they die, and that the
root's chain of ops computes straight into the output (``tanh(x @ W + b)`` needs no scratch).

An output may share the buffer of an input (the planner decides, among the pairs ``inplace_pairs``
allows): the body then never writes that output before its last read of the input.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np

from ...exprgraph.graph import post_order
from ...exprgraph.ops import BROADCAST_TO, CONST, COS, EXP, EXPM1, LOG, LOG1P, MAX, MEAN, PARAM, SIN, SUM, TANH
from ...memplan import ReadBeforeWrite, aligned
from . import csource, loops, native
from .kernels import INPLACE, SCRATCH_ALIGNMENT, Emitter, c_strided, emit, same_elements
from .standins import may_share_memory


@dataclass(frozen=True)
class _Body:
    outputs: tuple
    order: tuple
    position: dict
    last_read: dict
    output_index: dict


def _body(outputs):
    order = tuple(post_order(outputs))
    last_read = {}
    for i, t in enumerate(order):
        for a in t.args:
            last_read[a] = i
    for t in reversed(order):  # a broadcast is a view: its source is read wherever the view is
        if t.op is BROADCAST_TO and t in last_read:
            source = t.args[0]
            last_read[source] = max(last_read[source], last_read[t])
    return _Body(outputs, order, {t: i for i, t in enumerate(order)}, last_read,
                 {t: k for k, t in enumerate(outputs)})


BLOCKED = -1  # an ``alias`` of the root's output for measuring: as if it held an input until the root


def _viewed(t):
    """The value a chain of broadcasts ``t`` reads (``t`` itself if it is no broadcast)."""
    while t.op is BROADCAST_TO:
        t = t.args[0]
    return t


def _reads_in_place(t, value):
    """Whether ``t`` reads ``value`` only where its output may alias the operand: directly (a broadcast
    of ``value`` reads each element many times, after earlier elements of the output are written)."""
    return all(a is value and position in INPLACE.get(t.op, ()) and value.shape == t.shape
               for position, a in enumerate(t.args) if _viewed(a) is value)


class _Run:
    """One emission of a body: which array holds each body value, and which scratch it owns."""

    def __init__(self, em, body, args, outs, alias):
        self.em, self.body, self.outs = em, body, outs
        self.values, self.owned = {}, {}
        self.out0_blocked = alias.get(0) == BLOCKED
        self.out0_holder = next((p for p in body.order if p.op is PARAM and p.attr("index") == alias.get(0)),
                                None)
        self.args = args

    def dead_at(self, value, i):
        return self.body.last_read.get(value, -1) <= i

    def destination(self, t, i):
        if t in self.body.output_index:
            return self.outs[self.body.output_index[t]]
        for a in dict.fromkeys(t.args):
            array = self.owned.get(a)
            if array is not None and self.dead_at(a, i) and (a.shape, a.dtype) == (t.shape, t.dtype) and _reads_in_place(t, a):
                del self.owned[a]
                self.owned[t] = array
                return array
        if self._out0_free_for(t, i):
            self.out0_holder = t
            return self.outs[0]
        array = self.em.scratch(t.shape, t.dtype)
        self.owned[t] = array
        return array

    def _out0_free_for(self, t, i):
        """Whether ``t`` may be computed into the root's output, to be overwritten by the root later."""
        root = self.body.outputs[0]
        if self.out0_blocked or root.op not in INPLACE or (t.shape, t.dtype) != (root.shape, root.dtype):
            return False
        written = self.body.position[root]
        if i > written or self.body.last_read.get(t, -1) > written:
            return False  # the root is there already (other outputs may read it), or would overwrite it before its last read
        if self.body.last_read.get(t) == written and not _reads_in_place(root, t):
            return False  # the root would overwrite it while still reading it elsewhere
        holder = self.out0_holder
        return holder is None or self.body.last_read.get(holder, -1) < i or (
            self.dead_at(holder, i) and _reads_in_place(t, holder))

    def run(self):
        for i, t in enumerate(self.body.order):
            if t.op is PARAM:
                self.values[t] = self.args[t.attr("index")]
            elif t.op is CONST:
                self.values[t] = t.attr("value").array
            elif t.op is BROADCAST_TO:
                self.values[t] = np.broadcast_to(self.values[t.args[0]], t.shape)
            else:
                out = self.destination(t, i)
                emit(self.em, t, [self.values[a] for a in t.args], out)
                self.values[t] = out
                for a in dict.fromkeys(t.args):
                    if self.dead_at(a, i) and a in self.owned and self.owned[a] is not out:
                        self.em.release(self.owned.pop(a))


def emit_fused(em, outputs, args, outs, alias, batch=None):
    """Emit the body ``outputs`` reading ``args`` into ``outs`` (a list, one array per output): one compiled loop
    nest where a ``batch`` of native regions is given and takes it, else NumPy calls op by op.

    ``alias``: ``{output index: input index}`` for outputs that share an input's buffer (a loop nest reads each
    element's operands before it writes it, so it may).
    """
    pieces = _native(em, outputs, args, outs, batch) if batch is not None else None
    if pieces is not None:
        numpy_calls = Emitter(em.workspace)  # what runs instead if the library cannot be built
        _Run(numpy_calls, _body(outputs), args, outs, alias).run()
        em.calls.append(batch.add(pieces, numpy_calls.calls))
        return
    _Run(em, _body(outputs), args, outs, alias).run()


NUMPY_UNARY = {EXP: np.exp, LOG: np.log, LOG1P: np.log1p, EXPM1: np.expm1, TANH: np.tanh, SIN: np.sin, COS: np.cos}
NUMPY_REDUCTIONS = frozenset({SUM, MEAN, MAX})  # NumPy's, in its own order, between loop nests


def _numpy_op(t):
    """Whether body term ``t`` stays NumPy's between loop nests: a transcendental, or a reduction."""
    return t.op in NUMPY_UNARY or t.op in NUMPY_REDUCTIONS


def _stages(order):
    """Each term's stage: the number of NumPy ops (``_numpy_op``) on its longest path from the region's operands. A
    stage's loop nests compute its other terms; NumPy computes its own ops first, from values of the stage before."""
    stage = {}
    for t in order:
        before = max((stage[a] for a in t.args), default=0)
        stage[t] = before + 1 if _numpy_op(t) else before
    return stage


MAX_TERMS = 256  # a larger region's C takes the compiler longer than its loop nest saves


def _numpy_passes(outputs, args, outs):
    """How many NumPy calls (passes over memory) the region takes op by op."""
    probe = Emitter()
    _Run(probe, _body(outputs), args, outs, {}).run()
    return len(probe.calls)


def _numpy_calls(t, arrays, out):
    """NumPy's calls computing body term ``t`` (a ``_numpy_op``) from ``arrays`` into ``out``."""
    if t.op in NUMPY_UNARY:
        return [functools.partial(NUMPY_UNARY[t.op], arrays[0], out=out)]
    calls = Emitter()
    emit(calls, t, arrays, out)
    return calls.calls


def _native(em, outputs, args, outs, batch=None):
    """The pieces of a region computed in C: one loop nest, or loop nests with the transcendentals and reductions
    between them (``_op_pieces``: NumPy's own loops or calls, so every value has NumPy's bits: a reduction sums in
    NumPy's order; a sum or mean over all but a run of the axes of a value stored in C order is C's, in NumPy's order
    too), the values passed between them in workspace scratch, where that makes fewer passes over memory than NumPy's
    calls op by op; None where C cannot compute it, it would not pay, or the plan's workspace cannot hold the
    scratch (``_pays``). A stage's loop nests go largest first: a smaller one may write an output over an operand that a larger
    one reads broadcast, never the other way round. Where a ``batch`` is given, a large region runs in parts on the
    pool's threads (``_in_parts``)."""
    order = post_order(outputs)
    if len(order) > MAX_TERMS:
        return None
    sources, targets = {t: args[t.attr("index")] for t in order if t.op is PARAM}, tuple(zip(outputs, outs))
    stage = _stages(order)
    if max(stage.values()) == 0:
        found = csource.region(outputs, args, outs)
        return None if found is None else _in_parts(batch, [found], order, stage, _Arrays(sources, {}, targets), set())
    if any(_numpy_op(t) and any(a.op is CONST for a in t.args) for t in order):
        return None
    kept = {t for t in order if _numpy_op(t)}  # values kept in scratch between loop nests
    kept |= {a for t in kept for a in t.args if a.op is not PARAM}
    kept |= {a for t in order if not _numpy_op(t) for a in t.args if stage[a] < stage[t] and a.op not in (PARAM, CONST)}
    written = set(_written_directly(order, stage, _Arrays(sources, {}, targets)))
    kept -= written  # those kept in their outputs
    need = sum(aligned(t.size * t.dtype.itemsize, SCRATCH_ALIGNMENT) for t in kept)
    if em.workspace is not None and em.top + need > len(em.workspace):
        return None
    mark = em.mark()
    arrays = _Arrays(sources, {t: em.scratch(t.shape, t.dtype) for t in order if t in kept}, targets)
    pieces = _pieces(order, stage, arrays, written)
    for array in arrays.scratch.values():
        em.release(array)
    if pieces is not None and _pays(pieces, _numpy_passes(outputs, args, outs)):
        return _in_parts(batch, pieces, order, stage, arrays, written)
    em.rewind(mark)
    return None


def _pays(pieces, passes):
    """Whether ``pieces`` beat NumPy's ``passes`` op by op: fewer passes over memory, or as many, every one C, which a
    step calls with its neighbours from C at once rather than each from Python (a small layer's ``tanh(x @ W + b)``:
    its add a loop nest and its tanh NumPy's own loop, called from C)."""
    return len(pieces) < passes or (len(pieces) == passes and not any(callable(piece) for piece in pieces))


@dataclass(frozen=True)
class _Arrays:
    """A region's arrays: its operands' and the scratch of the values it keeps between loop nests (``{term: array}``
    each), and its outputs' (``(term, array)`` pairs, in the order of its outputs)."""

    sources: dict
    scratch: dict
    outs: tuple

    def part(self, axis, start, stop):
        """The arrays of a part of the region's elements: those from ``start`` to ``stop`` along its ``axis``; an
        operand broadcast along that axis whole."""
        ndim = self.outs[0][1].ndim
        return _Arrays({t: _part(a, ndim, axis, start, stop) for t, a in self.sources.items()},
                       {t: _part(a, ndim, axis, start, stop) for t, a in self.scratch.items()},
                       tuple((t, _part(a, ndim, axis, start, stop)) for t, a in self.outs))


def _part(a, ndim, axis, start, stop):
    """``a``'s elements from ``start`` to ``stop`` along axis ``axis`` of the ``ndim`` axes it broadcasts against
    (``_Arrays.part``)."""
    d = axis - (ndim - a.ndim)
    if d < 0 or a.shape[d] == 1:
        return a
    return a[(slice(None),) * d + (slice(start, stop),)]


def _pieces(order, stage, arrays, written):
    """The pieces computing the region (``order``, each term's ``stage``) from ``arrays``: each stage's NumPy ops
    (``_op_pieces``), then its loop nests, into the scratch of the values kept and, at the last stage, into the
    outputs (those ``written`` by a NumPy op straight into, ``_written_directly``); None where C does not compute a
    loop nest."""
    pieces, known, scratch, last = [], dict(arrays.sources), arrays.scratch, max(stage.values())
    direct = {t: a for t, a in reversed(arrays.outs) if t in written}  # (an output's first array, where it is twice)
    for s in range(last + 1):
        for t in order:
            if stage[t] == s and _numpy_op(t):
                into = direct[t] if t in direct else scratch[t]
                pieces += _op_pieces(t, [known[a] for a in t.args], into)
                known[t] = into
        targets = [(t, scratch[t]) for t in order if stage[t] == s and t in scratch and t not in known]
        if s == last:
            targets += [(t, a) for t, a in arrays.outs if direct.get(t) is not a]
        for shape in sorted({a.shape for _, a in targets}, key=math.prod, reverse=True):
            found = csource.loop_nest([(t, a) for t, a in targets if a.shape == shape], known, shape)
            if found is None:
                return None
            pieces.append(found)
        known.update({t: a for t, a in targets if t not in known})
    return pieces


def _written_directly(order, stage, arrays):
    """``{term: output array}``: the outputs that a NumPy op of the region (a transcendental, a reduction) writes
    straight into rather than into scratch a loop nest then copies, where every operand sharing the output's memory is
    read only at earlier stages (a stage's NumPy ops run before its loop nests), and not by the last stage's loop
    nest, which computes every other output, with what it reads at its own stage, from the operands again."""
    late = set()
    for o, _ in arrays.outs:
        stack = [o]
        while stack:
            r = stack.pop()
            if r not in late and not _numpy_op(r):
                late.add(r)
                stack += [a for a in r.args if stage[a] == stage[r]]
    direct = {}
    for t, out in arrays.outs:
        if not _numpy_op(t) or t in direct:
            continue
        shared = {p for p, a in arrays.sources.items() if may_share_memory(out, a)}
        readers = [r for r in order if shared.intersection(r.args)]
        if all(stage[r] < stage[t] and r not in late for r in readers):
            direct[t] = out
    return direct


def _op_pieces(t, arrays, out):
    """The pieces computing body term ``t`` (a ``_numpy_op``) from ``arrays`` into ``out``: C where it has NumPy's
    bits (a transcendental's own loop of NumPy's, ``loops.piece``; a sum or mean in NumPy's order,
    ``csource.reduction``), NumPy's calls elsewhere."""
    if t.op in NUMPY_UNARY:
        found = loops.piece(NUMPY_UNARY[t.op], arrays[0], out)
    else:
        found = csource.reduction(t.op, t.attr("axes"), arrays[0], out) if t.op in (SUM, MEAN) else None
    return [found] if found is not None else _numpy_calls(t, arrays, out)


def _in_parts(batch, pieces, order, stage, arrays, written):
    """``pieces``, or, where a ``batch`` is given and the region is large enough to part (``native.ELEMENTS_A_PART``), the
    choice of them and of one piece running them in parts on the pool's threads (``native.Batch.split``), each on
    its stretch of the elements along ``_split_axis``: every value an element of a part writes depends on elements
    of that part alone, so each part is computed as the whole computes it, with the same bits."""
    if batch is None or any(callable(p) for p in pieces):
        return pieces
    axis = _split_axis(order, arrays)
    length = arrays.outs[0][1].shape[axis] if axis is not None else 1
    count = min(native.parts(arrays.outs[0][1].size, native.ELEMENTS_A_PART), length)
    if count < 2:
        return pieces
    cuts = [length * k // count for k in range(count + 1)]
    parts = [_pieces(order, stage, arrays.part(axis, start, stop), written) for start, stop in zip(cuts, cuts[1:])]
    if None in parts or any(callable(p) for part in parts for p in part):
        return pieces
    return [batch.split(parts, pieces)]


def _split_axis(order, arrays):
    """The axis along which the region's elements part (its first of more than one element), or None where
    a value it writes does not part along it (an output or a kept value broadcast along it, a reduction over it) or
    an output shares memory with an operand other than element for element."""
    shape = arrays.outs[0][1].shape
    axis = next((d for d, n in enumerate(shape) if n > 1), None)
    written = [a for _, a in arrays.outs] + list(arrays.scratch.values())
    if axis is None or any(a.ndim != len(shape) or a.shape[axis] != shape[axis] for a in written):
        return None
    if any(t.op in NUMPY_REDUCTIONS and (t.args[0].ndim != len(shape) or axis in t.attr("axes")) for t in order):
        return None
    outs = [a for _, a in arrays.outs]
    if any(may_share_memory(out, a) and not same_elements(out, a) for out in outs for a in arrays.sources.values()):
        return None
    return axis


def _measure(outputs, arg_types, alias):
    """The workspace the region needs: NumPy's op by op, or, where C computes it, its loop nests' (the larger)."""
    em = Emitter()
    args = [c_strided(shape, dtype) for shape, dtype in arg_types]
    outs = [c_strided(o.shape, o.dtype) for o in outputs]
    emit_fused(em, outputs, args, outs, alias)
    if native.toolchain() is None:
        return em.top
    staged = Emitter()
    _native(staged, outputs, args, outs)
    return max(em.top, staged.top)


def plan_fused(outputs, arg_types):
    """``(workspace bytes, in-place pairs, costs)`` of a region.

    Pairs ``(output, input)`` may share a buffer: the body never reads the input after it writes
    the output; they are a ``memplan.ReadBeforeWrite`` over output and input numbers (a region of n outputs and n
    inputs may have n * n of them). Sharing the root's output takes it away as scratch, so the pair's workspace (in
    ``costs``, by pair of numbers) may be larger. ``arg_types`` is a tuple of ``(shape, dtype)``.
    """
    body = _body(outputs)
    workspace = _measure(outputs, arg_types, {})
    parameters = {p.attr("index"): p for p in body.order if p.op is PARAM}
    written = tuple(body.position[out] for out in outputs)
    last_read = tuple(body.last_read.get(p, -1) for p in parameters.values())
    number = {p: m for m, p in enumerate(parameters.values())}
    at_write = frozenset((k, number[p]) for k, out in enumerate(outputs) for p in set(out.args)  # read as written
                         if p in number and last_read[number[p]] == written[k]
                         and (p.shape, p.dtype) == (out.shape, out.dtype) and _reads_in_place(out, p))
    pairs = ReadBeforeWrite(tuple(range(len(outputs))), written, tuple((o.shape, o.dtype) for o in outputs),
                            tuple(parameters), last_read, tuple((p.shape, p.dtype) for p in parameters.values()), at_write)
    shared = pairs.candidates(0)
    shared_root = _measure(outputs, arg_types, {0: BLOCKED}) if shared else None  # measured once, for any input
    return workspace, pairs, {(0, pairs.reads[m]): shared_root for m in shared}
