"""Each op as NumPy calls that write into given arrays: what the CPU executor runs, allocation-free.

``emit(emitter, term, args, out)`` appends to ``emitter`` the calls that compute ``term`` from the
arrays ``args`` into ``out`` (``EMITTERS[op](emitter, attributes, args, out)`` underneath, keyed by
the op itself, the attributes read by name: ``attrs.axes``).
Temporaries come from ``emitter.scratch``, views of the step's workspace in the arena; an
``Emitter`` without a workspace only measures how much it would need. The calls mirror the
reference interpreter's formulas (``exprgraph.semantics``) operation by operation, in the same
dtypes, so results agree with it to the last bit wherever NumPy's own kernels do. As there, the
ops that compute in float32 (``Op.computes_in_float32``) take float16 and bfloat16 in float32
scratch and round their result once, in a fused region too (it emits through ``emit``). Composite
ops (sigmoid, softplus, gelu) have no emitter: they are spelled out in primitives before any
backend sees them (``rules.primitives``).

``INPLACE[op]`` lists the operands that ``out`` may alias: the op reads each element of them
before writing the same element of ``out``.
"""

import functools
import itertools
import math

import numpy as np

from ...exprgraph import attending, gathering, windowing
from ...exprgraph.term import make
from ...exprgraph.dtypes import as_strided, finfo, is_float, is_float8, kind_of
from ...exprgraph.ops import random
from ...exprgraph.ops import (
    ADD, ADD_AT, ATTENTION, ATTENTION_GRAD, CAST, CONV, DIVIDE, EINSUM, LOG_SOFTMAX, LOGSUMEXP, MATMUL, MAX, MAXIMUM, MEAN,
    OVERLAP_ADD, PAD, RELU, RESHAPE, SOFTMAX, STOP_GRADIENT, SUBTRACT, FLOAT8_GRADIENT, SUM, TAKE, TAKE_ALONG_AXIS,
    UFUNCS, RANDOM_UNIFORM, WHERE, parameter, ufunc_loop,
)
from ...exprgraph.windowing import dilated_size
from ...errors import PlanError
from ...memplan import aligned
from . import attention, blas, csource, gemm, loops, native, philox
from .standins import StandIn, may_share_memory
from .lowering import ATTENTION_GRAD_GIVEN, ATTENTION_KEEPING

SCRATCH_ALIGNMENT = 64


def c_strided(shape, dtype):
    """A stand-in array of ``shape`` for measuring: C strides over one element, never read (``standins``)."""
    itemsize = np.dtype(dtype).itemsize
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return as_strided(np.empty(1, dtype), shape, tuple(reversed(strides)), writeable=True).view(StandIn)


class Emitter:
    """The calls of one step, and the scratch arrays they use, carved from its workspace.

    Without a workspace it only measures; with one, a request beyond it is the planner's error.
    """

    def __init__(self, workspace=None, native=None):
        self.workspace = workspace
        self.native = native  # a ``native.Batch`` where C loop nests may take strided copies, else None
        self.numpy_blas = False  # whether a call of NumPy's that reaches its BLAS was emitted (``executor``'s threads)
        self.calls = []
        self.top = 0
        self._free = {}  # aligned size -> offsets released for reuse
        self._offsets = {}  # id(scratch array) -> (offset, size)

    def scratch(self, shape, dtype):
        size = aligned(math.prod(shape) * np.dtype(dtype).itemsize, SCRATCH_ALIGNMENT)
        reusable = self._free.get(size)
        if reusable:
            offset = reusable.pop()
        else:
            offset, self.top = self.top, self.top + size
        if self.workspace is None:
            array = c_strided(shape, dtype)
        elif self.top > len(self.workspace):
            raise PlanError(f"a kernel needs {self.top} bytes of workspace and the plan gave it {len(self.workspace)}")
        else:
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            array = self.workspace[offset:offset + nbytes].view(dtype).reshape(shape)
        self._offsets[id(array)] = (offset, size)
        return array

    def release(self, array):
        offset, size = self._offsets.pop(id(array))
        self._free.setdefault(size, []).append(offset)

    def call(self, fn, *args, **kwargs):
        self.calls.append(functools.partial(fn, *args, **kwargs))

    def mark(self):
        """Where the scratch stands now, for ``rewind``."""
        return self.top, {size: list(offsets) for size, offsets in self._free.items()}

    def rewind(self, mark):
        """Forget the scratch taken (and released) since ``mark``: an attempt that was given up."""
        self.top, self._free = mark[0], {size: list(offsets) for size, offsets in mark[1].items()}


