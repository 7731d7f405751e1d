"""A channels-last float32 or float64 convolution run in NCHW: its channels-last operands copied to NCHW in the
workspace, the NCHW call, its result copied back channels last.

A candidate like any other, timed with its copies: cuDNN's NHWC kernels without tensor cores can be
far slower than its NCHW ones (on the H100, a 3x3 float32 data gradient of 32 56x56 images of 64
channels took 355 us in NHWC against 130 in NCHW, where the copies take tens of us), and a program fed
channels-last images (``channels_last_io``) stores its convolutions' images so in every dtype.
"""

import numpy as np

from ...memplan import aligned
from .codegen import Operand, contiguous_strides, in_c_order, memory_order
from .sources import copy_source
from .kernels import launcher

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ALIGNMENT = 256


def detour_layouts(term, layouts, tf32):
    """The layouts of ``dnn_conv`` ``term``'s operands and result in NCHW, and the indices of the operands copied
    there;
    None where it takes no detour: a dtype not in ``DTYPES`` (or float32 on TF32 tensor cores, fast in NHWC), an
    epilogue, or operands and result already NCHW."""
    if term.dtype not in DTYPES or (tf32 and term.dtype == np.float32) or term.attr("epilogue") != "none" \
            or term.ndim < 4:
        return None
    values = term.args + (term,)
    if all(in_c_order(x.shape, layouts[x]) for x in values):
        return None
    copied = [i for i, x in enumerate(term.args) if not in_c_order(x.shape, layouts[x])]  # by index: x may be both
    return {**layouts, **{x: contiguous_strides(x.shape) for x in values}}, copied


class Detour:
    """The copies and the NCHW call (``conv``, a ``dnn.Conv`` over ``detour_layouts``), over fixed pointers."""

    def __init__(self, term, layouts, conv, copied):
        self.conv = conv
        itemsize = term.dtype.itemsize
        operands = [term.args[i] for i in copied]
        self.copies_in = [(i, copy_source(Operand(x.shape, x.dtype, layouts[x]))) for i, x in zip(copied, operands)]
        self.offsets, top = [], 0
        for x in operands + [term]:
            self.offsets.append(top)
            top += aligned(x.size * itemsize, ALIGNMENT)
        out_order = memory_order(term.shape, layouts[term])
        self.copy_out = copy_source(Operand(term.shape, term.dtype, contiguous_strides(term.shape)), out_order)
        self.scratch = top
        self.workspace_bytes = top + conv.workspace_bytes

    def describe(self):
        return f"{self.conv.describe()}, in NCHW between copies from and to channels last"

    def _inner(self, a, b, out, workspace):
        """The NCHW call's pointers: its operands (copied where they were channels last), its result, its workspace."""
        operands = [a, b]
        for (index, _), offset in zip(self.copies_in, self.offsets):
            operands[index] = workspace + offset
        return (*operands, workspace + self.offsets[-1], workspace + self.scratch)

    def tune(self, pointers, stream):
        """Tune the NCHW call on ``pointers`` (``call``'s, without the stream)."""
        self.conv.tune(self._inner(*pointers) + ((),), stream)

    def call(self, a, b, out, workspace, stream):
        """Run on device pointers, on CuPy's current stream (the executor's, wherever it runs or tunes a call)."""
        inner = self._inner(a, b, out, workspace)
        for index, source in self.copies_in:
            _launch(source, (a, b)[index], inner[index])
        self.conv.call(*inner, (), stream)
        _launch(self.copy_out, inner[2], out)


def _launch(source, origin, destination):
    launcher(source, (origin, destination))()
