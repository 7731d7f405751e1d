"""A fused region on the CPU (``backends.numpy.fused``) computes every output of its body whatever their order: an
output that later outputs read is never used as scratch for their intermediates."""

import numpy as np

import cortado as ct
from cortado.backends.numpy.fused import emit_fused, plan_fused
from cortado.backends.numpy.kernels import Emitter
from cortado.exprgraph.ops import parameter


def test_a_first_output_that_later_outputs_read_keeps_its_value():
    """Output 0, ``x * x``, is computed first and read by the other outputs, whose chains of intermediates have its
    shape and dtype: none of them may be written into output 0's buffer after it holds its value."""
    x = parameter(0, ct.var("x", (4,), "float32"))
    square = x * x
    outputs = (square, ct.exp(-ct.abs(square * 0.5 + 1.0)), 1.0 + ct.exp(-ct.abs(square * 2.0)))
    value = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    workspace, _, _ = plan_fused(outputs, (((4,), np.dtype(np.float32)),))
    em = Emitter(np.zeros(workspace, np.uint8))
    outs = [np.empty(4, np.float32) for _ in outputs]
    emit_fused(em, outputs, [value], outs, {})
    for call in em.calls:
        call()
    square_value = value * value
    np.testing.assert_array_equal(outs[0], square_value)
    np.testing.assert_array_equal(outs[1], np.exp(-np.abs(square_value * np.float32(0.5) + np.float32(1.0))))
    np.testing.assert_array_equal(outs[2], np.float32(1.0) + np.exp(-np.abs(square_value * np.float32(2.0))))


def test_a_steps_workspace_does_not_depend_on_where_its_stand_ins_lie(monkeypatch):
    """A region is measured with stand-ins of one element each (``kernels.c_strided``), whose claimed spans overlap
    wherever the allocator puts them; a stand-in shares memory with no other array (``standins``), so what a region
    writes straight into its outputs, and so its workspace, is the same wherever they lie (a GPT's arena was 6.15 MiB
    in one process and 6.65 in the next)."""
    from cortado import nn, optim
    from cortado.backends.numpy import fused, kernels
    from cortado.backends.numpy.standins import StandIn

    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64))
    x = ct.var("x", (256, 64))
    loss = ct.mean(ct.exp(model(x) * 0.5)) + ct.mean(ct.log(ct.relu(model(x)) + 2.0))
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-3).updates(params, ct.grad(loss, list(params.values())))

    def compiled():
        step = ct.compile([loss], inputs=[x], state={**model.initial_values(0), **state}, updates=updates)
        return sorted((p.label, p.nbytes) for b in step.memory.buffers for p in b.placements)

    apart = compiled()
    one = np.empty(8, np.uint8)  # every stand-in's element in one place: their spans all overlap

    def together(shape, dtype):
        stand_in = kernels.c_strided(shape, dtype)
        return np.lib.stride_tricks.as_strided(one.view(dtype)[:1], shape, stand_in.strides).view(StandIn)

    monkeypatch.setattr(fused, "c_strided", together)
    assert compiled() == apart
