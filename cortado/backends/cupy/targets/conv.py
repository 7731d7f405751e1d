"""cuDNN's convolutions: ``dnn_conv`` terms (``lowering/conv.py`` builds them), each the fastest of cuDNN's plans,
im2col and GEMMs, its NCHW form between copies, or our weight-gradient kernel (``calls.cudnn_conv.Conv`` chooses)."""

from ..codegen import Operand
from ..calls.cudnn_conv import Conv, ConvCall
from ..layout import dnn_copies
from ..lowering.conv import DNN_CONV
from . import Target
from .library import LibraryCall


def conv_call(t, strides, options):
    """The ``ConvCall`` of ``dnn_conv`` term ``t``, its operands stored at ``strides``, under compile ``options``."""
    first, second, *extras = [Operand(x.shape, x.dtype, strides[x]) for x in t.args]
    attrs = t.attrs
    return ConvCall(attrs.mode, first, second, Operand(t.shape, t.dtype, strides[t]), attrs.strides, attrs.padding,
                    attrs.dilation, attrs.groups, attrs.epilogue, tuple(extras), options["tf32"],
                    options["deterministic"])


def _runner(kernel, view):
    t = kernel.term
    a, b, *extras = t.args

    def arguments(placed, workspace):
        return placed[a], placed[b], placed[t], workspace, tuple(placed[e] for e in extras)

    return LibraryCall(kernel, view, dnn_copies(t, view.strides, view.channels_last_for),
                       lambda reads: Conv(conv_call(t, reads, view.options)), arguments, t.attrs.mode)


TARGET = Target("conv", (DNN_CONV,), _runner, reusable=True)
