"""The generated kernels: a fused region's (its kernel shape as fusion decided it, ``rules.fusion``), and the
window (pad, flip, overlap_add), gather (take, take_along_axis), random-number (random_uniform) and copy (a reshape
no view can be) kernels."""

from ....rules.horizontal import Horizontal
from ....exprgraph.ops import FLIP, FUSED_OP, OVERLAP_ADD, PAD, RANDOM_UNIFORM, RESHAPE, TAKE, TAKE_ALONG_AXIS
from ..codegen import Operand, memory_order
from ..index_kernels import take_along_axis_source, take_source
from ..kernels import launcher, prepare
from ..random_kernels import random_source
from ..sources import copy_source, kernel_sources, reduction_scratch_bytes
from ..window_kernels import flip_source, overlap_add_source, pad_source
from . import Runner, Target
from .copies import nothing

WINDOW_KERNELS = {  # op -> the source of its kernel, from its operand and its term
    PAD: lambda x, t: pad_source(x, t, [low for low, _ in t.attrs.pad_width], t.attrs.constant_values),
    FLIP: lambda x, t: flip_source(x, t, t.attrs.axes),
    OVERLAP_ADD: lambda x, t: overlap_add_source(x, t, t.attrs.strides, t.attrs.dilation),
}
OPERAND_KERNELS = {  # op -> the source of its kernel, from its operands and its term
    TAKE: lambda x, indices, t: take_source(x, indices, t, t.attrs.axis),
    TAKE_ALONG_AXIS: lambda x, indices, t: take_along_axis_source(x, indices, t, t.attrs.axis),
    RANDOM_UNIFORM: lambda seed, counter, t: random_source(seed, counter, t, t.attrs.stream),
}


class Kernels(Runner):
    """The kernels computing ``kernel``'s terms, one after another (two for a split column reduction, whose scratch
    is the workspace)."""

    def __init__(self, kernel, view):
        t, defined = kernel.term, tuple(kernel.terms)

        def operand(x):
            return Operand(x.shape, x.dtype, view.strides[x])

        self.values = tuple(t.args) + defined
        if t.size == 0:
            self.sources = []
        elif t.op is RESHAPE:  # not a view: the source's elements in order, written contiguously
            self.sources = [copy_source(operand(t.args[0]))]
        elif t.op in WINDOW_KERNELS:
            self.sources = [WINDOW_KERNELS[t.op](operand(t.args[0]), t)]
        elif t.op in OPERAND_KERNELS:
            self.sources = [OPERAND_KERNELS[t.op](*map(operand, t.args), t)]
        else:
            out = [view.addresses[d] for d in defined]
            aliased = {j for j, a in enumerate(t.args) if view.addresses.get(a) in out}  # feeds alias nothing of ours
            order = None  # kernels side by side: parts of at most two axes, stored in C order
            if isinstance(t.attrs.kernel, Horizontal):
                self.detail = f"{len(t.attrs.kernel.parts)} kernels side by side"
            else:
                order = memory_order(t.shape, view.strides[defined[0]])
            self.sources = kernel_sources(t.attrs.outputs, [operand(a) for a in t.args], aliased, order,
                                          t.attrs.kernel)
        for source in self.sources:
            prepare(source)  # compiled beside the program's other kernels; the build waits for them
        self.scratch = len(self.sources) > 1

    def bind(self, addresses, workspace, stream):
        places = list(addresses) + ([workspace] if self.scratch else [])
        calls = [launcher(source, places) for source in self.sources]
        if not calls:
            return nothing
        return calls[0] if len(calls) == 1 else lambda: [call() for call in calls]



def _workspace(kernel, view):
    """A split column reduction's partial sums (the only generated kernels with a workspace)."""
    t = kernel.term
    if t.op is not FUSED_OP:
        return 0
    return reduction_scratch_bytes(t.attrs.outputs, [Operand(a.shape, a.dtype, view.strides[a]) for a in t.args],
                                   t.attrs.kernel)


TARGET = Target("fused", (FUSED_OP, RESHAPE, *WINDOW_KERNELS, *OPERAND_KERNELS), Kernels, _workspace)
