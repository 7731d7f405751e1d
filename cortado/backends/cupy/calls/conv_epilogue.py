"""A forward convolution's epilogue (a bias, a residual, a relu) as a generated kernel over its result, in place.

``dnn_conv`` folds them in (``lowering.conv.finish``) so cuDNN can apply them as it writes the
convolution; where cuDNN has no fused plan for the layouts, or its fused plans are slower, the
convolution runs alone and this kernel follows it: the one elementwise pass fusion would have made.
"""


from ....exprgraph import constructors as ct
from ....exprgraph.ops import parameter
from ..codegen import Operand, memory_order
from ..sources import kernel_source
from ..kernels import launcher
from ..lowering.conv import epilogue_parts


class EpilogueKernel:
    """``out = relu(out + bias + residual)`` (as ``ConvCall`` ``call``'s epilogue names them) over its result."""

    def __init__(self, call):
        out = call.out
        operands, value = [out], parameter(0, out)
        parts = epilogue_parts(call.epilogue)
        for part, extra in zip([p for p in parts if p != "relu"], call.extras):
            strides = (0, extra.strides[0]) + (0,) * (len(out.shape) - 2) if part == "bias" else extra.strides
            operand = Operand(out.shape, out.dtype, strides)
            value = ct.add(value, parameter(len(operands), operand))
            operands.append(operand)
        if "relu" in parts:
            value = ct.relu(value)
        order = memory_order(out.shape, out.strides)
        self.source = kernel_source((value,), operands, aliased={0}, order=order)

    def __call__(self, out, extras):
        """Launch on CuPy's current stream over the result at ``out`` and the bias and residual at ``extras``."""
        launcher(self.source, (out, *extras, out))()