def _floating(em, x):
    """``x`` in the float dtype the op computes in (a scratch copy when ``x`` is integral)."""
    if is_float(x.dtype):
        return x, False
    dtype = ufunc_loop(np.exp, (x.dtype,))[-1]
    converted = em.scratch(x.shape, dtype)
    em.call(np.copyto, converted, x, casting="unsafe")
    return converted, True


def _ufunc(op):
    """An elementwise op alone (not in a fused region): a C loop nest where native code is at hand (``_strided``), so
    a step makes it with its neighbours in one call from Python; NumPy's ufunc elsewhere."""
    def emit(em, attrs, args, out):
        _strided(em, [(op, out, list(args))])

    return emit


def _relu(em, attrs, args, out):
    em.call(np.maximum, args[0], np.zeros((), args[0].dtype), out=out)


def _where(em, attrs, args, out):
    condition, a, b = args
    truth = condition
    if condition.dtype != np.bool_:  # a number is true where it is not zero, as in np.where
        truth = em.scratch(condition.shape, np.bool_)
        em.call(np.not_equal, condition, 0, out=truth)
    em.call(np.copyto, out, b)
    em.call(np.copyto, out, a, where=truth)
    if truth is not condition:
        em.release(truth)


def _cast(em, attrs, args, out):
    if is_float8(out.dtype):  # saturated, as ``dtypes.converted`` defines it
        largest = float(finfo(out.dtype).max)
        clipped = em.scratch(args[0].shape, np.promote_types(args[0].dtype, np.float32) if kind_of(args[0].dtype) != "f"
                             else args[0].dtype)
        em.call(np.clip, args[0], -largest, largest, out=clipped)
        em.call(np.copyto, out, clipped, casting="unsafe")
        em.release(clipped)
        return
    em.call(np.copyto, out, args[0], casting="unsafe")


def _sum(em, attrs, args, out):
    _reduction(em, SUM, attrs, args[0], out, _numpy_sum)


def _numpy_sum(em, attrs, x, out):
    em.call(np.add.reduce, x, axis=attrs.axes, dtype=out.dtype, out=out, keepdims=attrs.keepdims)


def _reduction(em, op, attrs, x, out, numpy):
    """The sum or mean ``numpy(em, attrs, x, out)`` emits as NumPy's calls, as C in NumPy's order instead where
    native code is at hand and ``csource.reduction`` takes it (NumPy's calls run in its place where the library
    does not build)."""
    found = csource.reduction(op, attrs.axes, x, out) if em.native is not None else None
    if found is None:
        numpy(em, attrs, x, out)
        return
    fallback = Emitter(em.workspace)
    numpy(fallback, attrs, x, out)
    em.calls.append(em.native.add([found], fallback.calls))


SMALL_WINDOW = 16  # a max over at most this many elements a place (a pooling window) is taken slice by slice


def _max(em, attrs, args, out):
    """NumPy's reduce over a few elements a place (a 2x2 pooling window, innermost) runs an inner loop of two
    elements per output, ten times slower than comparing whole strided slices: there, the maximum of the window's
    slices in the reduce's own order (C order of the reduced axes), so the same element wins every tie."""
    x, axes, keepdims = args[0], attrs.axes, attrs.keepdims
    if not _small_window(x, axes, out):
        em.call(np.maximum.reduce, x, axis=axes, out=out, keepdims=keepdims)
        return
    _by_slices(em, MAXIMUM, x, axes, keepdims, out)


def _small_window(x, axes, out):
    return 1 < math.prod(x.shape[a] for a in axes) <= SMALL_WINDOW and out.size >= SMALL_WINDOW


def _by_slices(em, op, x, axes, keepdims, out):
    """``out`` = ``op`` (``MAXIMUM``, ``ADD``) of the slices of ``x`` at each place of the reduced ``axes``, in C order of
    them: C loop nests where native code is at hand (``_strided``), else NumPy's calls."""
    places = itertools.product(*(range(x.shape[a]) for a in axes))
    slices = [x[tuple(_place(axis, axes, place, keepdims) for axis in range(x.ndim))] for place in places]
    _strided(em, [(None, out, [slices[0]])] + [(op, out, [out, part]) for part in slices[1:]])


