"""Where each value's elements are on the GPU, and what the memory planner needs of each kernel.

A value is a pointer and element strides. Transposes and broadcasts are views (their strides are
permuted or zero), as are the windows of a value (strides that step by the window's stride and
dilation, so windows overlap), a reshape that only splits or merges axes its strides allow, and a crop
(a slice: the value's strides, its pointer moved to the first element kept, where that keeps the arena's
alignment); generated kernels, cuBLASLt and cuDNN read any of these directly, so a view costs nothing.
A kernel may write an output over an input of the same type that it reads at the output's own index
(a contiguous input of an elementwise kernel, the ``c`` of a gemm); a gemm's workspace holds
cuBLASLt's scratch and copies of operands it cannot read in place.
"""

import math

import numpy as np

from ...errors import BackendError
from ...exprgraph.dtypes import BFLOAT16
from ...exprgraph.graph import post_order
from ...exprgraph.ops import ADD, BROADCAST_TO, CONST, FUSED_OP, PAD, PARAM, RESHAPE, TRANSPOSE, VAR, WINDOWS
from ...exprgraph.ops.collectives import ALL_REDUCE
from .lowering.attention import DNN_ATTENTION, DNN_ATTENTION_GRAD
from .lowering.conv import DNN_CONV
from .lowering.float8_op import FLOAT8_GEMM, operands_of
from .lowering.gemm_op import GEMM
from ...memplan import Step
from ...rules.fusion import transposed_outputs
from ...rules.horizontal import Horizontal
from .codegen import (
    REDUCTIONS, channels_last_strides, contiguous_strides, in_c_order, same_layout, shifted_operands, strides_in_order,
)
from .device import require_gpu

ALIGNMENT = 256
VIEWS = (TRANSPOSE, BROADCAST_TO, WINDOWS)
ATTENTION = (DNN_ATTENTION, DNN_ATTENTION_GRAD)
TENSOR_CORE_DTYPES = (np.dtype(np.float16),) + ((BFLOAT16,) if BFLOAT16 else ())


def channels_last_dtypes(options):
    """The dtypes whose images convolutions may store channels last, by the ``nhwc`` option: all (True), none
    (False), or ("auto") those cuDNN convolves on tensor cores (float16, bfloat16, and float32 with ``tf32``),
    whose kernels read and write NHWC; its float32 kernels without TF32 were faster in NCHW on the H100."""
    nhwc = options["nhwc"]
    if not (nhwc is True or nhwc is False or nhwc == "auto"):
        raise BackendError(f"compile: the cupy backend's nhwc option is True, False or 'auto', not {nhwc!r}")
    if nhwc != "auto":
        return frozenset(TENSOR_CORE_DTYPES + (np.dtype(np.float32), np.dtype(np.float64))) if nhwc else frozenset()
    return frozenset(TENSOR_CORE_DTYPES + ((np.dtype(np.float32),) if options["tf32"] else ()))


def channels_last_for(kernels, options):
    """The dtypes whose images the convolutions of ``kernels`` store channels last: ``channels_last_dtypes``,
    where ``nhwc="auto"`` keeps them only in a program where one convolution (forward or data gradient) reads
    an image the program computes, as in a network's chain of layers. A program of lone convolutions of its
    inputs would pay a conversion of every image it is fed and every image it returns: measured on the H100,
    up to 10x a 1x1 layer's time in NCHW. A program fed and returning channels-last images
    (``channels_last_io``) stores them so in every dtype unless ``nhwc=False``: it has nothing to convert."""
    if options.get("channels_last_io") and options["nhwc"] == "auto":
        return channels_last_dtypes({**options, "nhwc": True})
    dtypes = channels_last_dtypes(options)
    if options["nhwc"] != "auto":
        return dtypes
    chained = any(k.term.op is DNN_CONV and k.term.attr("mode") != "wgrad" and k.term.dtype in dtypes
                  and k.term.args[0].op not in (VAR, CONST) for k in kernels)
    return dtypes if chained else frozenset()


def _broadcast_strides(source_shape, source_strides, shape):
    lead = len(shape) - len(source_shape)
    return tuple(0 if i < lead or source_shape[i - lead] == 1 else source_strides[i - lead] for i in range(len(shape)))


def _window_strides(source_strides, window_shape, steps, dilation):
    """The strides of the windows of a value: ``lead + counts + window``, as ``windowing.window_view``'s."""
    count = len(window_shape)
    lead, spatial = source_strides[:-count], source_strides[-count:]
    return lead + tuple(s * step for s, step in zip(spatial, steps)) + tuple(s * d for s, d in zip(spatial, dilation))


