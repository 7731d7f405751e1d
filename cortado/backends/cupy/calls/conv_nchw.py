"""A channels-last float32 or float64 convolution run in NCHW: its channels-last operands copied to NCHW in the
workspace, the NCHW call, its result copied back channels last.

A candidate like any other, timed with its copies: cuDNN's NHWC kernels without tensor cores can be
far slower than its NCHW ones (on the H100, a 3x3 float32 data gradient of 32 56x56 images of 64
channels took 355 us in NHWC against 130 in NCHW, where the copies take tens of us), and a program fed
channels-last images (``channels_last_io``) stores its convolutions' images so in every dtype.
"""

import math
from dataclasses import replace

import numpy as np

from ....memplan import aligned
from ..codegen import contiguous_strides, in_c_order, memory_order
from ..sources import copy_source
from ..kernels import launcher

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ALIGNMENT = 256


def nchw_call(call):
    """``ConvCall`` ``call`` with its operands and result in NCHW, and the indices of the operands copied there;
    None where it has no NCHW form worth timing: a dtype not in ``DTYPES`` (or float32 on TF32 tensor cores, fast in NHWC), an
    epilogue, or operands and result already NCHW."""
    if call.dtype not in DTYPES or (call.tf32 and call.dtype == np.float32) or call.epilogue != "none" \
            or len(call.out.shape) < 4:
        return None
    values = (call.first, call.second, call.out)
    if all(in_c_order(x.shape, x.strides) for x in values):
        return None
    copied = [i for i, x in enumerate(values[:2]) if not in_c_order(x.shape, x.strides)]
    first, second, out = (replace(x, strides=contiguous_strides(x.shape)) for x in values)
    return replace(call, first=first, second=second, out=out), copied


class InNchw:
    """The copies and the NCHW call (``conv``, a ``cudnn_conv.Conv`` of ``nchw_call``'s call), over fixed pointers."""

    def __init__(self, call, conv, copied):
        self.conv = conv
        itemsize = call.dtype.itemsize
        operands = [(call.first, call.second)[i] for i in copied]
        self.copies_in = [(i, copy_source(x)) for i, x in zip(copied, operands)]
        self.offsets, top = [], 0
        for x in operands + [call.out]:
            self.offsets.append(top)
            top += aligned(math.prod(x.shape) * itemsize, ALIGNMENT)
        out = call.out
        self.copy_out = copy_source(replace(out, strides=contiguous_strides(out.shape)), memory_order(out.shape, out.strides))
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