def _exact_window_sum(em, term, args, out):
    """Whether sum ``term`` was emitted as the sum of its window's slices: a sum over a small window of values cast
    from booleans (a pooling gradient's count of ties), whose partial sums are small integers, exact in any order,
    so the slices are added whole as ``_max`` compares them."""
    summed = term.args[0]
    if summed.op is not CAST or summed.args[0].dtype != np.bool_ or not is_float(term.dtype) \
            or not _small_window(args[0], term.attrs.axes, out):
        return False
    _by_slices(em, ADD, args[0], term.attrs.axes, term.attrs.keepdims, out)
    return True


def _place(axis, axes, place, keepdims):
    """The index of ``axis`` in the slice of a reduction over ``axes`` at ``place`` (its index on each of them)."""
    if axis not in axes:
        return slice(None)
    i = place[axes.index(axis)]
    return slice(i, i + 1) if keepdims else i


def _mean(em, attrs, args, out):
    _reduction(em, MEAN, attrs, args[0], out, _numpy_mean)


def _numpy_mean(em, attrs, x, out):
    # as numpy's mean: the sum in the result's dtype (float64 for integers; float16 comes in float32),
    # divided by the count
    axes, keepdims = attrs.axes, attrs.keepdims
    count = np.intp(math.prod(x.shape[a] for a in axes))
    em.call(np.add.reduce, x, axis=axes, dtype=out.dtype, out=out, keepdims=keepdims)
    em.call(np.true_divide, out, count, out=out, casting="unsafe")