def reshaped_strides(shape, strides, new_shape):
    """The strides of ``new_shape`` over the elements a value of ``shape`` has at ``strides``, where a reshape
    can be a view (each run of axes merged or split is itself evenly strided); else None."""
    if in_c_order(shape, strides):
        return contiguous_strides(new_shape)
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    new = [n for n in new_shape if n != 1]
    if math.prod(shape) == 0 or not old:
        return None
    found, i, j = [], 0, 0
    while i < len(old):
        first_i, first_j, size, new_size = i, j, old[i][0], new[j]
        i, j = i + 1, j + 1
        while size != new_size:
            if size < new_size:
                size, i = size * old[i][0], i + 1
            else:
                new_size, j = new_size * new[j], j + 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(first_i, i - 1)):
            return None
        step = old[i - 1][1]
        run = []
        for n in reversed(new[first_j:j]):
            run.append(step)
            step *= n
        found += reversed(run)
    inner = iter(reversed(found))
    result, step = [], 1
    for n in reversed(new_shape):
        step = step if n == 1 else next(inner)
        result.append(step)
        step = step * n
    return tuple(reversed(result))


def crop_offset(t, strides):
    """The element offset in its operand of fused kernel ``t`` where ``t`` only crops it (a pad of no positive width:
    a slice) and can be a view of it: its first element lies ``ALIGNMENT`` bytes apart from the operand's; else None."""
    if t.op is not FUSED_OP or len(t.args) != 1 or len(t.attr("outputs")) != 1:
        return None
    (crop,) = t.attr("outputs")
    if crop.op is not PAD or crop.args[0].op is not PARAM or crop.shape == crop.args[0].shape:
        return None
    widths = crop.attr("pad_width")
    if any(low > 0 or high > 0 for low, high in widths) or len(widths) != len(strides[t.args[0]]):
        return None
    offset = sum(-low * stride for (low, _), stride in zip(widths, strides[t.args[0]]))
    return offset if offset * t.dtype.itemsize % ALIGNMENT == 0 else None


def one_value(t):
    """Whether ``t`` is a constant array of one repeated value, which the program stores as one element."""
    return t.op is CONST and t.ndim > 0 and t.attr("value").scalar is not None


def stored_strides(t):
    """The strides of a value the program stores itself."""
    return (0,) * t.ndim if one_value(t) else contiguous_strides(t.shape)


def io_strides(t, options):
    """The strides of a feed or a result of the program as its caller holds it: channels last (NHWC memory of an
    NCHW shape, as torch's ``channels_last`` tensors) for 4 or more axes where ``channels_last_io`` says so."""
    last = options.get("channels_last_io", False)
    if last is not True and last is not False:
        raise BackendError(f"compile: the cupy backend's channels_last_io option is True or False, not {last!r}")
    return channels_last_strides(t.shape) if last and t.ndim >= 4 else contiguous_strides(t.shape)


def _stored_channels_last(t, strides):
    return t.ndim >= 4 and strides.get(t) == channels_last_strides(t.shape) \
        and strides[t] != contiguous_strides(t.shape)


def _channels_last_kernel(k, strides, dtypes, weights_too):
    """Whether kernel ``k`` writes its values channels last: a cuDNN convolution of images in one of ``dtypes``
    (forward or data gradient; a weight gradient too where ``weights_too``, as a program fed channels-last
    weights returns their gradients), or an elementwise region over values of one shape that reads such a value
    of that shape (a bias, a relu, a residual sum), so that a chain of convolutions stays channels last from one
    to the next."""
    t = k.term
    if t.ndim < 4:
        return False
    if t.op is DNN_CONV:
        return (weights_too or t.attr("mode") != "wgrad") and t.dtype in dtypes
    if t.op is not FUSED_OP or any(s.op in REDUCTIONS for s in post_order(t.attr("outputs"))):
        return False
    return all(d.shape == t.shape for d in k.terms) and any(
        a.shape == t.shape and _stored_channels_last(a, strides) for a in t.args)


