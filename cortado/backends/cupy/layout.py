"""Where each value's elements are on the GPU, and what the memory planner needs of each kernel.

A value is a pointer and element strides. Transposes and broadcasts are views (their strides are
permuted or zero), as are the windows of a value (strides that step by the window's stride and
dilation, so windows overlap) and a reshape of a contiguous value; generated kernels, cuBLASLt
and cuDNN read any of these directly, so a view costs nothing. A kernel may write an output over an input of
the same type that it reads at the output's own index (a contiguous input of an elementwise
kernel, the ``c`` of a gemm); a gemm's workspace holds cuBLASLt's scratch and copies of operands
it cannot read in place.
"""

from ...exprgraph.graph import post_order
from .lowering.gemm import gemm_operands
from ...memplan import Step, aligned
from .blas import Gemm, matrix
from .dnn import Conv, packed
from .codegen import REDUCTIONS, contiguous_strides
from .device import require_gpu

ALIGNMENT = 256
VIEWS = ("transpose", "broadcast_to", "windows")


def _same_layout(shape, strides, others):
    """Whether two layouts of ``shape`` place every element alike (strides of axes of size 1 never matter)."""
    return all(s == o for d, s, o in zip(shape, strides, others) if d != 1)


def _contiguous(shape, strides):
    return _same_layout(shape, strides, contiguous_strides(shape))


def _broadcast_strides(source_shape, source_strides, shape):
    lead = len(shape) - len(source_shape)
    return tuple(0 if i < lead or source_shape[i - lead] == 1 else source_strides[i - lead] for i in range(len(shape)))


def _window_strides(source_strides, window_shape, steps, dilation):
    """The strides of the windows of a value: ``lead + counts + window``, as ``windowing.window_view``'s."""
    count = len(window_shape)
    lead, spatial = source_strides[:-count], source_strides[-count:]
    return lead + tuple(s * step for s, step in zip(spatial, steps)) + tuple(s * d for s, d in zip(spatial, dilation))


def one_value(t):
    """Whether ``t`` is a constant array of one repeated value, which the program stores as one element."""
    return t.op.name == "const" and t.ndim > 0 and t.attr("value").scalar is not None


def stored_strides(t):
    """The strides of a value the program stores itself."""
    return (0,) * t.ndim if one_value(t) else contiguous_strides(t.shape)


def channels_last(shape):
    """The axes of an ``N, C, *spatial`` shape from the outermost in memory to the innermost, channels last."""
    return (0,) + tuple(range(2, len(shape))) + (1,)


def strides_in_order(shape, order):
    """Packed strides of ``shape`` whose axes lie in memory in ``order`` (outermost first)."""
    strides, step = [0] * len(shape), 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


def _stored_channels_last(t, strides):
    return t.ndim >= 4 and strides.get(t) == strides_in_order(t.shape, channels_last(t.shape)) \
        and strides[t] != contiguous_strides(t.shape)


def _channels_last_kernel(k, strides):
    """Whether kernel ``k`` writes its values channels last: a cuDNN convolution of images (forward or data
    gradient), or an elementwise region over values of one shape that reads such a value of that shape (a bias,
    a relu, a residual sum), so that a chain of convolutions stays channels last from one to the next."""
    t = k.term
    if t.ndim < 4:
        return False
    if t.op.name == "dnn_conv":
        return t.attr("mode") != "wgrad"
    if t.op.name != "fused" or any(s.op.name in REDUCTIONS for s in post_order(t.attr("outputs"))):
        return False
    return all(d.shape == t.shape for d in k.terms) and any(
        a.shape == t.shape and _stored_channels_last(a, strides) for a in t.args)


def layouts(kernels, nhwc=False):
    """``{term: element strides}`` for every value the kernels define or read, and the set of views. With ``nhwc``,
    convolutions and the elementwise regions that follow them store their images channels last."""
    strides, views = {}, set()
    for k in kernels:
        for a in k.reads:
            strides.setdefault(a, stored_strides(a))
        t = k.term
        name = t.op.name
        source = t.args[0] if t.args else None
        if name == "transpose":
            strides[t] = tuple(strides[source][axis] for axis in t.attr("axes"))
        elif name == "broadcast_to":
            strides[t] = _broadcast_strides(source.shape, strides[source], t.shape)
        elif name == "windows":
            strides[t] = _window_strides(strides[source], *t.attrs)
        elif name == "reshape" and _contiguous(source.shape, strides[source]):
            strides[t] = contiguous_strides(t.shape)
        else:
            last = nhwc and _channels_last_kernel(k, strides)
            strides.update({d: strides_in_order(d.shape, channels_last(d.shape)) if last else contiguous_strides(d.shape)
                            for d in k.terms})
            continue
        views.add(t)
    return strides, views


