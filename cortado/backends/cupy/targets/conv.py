"""cuDNN's convolutions: ``dnn_conv`` terms (``lowering/conv.py`` builds them), each the fastest of cuDNN's plans,
im2col and GEMMs, its NCHW form between copies, or our weight-gradient kernel (``dnn.Conv`` chooses)."""

from ..dnn import Conv
from ..layout import dnn_copies
from ..lowering.conv import DNN_CONV
from . import Target
from .library import LibraryCall


def _runner(kernel, view):
    t = kernel.term
    a, b, *extras = t.args

    def arguments(placed, workspace):
        return placed[a], placed[b], placed[t], workspace, tuple(placed[e] for e in extras)

    options = view.options
    return LibraryCall(kernel, view, dnn_copies(t, view.strides, view.channels_last_for),
                       lambda reads: Conv(t, reads, options["tf32"], options["deterministic"]), arguments, t.attrs.mode)


TARGET = Target("conv", (DNN_CONV,), _runner, reusable=True)