def layouts(kernels, options):
    """``{term: element strides}`` for every value the kernels define or read, and the views (``{view: its element
    offset in the value it views}``). Convolutions
    of the dtypes ``channels_last_for`` names, and the elementwise regions that follow them, store their images
    channels last."""
    dtypes = channels_last_for(kernels, options)
    merged = _heads_merged(kernels)
    parts, _ = concatenated_in_place(kernels)
    strides, views = {}, {}
    for k in kernels:
        for a in k.reads:
            strides.setdefault(a, stored_strides(a))
        t = k.term
        op = t.op
        source = t.args[0] if t.args else None
        if op is TRANSPOSE:
            strides[t] = tuple(strides[source][axis] for axis in t.attr("axes"))
        elif op is BROADCAST_TO:
            strides[t] = _broadcast_strides(source.shape, strides[source], t.shape)
        elif op is WINDOWS:
            strides[t] = _window_strides(strides[source], t.attrs.window_shape, t.attrs.strides, t.attrs.dilation)
        elif op is RESHAPE and (reshaped := reshaped_strides(source.shape, strides[source], t.shape)) is not None:
            strides[t] = reshaped
        elif (offset := crop_offset(t, strides)) is not None:
            strides[t] = strides[source]
            views[t] = offset
            continue
        elif k.is_load:
            strides[t] = io_strides(t, options)
            continue
        elif op in ATTENTION:
            strides.update({d: _part_strides(d, parts[d][0]) if d in parts else time_major_strides(d.shape)
                            if d in merged else contiguous_strides(d.shape) for d in k.terms})
            continue
        elif op is ALL_REDUCE:  # each average as its gradient lies, where that is one dense block
            strides.update({d: strides[a] if dense(a.shape, strides[a]) else contiguous_strides(d.shape)
                            for d, a in zip(k.terms, t.args)})
            continue
        else:
            last = _channels_last_kernel(k, strides, dtypes, bool(options.get("channels_last_io")))
            strides.update({d: channels_last_strides(d.shape) if last else contiguous_strides(d.shape)
                            for d in k.terms})
            continue
        views[t] = 0
    return strides, views


def _swaps_heads_and_time(t):
    axes = t.attr("axes")
    n = len(axes)
    return n >= 3 and axes[n - 3:] == (n - 2, n - 3, n - 1)


def _heads_merged(kernels):
    """The results of attention that a transpose of heads and time reads: the heads of each position are merged
    back into one row (``(batch, heads, time, size) -> (batch, time, heads * size)``)."""
    return {k.term.args[0] for k in kernels if k.term.op is TRANSPOSE and _swaps_heads_and_time(k.term)
            and k.term.args[0].op in ATTENTION}


def time_major_strides(shape):
    """Packed strides of ``(..., heads, time, size)`` stored ``(..., time, heads, size)``: cuDNN writes an attention's
    output (or a gradient) so, and the transpose that merges the heads back is a contiguous view, its reshape too,
    instead of a copy."""
    n = len(shape)
    return strides_in_order(shape, tuple(range(n - 3)) + (n - 2, n - 3, n - 1))


def _summed_pads(body):
    """``{parameter index: its first column}`` where ``body`` is one output, a sum of zero pads of parameters along
    the last axis only that tile it (a ``concatenate`` of them); else None."""
    if len(body) != 1:
        return None
    parts, stack = [], [body[0]]
    while stack:
        t = stack.pop()
        if t.op is ADD:
            stack.extend(t.args)
        elif t.op is PAD and t.args[0].op is PARAM and t.attr("constant_values") == 0 \
                and all(w == (0, 0) for w in t.attr("pad_width")[:-1]) and min(t.attr("pad_width")[-1]) >= 0:
            parts.append((t.attr("pad_width")[-1][0], t.args[0].shape[-1], t.args[0].attr("index")))
        else:
            return None
    columns = sorted(parts)
    if [low for low, _, _ in columns] != [sum(n for _, n, _ in columns[:i]) for i in range(len(columns))] \
            or sum(n for _, n, _ in columns) != body[0].shape[-1] or len({k for _, _, k in parts}) != len(parts):
        return None
    return {k: low for low, _, k in parts}


