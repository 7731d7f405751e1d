"""cuDNN's flash attention: ``dnn_attention`` and ``dnn_attention_grad`` terms (``lowering/attention.py`` builds
them), forward (output and statistics) or backward (``dq``, ``dk``, ``dv``), one call each.

An operand whose batch axes do not merge, or whose strides are not multiples of ``ALIGNMENT`` elements, is read
from a C-ordered copy."""

import numpy as np

from ..codegen import Operand, contiguous_strides
from ..calls.cudnn_attention import Attention, AttentionCall, four_dims
from ..lowering.attention import DNN_ATTENTION, DNN_ATTENTION_GRAD
from . import Target
from .library import LibraryCall

ALIGNMENT = 8  # elements: cuDNN's flash attention reads 16-byte vectors of half-precision values


def _readable(x, strides):
    described = four_dims(x.shape, strides)
    return described is not None and all(s % ALIGNMENT == 0 for n, s in zip(described[0][:3], described[1][:3])
                                         if n > 1)


def attention_copies(t, strides):
    """The operands of ``t`` that cuDNN reads from a C-ordered copy (``(value, its copy's strides)`` pairs)."""
    return tuple((x, contiguous_strides(x.shape)) for x in dict.fromkeys(t.args)
                 if x.dtype != np.float32 and not _readable(x, strides[x]))


def attention_call(t, strides, deterministic):
    """The ``AttentionCall`` of the kernel of ``t``, its values stored at ``strides``."""
    def operand(x):
        return Operand(x.shape, x.dtype, strides[x])

    return AttentionCall(t.op is DNN_ATTENTION, tuple(map(operand, t.args)), tuple(map(operand, t.op.results_of(t))),
                         t.attrs.scale, t.attrs.causal, deterministic)


class _AttentionCall(LibraryCall):
    tuned = False  # cuDNN's heuristics choose its plan


def _runner(kernel, view):
    t = kernel.term
    values = tuple(t.args) + t.op.results_of(t)

    def arguments(placed, workspace):
        return [placed[x] for x in values], workspace

    return _AttentionCall(kernel, view, attention_copies(t, view.strides),
                          lambda reads: Attention(attention_call(t, reads, view.options["deterministic"])), arguments)


TARGET = Target("attention", (DNN_ATTENTION, DNN_ATTENTION_GRAD), _runner, reusable=True)