def _kept(shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _shifted(em, x, axes, out_dtype, into):
    """``into = x - peak`` with ``peak`` the max over ``axes`` (0 where infinite or NaN), returning ``peak``:
    ``numerics.shifted``, written into scratch arrays."""
    peak = em.scratch(_kept(x.shape, axes), out_dtype)
    finite = em.scratch(peak.shape, np.bool_)
    numpy_calls = [functools.partial(np.maximum.reduce, x, axis=axes, keepdims=True, out=peak),
                   functools.partial(np.isfinite, peak, out=finite), functools.partial(np.logical_not, finite, out=finite),
                   functools.partial(np.copyto, peak, 0, where=finite), functools.partial(np.subtract, x, peak, out=into)]
    rows = x.ndim > 0 and x.size > 0 and axes == (x.ndim - 1,) and x.flags.c_contiguous and into.flags.c_contiguous
    if em.native is not None and rows and x.dtype == into.dtype == peak.dtype and x.dtype in (np.float32, np.float64):
        # one C pass a row; NumPy's five calls where the library cannot be built
        name, source = csource.rows_shifted(x.size // x.shape[-1], x.shape[-1], x.dtype)
        em.calls.append(em.native.add([(name, source, [x, into, peak])],
                                      numpy_calls))
    else:
        em.calls.extend(numpy_calls)
    em.release(finite)
    return peak


def _log_total(em, shifted, axes, total, exponentials):
    """``total = log(sum(exp(shifted)))`` over ``axes``, the exponentials written into ``exponentials``."""
    _unary(em, np.exp, shifted, exponentials)
    _sum_kept(em, exponentials, axes, total)
    _unary(em, np.log, total, total)


def _unary(em, ufunc, x, out):
    """``ufunc(x, out=out)``: NumPy's own loop called from C where native code is at hand (``loops.piece``), so a step
    makes it with its neighbours in one call from Python; NumPy's call elsewhere."""
    _piece_or_call(em, loops.piece(ufunc, x, out) if em.native is not None else None,
                   functools.partial(ufunc, x, out=out))


def _sum_kept(em, x, axes, out):
    """``out = sum(x)`` over ``axes``, kept as axes of one element: in NumPy's order from C where native code is at
    hand and ``csource.reduction`` takes it; NumPy's call elsewhere."""
    _piece_or_call(em, csource.reduction(SUM, axes, x, out) if em.native is not None else None,
                   functools.partial(np.add.reduce, x, axis=axes, keepdims=True, out=out))


def _piece_or_call(em, piece, numpy_call):
    """C ``piece`` (``numpy_call`` where the library does not build), or ``numpy_call`` where there is none."""
    em.calls.append(numpy_call if piece is None else em.native.add([piece], [numpy_call]))


def _logsumexp(em, attrs, args, out):
    axes = attrs.axes
    x, converted = _floating(em, args[0])
    shifted = em.scratch(x.shape, out.dtype)
    peak = _shifted(em, x, axes, out.dtype, shifted)
    total = out.reshape(peak.shape)
    _log_total(em, shifted, axes, total, shifted)
    _strided(em, [(ADD, total, [total, peak])])
    for array in (shifted, peak) + ((x,) if converted else ()):
        em.release(array)


def _softmax(em, attrs, args, out):
    axes = attrs.axes
    x, converted = _floating(em, args[0])
    peak = _shifted(em, x, axes, out.dtype, out)
    _unary(em, np.exp, out, out)
    _sum_kept(em, out, axes, peak)
    _strided(em, [(DIVIDE, out, [out, peak])])
    for array in (peak,) + ((x,) if converted else ()):
        em.release(array)


def _log_softmax(em, attrs, args, out):
    axes = attrs.axes
    x, converted = _floating(em, args[0])
    peak = _shifted(em, x, axes, out.dtype, out)
    exponentials = em.scratch(x.shape, out.dtype)
    _log_total(em, out, axes, peak, exponentials)
    _strided(em, [(SUBTRACT, out, [out, peak])])
    for array in (exponentials, peak) + ((x,) if converted else ()):
        em.release(array)


def _matmul(em, attrs, args, out):
    """A stack of matrices times one matrix (a linear layer over a batch of sequences) as one product of all their
    rows: NumPy's matmul makes one BLAS call a matrix of the stack, 1.6 times slower at the GPT example's shapes.
    Where native code is at hand, a product of two matrices is NumPy's BLAS call made from C (``blas``)."""
    a, b = args
    rows = _as_rows(a)
    if b.ndim == 2 and a.ndim > 2 and rows is not None and out.flags.c_contiguous:
        a, out = rows, out.reshape(rows.shape[0], out.shape[-1])
    numpy_call = functools.partial(np.matmul, a, b, out=out)
    if _own_product(em, a, b, out, numpy_call):
        return
    called = blas.product(a, b, out) if em.native is not None else None
    em.numpy_blas |= called is None
    _piece_or_call(em, called, numpy_call)


def _as_rows(a):
    """``a``'s matrices stacked into one matrix of all their rows, as a view, or None where no view can be."""
    try:
        return a.reshape((-1, a.shape[-1]), copy=False) if a.size else None
    except (ValueError, TypeError):  # no view can be (TypeError: a NumPy before 2.1, without copy=)
        return None


def _einsum(em, attrs, args, out):
    em.call(np.einsum, attrs.subscripts, *args, out=out)


def _reshape_copy(em, attrs, args, out):
    _strided(em, [(None, out.reshape(args[0].shape), [args[0]])])


def _conv(em, attrs, args, out):
    # the input padded and dilated into scratch when it must be, the weights copied contiguous in the
    # result's dtype, the windows copied into columns, then one batched matrix product per group
    padding, lhs_dilation, groups = attrs.padding, attrs.lhs_dilation, attrs.groups
    x, w = args
    spatial = tuple(dilated_size(n, d) + low + high for n, d, (low, high) in zip(x.shape[2:], lhs_dilation, padding))
    xp = x
    if any(low or high for low, high in padding) or any(d != 1 for d in lhs_dilation) or x.dtype != out.dtype:
        xp = em.scratch(x.shape[:2] + spatial, out.dtype)
        _place_into(em, xp, x, (0, 0) + tuple(low for low, _ in padding), (1, 1) + lhs_dilation, 0)
    weights = em.scratch(w.shape, out.dtype)
    _strided(em, [(None, weights, [w])])
    columns = em.scratch(windowing.conv_columns_shape(x.shape, w.shape, out.shape, groups), out.dtype)
    windows = windowing.conv_windows(xp, w.shape, out.shape, attrs.strides, attrs.rhs_dilation, groups)
    _strided(em, [(None, columns.reshape(windows.shape), [windows])])
    _conv_product(em, out, weights, columns, groups)
    for array in (columns, weights) + ((xp,) if xp is not x else ()):
        em.release(array)


def _conv_product(em, out, weights, columns, groups):
    """``windowing.conv_product``: NumPy's ``?gemm`` a matrix made from C where native code is at hand
    (``blas.stacked_product``), else NumPy's stacked matmul."""
    numpy_call = functools.partial(windowing.conv_product, out, weights, columns, groups)
    stacks = windowing.conv_stacks(out, weights, columns, groups)
    if _own_product(em, *stacks, numpy_call):
        return
    called = blas.stacked_product(*stacks) if em.native is not None else None
    em.numpy_blas |= called is None
    _piece_or_call(em, called, numpy_call)


def _own_product(em, a, b, out, numpy_call):
    """Whether ``a @ b`` into ``out`` was emitted as cortado's own product (``gemm``), where native code is at hand and
    the CPU has AVX-512."""
    if em.native is None or not gemm.usable(a, b, out):
        return False
    _piece_or_call(em, gemm.product(a, b, out), numpy_call)
    return True


def _pad(em, attrs, args, out):
    lows = tuple(low for low, _ in attrs.pad_width)
    _place_into(em, out, args[0], lows, (1,) * out.ndim, attrs.constant_values)


def _place_into(em, out, x, lows, dilations, fill):
    """``windowing.place_into``: ``out`` filled, then ``x``'s elements copied into their places (a C copy where native
    code is at hand: a pad of a head's columns is a copy with short inner rows)."""
    views = windowing.placed(out, x, lows, dilations)
    _strided(em, [_filled(out, fill)] + ([(None, views[0], [views[1]])] if views is not None else []))


def _overlap_add(em, attrs, args, out):
    taps = windowing.overlap_taps(out, args[0], attrs.strides, attrs.dilation)
    _strided(em, [_filled(out, 0)] + [(ADD, target, [target, windows]) for target, windows in taps])


def _filled(out, value):
    """``_strided``'s step filling ``out`` with ``value``: a copy of it broadcast, C where the steps after it are (one
    call with them, where ``out.fill`` was a Python call of 6 to 19 us on a pad of 64 of 192 columns)."""
    return None, out, [np.broadcast_to(np.array(value, out.dtype), out.shape)]


def _strided(em, steps):
    """Steps over strided views, in turn: each a NumPy call, or ``(op, target, sources)``, ``target = op(*sources)``
    (a copy where ``op`` is None), elementwise. NumPy walks a view whose inner axes are short (a convolution's
    windows, a pooling window's taps) an element at a time; a C loop nest of the same operations in the same order
    gives the same bits several times faster, where native code is at hand (``em.native``), in parts of the first
    axis on the pool's threads where the steps part cleanly along it (``_parts_of_first_axis``). Sources broadcast
    against their target as NumPy broadcasts them (a bias of fewer axes, a row's peak), taken at the target's shape."""
    steps = [step if callable(step) else (step[0], step[1], [np.broadcast_to(a, step[1].shape) for a in step[2]])
             for step in steps]
    numpy_calls = [_numpy_step(step) for step in steps]
    pieces = _loop_nests(steps) if em.native is not None else None
    if pieces is None or all(callable(piece) for piece in pieces):
        em.calls.extend(numpy_calls)
        return
    count = _parts_of_first_axis(steps)
    if count > 1:
        cuts = [steps[0][1].shape[0] * k // count for k in range(count + 1)]
        parts = [_loop_nests([(op, target[start:stop], [a[start:stop] for a in sources]) for op, target, sources in steps])
                 for start, stop in zip(cuts, cuts[1:])]
        if None not in parts:
            pieces = [em.native.split(parts, pieces)]
    em.calls.append(em.native.add(pieces, numpy_calls))


def _numpy_step(step):
    """``_strided``'s step as NumPy's call."""
    if callable(step):
        return step
    op, target, sources = step
    if op is None:
        return functools.partial(np.copyto, target, sources[0], casting="unsafe")
    return functools.partial(UFUNCS[op], *sources, out=target)


def _loop_nests(steps):
    """``_strided``'s pieces: a C loop nest a step, a NumPy call as it is; None where C cannot compute a step."""
    pieces = []
    for step in steps:
        if callable(step):
            pieces.append(step)
            continue
        op, target, sources = step
        if any(a.dtype != target.dtype for a in sources):
            return None
        params = [parameter(k, source) for k, source in enumerate(sources)]
        term = params[0] if op is None else make(op, params)
        found = csource.loop_nest([(term, target)], dict(zip(params, sources)), target.shape)
        if found is None:
            return None
        pieces.append(found)
    return pieces


def _parts_of_first_axis(steps):
    """Into how many parts of their first axis ``_strided``'s steps are cut (``native.parts``), 1 where they do not
    part cleanly: a NumPy call among them, or a step whose target or sources lack that axis, a target whose parts
    would share memory, or a source that shares memory with a target other than element for element (its own)."""
    if any(callable(step) for step in steps) or steps[0][1].ndim == 0:
        return 1
    n = steps[0][1].shape[0]
    for _, target, sources in steps:
        if any(a.ndim == 0 or a.shape[0] != n for a in (target, *sources)) or not _rows_apart(target):
            return 1
        for a in sources:
            if any(may_share_memory(a, t) and not same_elements(a, t) for _, t, _ in steps):
                return 1
    return min(native.parts(sum(step[1].size for step in steps), native.ELEMENTS_A_PART), n)


def _rows_apart(a):
    """Whether the elements of ``a`` at each index of its first axis lie apart from those at every other."""
    span = sum((n - 1) * abs(step) for n, step in zip(a.shape[1:], a.strides[1:])) + a.itemsize
    return a.shape[0] == 1 or abs(a.strides[0]) >= span


def same_elements(a, b):
    """Whether ``a`` and ``b`` are the same elements in the same layout."""
    return (a.ctypes.data, a.shape, a.strides, a.dtype) == (b.ctypes.data, b.shape, b.strides, b.dtype)


def _take(em, attrs, args, out):
    em.call(gathering.take_into, out, *args, attrs.axis)


def _add_at(em, attrs, args, out):
    em.call(gathering.add_at_into, out, *args, attrs.axis)


def _take_along_axis(em, attrs, args, out):
    em.call(gathering.take_along_axis_into, out, *args, attrs.axis)


def _random_into(out, seed, counter, stream):
    if not philox.uniform_into(out, seed[()], counter[()], stream):
        out[...] = random.uniform(seed[()], counter[()], out.shape, stream)


def _random_uniform(em, attrs, args, out):
    em.call(_random_into, out, *args, attrs.stream)


def _attention_scratch(em, q, k, v, dtype, count):
    return [em.scratch((n,), dtype) for n in attending.scratch_sizes(q, k, v)[:count]]


def _released(em, arrays):
    for a in arrays:
        em.release(a)


def _attention(em, attrs, args, out):
    scratch = _attention_scratch(em, *args, out.dtype, 1)
    _forward_attention(em, attrs, args, out, scratch[0])
    _released(em, scratch)


def _attention_keeping(em, attrs, args, out):
    """``out``: the output and the probabilities, which the forward leaves where its scores are (one block)."""
    result, probabilities = out
    _forward_attention(em, attrs, args, result, probabilities.reshape(-1))


def _forward_attention(em, attrs, args, out, scores):
    """``attending.attention_into``, its block's scores in the flat array ``scores``: C where it can be."""
    extra = em.scratch((attention.extra_size(*args[:2]),), out.dtype)
    found = attention.forward(out, *args, attrs.scale, attrs.causal, scores, extra) if em.native is not None else None
    if found is not None:
        _native_attention(em, found, functools.partial(attending.attention_into, out, *args, attrs.scale, attrs.causal,
                                                       scores))
    else:
        shifts = _shifts(em, scores, *args[:2], attrs)
        em.call(attending.attention_into, out, *args, attrs.scale, attrs.causal, scores, shifts=shifts)
        em.numpy_blas = True
    em.release(extra)


def _attention_grad(em, attrs, args, out):
    """``out``: the three results, ``(dq, dk, dv)``; the forward's result (``args[3]``) is not read."""
    q, k, v, _, dout = args
    _backward_attention(em, attrs, (q, k, v, dout), out, None)


def _attention_grad_given(em, attrs, args, out):
    q, k, v, probabilities, dout = args
    _backward_attention(em, attrs, (q, k, v, dout), out, probabilities.reshape(-1))


def _backward_attention(em, attrs, operands, out, given):
    """``attending.attention_grad_into`` of ``operands`` (q, k, v, dout) into ``out`` (dq, dk, dv): from the
    probabilities ``given`` (a flat array, one block), else making them in scratch. C where it can be."""
    q, k, v, dout = operands
    sizes = attending.scratch_sizes(q, k, v)
    made = [em.scratch((n,), out[0].dtype) for n in sizes[given is not None:]]
    scratch = ([given] if given is not None else []) + made
    extra = em.scratch((attention.extra_size(q, k),), out[0].dtype)
    found = (attention.backward(*out, q, k, v, dout, attrs.scale, attrs.causal, *scratch, extra, given=given is not None)
             if em.native is not None else None)
    numpy_call = functools.partial(attending.attention_grad_into, *out, q, k, v, dout, attrs.scale, attrs.causal,
                                   *scratch, given=given is not None)
    if found is not None:
        _native_attention(em, found, numpy_call)
    else:
        shifts = None if given is not None else _shifts(em, scratch[0], q, k, attrs)
        em.call(numpy_call, shifts=shifts)
        em.numpy_blas = True
    _released(em, made + [extra])


def _native_attention(em, found, numpy_call):
    """An attention's C (``attention``): its shift functions defined, its one call added; ``numpy_call`` where the
    library does not build."""
    definitions, piece = found
    for definition in definitions:
        em.native.define(*definition)
    em.calls.append(em.native.add([piece], [numpy_call]))


def _shifts(em, flat, q, k, attrs):
    """``{block's first query: its scores' shift}`` as C (``csource.scores_shift``: one pass a row where NumPy makes
    five, a row's max the slowest of them over short rows), or None where no native code is at hand."""
    if em.native is None or flat.dtype not in csource.C_TYPES or flat.dtype == np.bool_ or not k.shape[-2]:
        return None
    shifts = {}
    for start, stop in attending.blocks(q, k):
        s = attending.block_scores(flat, q, k, start, stop)
        name, source = csource.scores_shift(s.shape, start, attrs.scale, attrs.causal, s.dtype)
        numpy_calls = [functools.partial(attending.shift_scores, s, attrs.scale, attrs.causal, start)]
        shifts[start] = em.native.later([(name, source, [s])], numpy_calls)
    return shifts


def _float32_copy(em, x):
    wide = em.scratch(x.shape, np.float32)
    em.call(np.copyto, wide, x, casting="unsafe")
    return wide


def _in_float32(emitter, narrow):
    """``emitter`` with its operands and result of the dtypes ``narrow`` accepts in float32 scratch,
    rounded once into ``out`` (a tuple of arrays for an op of several results)."""

    def emit(em, attrs, args, out):
        outs = out if isinstance(out, tuple) else (out,)
        if not any(narrow(a.dtype) for a in (*args, *outs)):
            return emitter(em, attrs, args, out)
        wide_args = [_float32_copy(em, a) if narrow(a.dtype) else a for a in args]
        wide_outs = tuple(em.scratch(o.shape, np.float32) if narrow(o.dtype) else o for o in outs)
        emitter(em, attrs, wide_args, wide_outs if isinstance(out, tuple) else wide_outs[0])
        for wide, o in zip(wide_outs, outs):
            if wide is not o:
                em.call(np.copyto, o, wide, casting="unsafe")
                em.release(wide)
        for wide, arg in zip(wide_args, args):
            if wide is not arg:
                em.release(wide)

    return emit


EMITTERS = {op: _ufunc(op) for op in UFUNCS}
EMITTERS.update({
    RELU: _relu, WHERE: _where, CAST: _cast,
    STOP_GRADIENT: _cast, FLOAT8_GRADIENT: _cast,  # (identities: simplify takes them out before this)
    SUM: _sum, MEAN: _mean, MAX: _max, LOGSUMEXP: _logsumexp, SOFTMAX: _softmax, LOG_SOFTMAX: _log_softmax,
    MATMUL: _matmul, EINSUM: _einsum, RESHAPE: _reshape_copy, CONV: _conv, PAD: _pad, OVERLAP_ADD: _overlap_add,
    TAKE: _take, TAKE_ALONG_AXIS: _take_along_axis, ADD_AT: _add_at, ATTENTION: _attention, ATTENTION_GRAD: _attention_grad,
    ATTENTION_KEEPING: _attention_keeping, ATTENTION_GRAD_GIVEN: _attention_grad_given, RANDOM_UNIFORM: _random_uniform,
})
EMITTERS.update({op: _in_float32(emitter, op.computes_in_float32)
                 for op, emitter in EMITTERS.items() if op.computes_in_float32 is not None})

INPLACE = {op: tuple(range(ufunc.nin)) for op, ufunc in UFUNCS.items()}
INPLACE[RELU] = (0,)
INPLACE[WHERE] = (2,)


def emit(em, term, args, out):
    """``out``: the result's array, or a tuple of them for an op of several results."""
    if term.op is SUM and _exact_window_sum(em, term, args, out):
        return
    EMITTERS[term.op](em, term.attrs, args, out)