def dnn_copies(t, strides):
    """The operands of ``dnn_conv`` ``t`` that cuDNN cannot read where they are (neither NCHW nor NHWC packed)."""
    return tuple(dict.fromkeys(x for x in t.args if not packed(x.shape, strides[x])))


def gemm_copies(t, strides):
    """The operands of gemm ``t`` that cuBLASLt cannot read where they are: copied first."""
    a, b, c, bias, aux = gemm_operands(t.args, t.attr("beta"), t.attr("epilogue"))
    batch = t.shape[:-2]
    copies = [x for x in (a, b) if matrix(x.shape, strides[x], batch) is None]
    copies += [x for x in (c, bias, aux) if x is not None and not _contiguous(x.shape, strides[x])]
    return tuple(dict.fromkeys(copies))


def _inplace(k, strides, views):
    """Pairs ``(output, input)``: an input of the output's type read at the output's own index (the ``c`` of a
    gemm, an input of a fused region)."""
    t = k.term
    if t.op.name == "gemm":
        c = t.args[2] if t.attr("beta") else None
        plain = c is not None and c not in views and _contiguous(c.shape, strides[c])
        return ((t, c),) if plain and c.dtype == t.dtype else ()
    if t.op.name != "fused":  # the window kernels and cuDNN read elements at other indices than they write
        return ()
    readers = t.args
    if t.op.name == "fused" and any(s.op.name in REDUCTIONS for s in post_order(t.attr("outputs"))):
        readers = _epilogue_operands(t)
    return tuple((out, a) for out in k.terms for a in dict.fromkeys(readers)
                 if a not in views and (a.shape, a.dtype) == (out.shape, out.dtype)
                 and _same_layout(a.shape, strides[a], strides[out]))


def _epilogue_operands(t):
    """The arguments of fused reduction ``t`` that only its epilogue reads: read once, at the output's index, by
    the thread that writes the output there, after the reduction (an SGD step on a bias gradient, say)."""
    reduction = next(s for s in post_order(t.attr("outputs")) if s.op.name in REDUCTIONS)
    prologue = {s.attr("index") for s in post_order([reduction]) if s.op.name == "param"}
    return [a for k, a in enumerate(t.args) if k not in prologue]


def direct_outputs(kernels, steps, outputs, sinks, options):
    """The outputs a kernel computes in C order (not views, loads, state or constants): written straight into
    the output block, so calls need no copy out of the arena. Each term once."""
    strides, _ = layouts(kernels, options["nhwc"])
    computed = {t for k, s in zip(kernels, steps) if s.view_of is None and not k.is_load for t in k.terms}
    return [t for t in dict.fromkeys(outputs)
            if t in computed and t not in sinks and strides[t] == contiguous_strides(t.shape)]


RUNNERS = {"gemm": (gemm_copies, Gemm), "dnn_conv": (dnn_copies, Conv)}  # lowered op -> its copies and its call


def steps(kernels, options):
    """One ``memplan.Step`` per kernel. A library call's workspace (a gemm's, a cuDNN convolution's) holds the
    copies of its operands it cannot read where they are and what the neediest of its candidates asks for
    (``options["tf32"]`` changes them)."""
    require_gpu()
    strides, views = layouts(kernels, options["nhwc"])
    found = []
    for k in kernels:
        t = k.term
        if t.op.name == "var":
            found.append(Step((t,), label=t.name))
        elif t in views:
            found.append(Step((t,), (t.args[0],), view_of=t.args[0], label=t.op.name))
        else:
            workspace = 0
            if t.op.name in RUNNERS:
                copies_of, runner = RUNNERS[t.op.name]
                copies = copies_of(t, strides)
                readable = {**strides, **{x: contiguous_strides(x.shape) for x in copies}}
                workspace = runner(t, readable, options["tf32"]).workspace_bytes
                workspace += sum(aligned(x.size * x.dtype.itemsize, ALIGNMENT) for x in copies)
            found.append(Step(k.terms, k.reads, inplace=_inplace(k, strides, views), workspace=workspace, label=t.op.name))
    return found
