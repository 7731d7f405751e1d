"""``dnn_attention`` and ``dnn_attention_grad`` terms as cuDNN's flash attention (``sdpa``, ``sdpa_backward``),
through nvidia-cudnn-frontend's graph API, into planned buffers.

cuDNN describes each operand as ``(batch, heads, sequence, head size)`` dims with strides, the same dims for all;
ours have any number of leading axes: the last is the heads, the others are merged into the batch where their
strides allow (a ``(batch, heads, time, size)`` view of a projection's ``(batch, time, heads, size)`` output is read
in place). An operand whose batch axes do not merge, or whose strides are not multiples of 8 elements (16 bytes,
as cuDNN's loads need), is copied first (``targets.attention``). The graph is built once per description when the
program is built, with its workspace planned in the arena; a call passes pointers only, so it is captured in the
step's CUDA graph. The backward pass is deterministic unless the program allows otherwise (``deterministic=False``).
"""

import math
from dataclasses import dataclass

import numpy as np

from ....errors import BackendError
from .cudnn_conv import DATA_TYPES, cudnn_module, handle

_graphs = {}  # a call's description -> (cuDNN graph, its tensors in operand-then-result order)


def four_dims(shape, strides):
    """``(dims, strides)`` of ``(batch, heads, sequence, size)`` for a value of ``shape`` and element ``strides``: its
    last leading axis is the heads, the others merged into the batch (the same dims for every operand and result,
    as cuDNN wants); None where those do not merge or the last axis is not contiguous."""
    if shape[-1] != 1 and strides[-1] != 1:
        return None
    lead, lead_strides = shape[:-2], strides[:-2]
    batch = [(n, s) for n, s in zip(lead[:-1], lead_strides[:-1]) if n != 1]
    if any(outer != n * inner for (_, outer), (n, inner) in zip(batch, batch[1:])):
        return None
    heads, head_stride = (lead[-1], lead_strides[-1]) if lead else (1, shape[-2] * strides[-2])
    batch_count = math.prod(n for n, _ in batch)
    batch_stride = batch[-1][1] if batch else heads * head_stride
    return [batch_count, heads, shape[-2], shape[-1]], [batch_stride, head_stride, strides[-2], strides[-1]]


@dataclass(frozen=True)
class AttentionCall:
    """All a flash attention call is made from: ``forward`` (operands ``q``, ``k``, ``v``; results the output and
    its row statistics) or backward (operands ``q``, ``k``, ``v``, the output, its gradient and the statistics;
    results ``dq``, ``dk``, ``dv``), each an ``Operand`` (shape, dtype, element strides); the scores' ``scale``,
    whether a causal mask hides the future, and whether the backward pass must give the same bits every run."""

    forward: bool
    operands: tuple
    results: tuple
    scale: float
    causal: bool
    deterministic: bool = True


class Attention:
    """The cuDNN call ``AttentionCall`` describes, over fixed pointers."""

    def __init__(self, call):
        self.forward = call.forward
        self.values = call.operands + call.results
        described = []
        for x in self.values:
            found = four_dims(x.shape, x.strides)
            if found is None:
                raise BackendError(f"cuDNN's flash attention cannot read an operand of shape {x.shape} with strides "
                                   f"{x.strides}")
            described.append(found)
        self.dtype = np.dtype(call.operands[0].dtype)
        self.key = call
        if self.key not in _graphs:
            _graphs[self.key] = self._build(call, described)
        self.graph, self.tensors = _graphs[self.key]
        self.workspace_bytes = self.graph.get_workspace_size()

    def _build(self, call, described):
        cudnn = cudnn_module()
        io = getattr(cudnn.data_type, DATA_TYPES[self.dtype.name])
        graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle())
        inputs = [graph.tensor(dim=dims, stride=strides, data_type=io if x.dtype == self.dtype else cudnn.data_type.FLOAT)
                  for x, (dims, strides) in zip(call.operands, described)]
        if self.forward:
            results = graph.sdpa(q=inputs[0], k=inputs[1], v=inputs[2], attn_scale=call.scale, generate_stats=True,
                                 use_causal_mask=call.causal, name="attention")
        else:
            q, k, v, o, dout, stats = inputs
            results = graph.sdpa_backward(q=q, k=k, v=v, o=o, dO=dout, stats=stats, attn_scale=call.scale,
                                          use_causal_mask=call.causal, use_deterministic_algorithm=call.deterministic,
                                          name="attention_grad")
        for tensor, x, (dims, strides) in zip(results, call.results, described[len(call.operands):]):
            data_type = io if x.dtype == self.dtype else cudnn.data_type.FLOAT
            tensor.set_output(True).set_dim(dims).set_stride(strides).set_data_type(data_type)
        try:
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
        except Exception as error:  # cuDNN's own exception types differ between its engines
            raise BackendError(f"cuDNN's flash attention cannot run this {'forward' if call.forward else 'backward'} "
                               f"pass of {[x.shape for x in call.operands]}: {error}") from None
        return graph, tuple(inputs) + tuple(results)

    def describe(self):
        return f"cuDNN flash attention, {'forward' if self.forward else 'backward'}"

    def call(self, pointers, workspace, stream):
        """Run on device ``pointers`` (the operands, then the results) on ``stream`` (a pointer)."""
        cudnn_module().set_stream(handle(), stream)
        self.graph.execute(dict(zip(self.tensors, pointers)), workspace, handle=handle())