def concatenated_in_place(kernels):
    """``({attention result: (the concatenation, its element offset there)}, {the concatenations})``: where the
    gradients of an attention's q, k and v, each only merged back to ``(batch, time, heads * size)`` by views,
    are only concatenated along that last axis (the gradient of a projection split in three), cuDNN writes each
    straight into its columns of the concatenation, and the concatenation kernel has nothing left to do."""
    readers = {}
    for k in kernels:
        for a in dict.fromkeys(k.term.args):
            readers.setdefault(a, []).append(k.term)

    def only_reader(t, op):
        found = readers.get(t, [])
        return found[0] if len(found) == 1 and found[0].op is op else None

    parts, wholes = {}, set()
    for k in kernels:
        if k.term.op is not DNN_ATTENTION_GRAD:
            continue
        merged = {}
        for result in k.terms:
            swap = only_reader(result, TRANSPOSE)
            batch_kept = swap is not None and swap.attr("axes")[:-3] == tuple(range(swap.ndim - 3))
            rows = only_reader(swap, RESHAPE) if batch_kept and _swaps_heads_and_time(swap) else None
            whole = only_reader(rows, FUSED_OP) if rows is not None and rows.shape[-1] == math.prod(swap.shape[-2:]) \
                and rows.shape[:-1] == swap.shape[:-2] else None
            if whole is not None and whole.args.count(rows) == 1:
                merged[result] = (whole, whole.args.index(rows))
        wholes_found = {whole for whole, _ in merged.values()}
        if len(merged) != len(k.terms) or len(wholes_found) != 1:
            continue
        (whole,) = wholes_found
        columns = _summed_pads(whole.attr("outputs"))
        if columns is None or len(whole.args) != len(k.terms) or whole.dtype != k.term.dtype \
                or any(columns[i] * whole.dtype.itemsize % ALIGNMENT for _, i in merged.values()):
            continue
        parts.update({result: (whole, columns[i]) for result, (_, i) in merged.items()})
        wholes.add(whole)
    return parts, wholes


def _part_strides(result, whole):
    """The strides of attention result ``(..., heads, time, size)`` as columns of ``whole``, ``(..., time, width)``."""
    outer = contiguous_strides(whole.shape)
    return outer[:-2] + (result.shape[-1], outer[-2], 1)


def dense(shape, strides):
    """Whether elements at ``strides`` fill one block of ``prod(shape)`` elements, in some order of the axes."""
    size = 1
    for n, stride in sorted(((n, s) for n, s in zip(shape, strides) if n != 1), key=lambda pair: pair[1]):
        if stride != size:
            return False
        size *= n
    return True


def _flat_source(t, strides, views):
    """The value ``t`` is, or reshapes in C order (a view reading its elements in their own order); else None."""
    while t in views and t.op is RESHAPE and in_c_order(t.args[0].shape, strides[t.args[0]]):
        t = t.args[0]
    return None if t in views else t


def _added_term(t):
    """The ``c`` that gemm or float8_gemm ``t`` adds to its product, else None."""
    if t.op is GEMM:
        return t.args[2] if t.attr("beta") else None
    return operands_of(t)[4] if t.op is FLOAT8_GEMM else None


def _gemm_c(t, strides, views):
    """The value whose buffer a gemm or float8_gemm ``t`` may write over: its ``c``, or what ``c`` reshapes (the
    residual of a linear layer over sequences, whose rows the product reads as a matrix); else None."""
    c = _added_term(t)
    c = _flat_source(c, strides, views) if c is not None else None
    plain = c is not None and in_c_order(c.shape, strides[c]) and (c.size, c.dtype) == (t.size, t.dtype)
    return c if plain else None


def _inplace(k, strides, views):
    """Pairs ``(output, input)``: an input of the output's type read at the output's own index (the ``c`` of a
    gemm, or what it reshapes; an input of a fused region)."""
    t = k.term
    if t.op in (GEMM, FLOAT8_GEMM):
        c = _gemm_c(t, strides, views)
        return ((t, c),) if c is not None else ()
    if t.op is not FUSED_OP:  # the window kernels and cuDNN read elements at other indices than they write
        return ()
    named = [a for a in k.reads if a not in t.args]  # state it may write an update over, unread (compiler._kernels)
    return _same_places(k.terms, named, strides, views) + _inplace_fused(k, strides, views)


def _inplace_fused(k, strides, views):
    """``_inplace`` of a generated kernel over its operands."""
    t = k.term
    if isinstance(t.attr("kernel"), Horizontal):
        return _inplace_side_by_side(k, strides, views)
    shifted = shifted_operands(t.attr("outputs"))  # a pad reads elements other threads write
    readers = [a for j, a in enumerate(t.args) if j not in shifted]
    if any(s.op in REDUCTIONS for s in post_order(t.attr("outputs"))):
        readers = [a for a in _epilogue_operands(t) if a in readers]
    turned = transposed_outputs(t.attr("outputs"))  # written by other threads than those that read their elements
    results = [d for d in k.terms if d.attr("outputs")[d.attr("index")] not in turned]
    return _same_places(results, readers, strides, views)


