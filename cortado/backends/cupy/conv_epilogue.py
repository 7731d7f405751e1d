"""A forward convolution's epilogue (a bias, a residual, a relu) as a generated kernel over its result, in place.

``dnn_conv`` folds them in (``lowering.conv.finish``) so cuDNN can apply them as it writes the
convolution; where cuDNN has no fused plan for the layouts, or its fused plans are slower, the
convolution runs alone and this kernel follows it: the one elementwise pass fusion would have made.
"""


from ...exprgraph import constructors as ct
from ...exprgraph.ops import parameter
from .codegen import Operand, memory_order
from .sources import kernel_source
from .kernels import launcher
from .lowering.conv import epilogue_parts


class EpilogueKernel:
    """``out = relu(out + bias + residual)`` (as ``term``'s epilogue names them) over ``term``'s stored result."""

    def __init__(self, term, layouts):
        out = Operand(term.shape, term.dtype, layouts[term])
        operands, value = [out], parameter(0, out)
        parts = epilogue_parts(term.attr("epilogue"))
        for part, extra in zip([p for p in parts if p != "relu"], term.args[2:]):
            strides = (0, layouts[extra][0]) + (0,) * (term.ndim - 2) if part == "bias" else layouts[extra]
            operand = Operand(term.shape, term.dtype, strides)
            value = ct.add(value, parameter(len(operands), operand))
            operands.append(operand)
        if "relu" in parts:
            value = ct.relu(value)
        order = memory_order(term.shape, layouts[term])
        self.source = kernel_source((value,), operands, aliased={0}, order=order)

    def __call__(self, out, extras):
        """Launch on CuPy's current stream over the result at ``out`` and the bias and residual at ``extras``."""
        launcher(self.source, (out, *extras, out))()
