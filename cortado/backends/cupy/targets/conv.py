"""cuDNN's convolutions: ``dnn_conv`` terms (``lowering/conv.py`` builds them), each the fastest of cuDNN's plans,
im2col and GEMMs, its NCHW form between copies, or our weight-gradient kernel (``calls.cudnn_conv.Conv`` chooses);
the operands it reads from copies (``dnn_copies``)."""

from ..codegen import Operand, channels_last_strides, contiguous_strides, same_layout
from ..calls.cudnn_conv import Conv, ConvCall, packed
from ..lowering.conv import DNN_CONV, epilogue_parts
from . import Target
from .library import LibraryCall


def _images(t):
    """The operands of ``dnn_conv`` ``t`` that are images (not weights or a bias): both of a wgrad's, the first of
    the others', and an epilogue's residual."""
    if t.attr("mode") == "wgrad":
        return t.args
    return t.args[:1] + ((t.args[-1],) if "add" in epilogue_parts(t.attr("epilogue")) else ())


def dnn_copies(t, strides, channels_last_for):
    """The operands of ``dnn_conv`` ``t`` that cuDNN reads from a copy, each with its copy's strides: those neither
    NCHW nor NHWC packed (copied NCHW), and, where ``t``'s dtype is one of ``channels_last_for``, its images not
    stored channels last (copied so): cuDNN's kernels reading NCHW into NHWC were up to 10x slower on the H100."""
    last = t.dtype in channels_last_for
    copies = {}
    for x in t.args:
        target = channels_last_strides(x.shape) if last and x in _images(t) else None
        if target is not None and not same_layout(x.shape, strides[x], target):
            copies[x] = target
        elif not packed(x.shape, strides[x]):
            copies.setdefault(x, contiguous_strides(x.shape))
    return tuple(copies.items())


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