def _same_places(results, readers, strides, views):
    """Pairs ``(result, reader)`` of one type and one layout, the reader no view: where the result may be written."""
    return tuple((out, a) for out in results for a in dict.fromkeys(readers)
                 if a not in views and (a.shape, a.dtype) == (out.shape, out.dtype)
                 and same_layout(a.shape, strides[a], strides[out]))


def _inplace_side_by_side(k, strides, views):
    """``_inplace`` of kernels side by side: each part's results over the operands that part alone reads, at its own
    indices (another part's threads may read an operand both read while this one writes it), and of a part of
    reductions only those its epilogue reads."""
    t = k.term
    body, spans = t.attr("outputs"), t.attr("kernel").spans()
    read = [{p.attr("index") for p in post_order(body[start:end]) if p.op is PARAM} for start, end in spans]
    pairs = []
    for part, (start, end) in enumerate(spans):
        others = set().union(*(r for j, r in enumerate(read) if j != part))
        own = read[part] - others - shifted_operands(body[start:end]) - _reduced(body[start:end])
        pairs += _same_places(k.terms[start:end], [t.args[i] for i in sorted(own)], strides, views)
    return tuple(pairs)


def _reduced(body):
    """The indices of the parameters the reductions of ``body`` read."""
    reductions = [s for s in post_order(body) if s.op in REDUCTIONS]
    return {s.attr("index") for s in post_order(reductions) if s.op is PARAM}


def _epilogue_operands(t):
    """The arguments of fused reduction ``t`` that only its epilogue reads: read once, at the output's index, by
    the thread that writes the output there, after the reductions (an SGD step on a bias gradient, say). What any
    of its reductions reads is read by other threads while outputs are written (sibling sums: the second's may
    broadcast along the reduced axis)."""
    prologue = _reduced(t.attr("outputs"))
    return [a for k, a in enumerate(t.args) if k not in prologue]


def direct_outputs(kernels, steps, outputs, sinks, options):
    """The outputs a kernel computes in their ``io_strides`` (not views, loads, state or constants): written straight
    into the output block, so calls need no copy out of the arena (nor columns of a concatenation). Each term once."""
    strides, _ = layouts(kernels, options)
    parts, _ = concatenated_in_place(kernels)
    computed = {t for k, s in zip(kernels, steps) if s.view_of is None and not k.is_load for t in k.terms} - set(parts)
    return [t for t in dict.fromkeys(outputs)
            if t in computed and t not in sinks and same_layout(t.shape, strides[t], io_strides(t, options))]


def _source_of(t, views):
    """The value view ``t`` reads (through views of views), or ``t``."""
    while t in views:
        t = t.args[0]
    return t


def steps(kernels, options):
    """One ``memplan.Step`` per kernel. A split column reduction's workspace holds its parts' sums
    (``reduction_kernels.column_splits``); a library call's workspace (a gemm's, a cuDNN convolution's) holds the
    copies of its operands it cannot read where they are and what the neediest of its candidates asks for
    (``options["tf32"]`` and ``options["deterministic"]`` change them). An attention's backward pass whose
    results are concatenated in place (``concatenated_in_place``) defines the concatenation, its results
    within it; the concatenation's own step writes nothing (it still reads them: it runs after)."""
    from .targets import View, workspace_bytes  # (the targets read this module's layout decisions)

    require_gpu()
    strides, views = layouts(kernels, options)
    last = channels_last_for(kernels, options)
    parts, wholes = concatenated_in_place(kernels)
    view = View(strides, {}, lambda t: _source_of(t, views).op is CONST, frozenset(last),
                {"tf32": options["tf32"], "deterministic": options["deterministic"]})
    found = []
    for k in kernels:
        t = k.term
        if t.op is VAR:
            found.append(Step((t,), label=t.name))
        elif t in views:
            found.append(Step((t,), (t.args[0],), view_of=t.args[0], label=t.op.name))
        elif t in wholes:
            found.append(Step((), k.reads, label="concatenate (written in place)"))
        else:
            workspace = workspace_bytes(k, view)
            within = tuple((d, parts[d][0]) for d in k.terms if d in parts)
            c = _gemm_c(t, strides, views)
            added = _added_term(t)
            reads = k.reads if c is None else tuple(c if r is added else r for r in k.reads)  # as what c reshapes
            found.append(Step(tuple(dict.fromkeys(whole for _, whole in within)) + k.terms, reads,
                              inplace=_inplace(k, strides, views), workspace=workspace, label=t.op.name, within=within))
    return found
