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
