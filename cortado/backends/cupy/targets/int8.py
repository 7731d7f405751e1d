"""Int8 products with their epilogues: ``int8_gemm`` terms (``lowering/int8.py`` builds them), our tensor-core
kernels (mma.sync, wgmma) or cuBLASLt's, the fastest when the program is built (``calls.int8.runner``)."""

from ..codegen import Operand
from ..lowering.int8 import INT8_GEMM
from ..calls.int8.runner import Int8Call, Int8Gemm
from . import Target
from .library import LibraryCall


def int8_call(t, strides, constant):
    """The ``Int8Call`` of ``int8_gemm`` term ``t``, its values stored at ``strides``; ``constant(x)``: whether ``x``
    is a constant of the program."""
    a, b, *extras = (Operand(x.shape, x.dtype, strides[x]) for x in t.args)
    return Int8Call(a, b, t.attrs.epilogue, tuple(extras), strides[t], constant(t.args[0]), constant(t.args[1]))


def _runner(kernel, view):
    t = kernel.term
    a, b, *extras = t.args

    def arguments(placed, workspace):
        return placed[a], placed[b], tuple(placed[e] for e in extras), placed[t], workspace

    return LibraryCall(kernel, view, (), lambda reads: Int8Gemm(int8_call(t, reads, view.constant)), arguments)


TARGET = Target("int8", (INT8_GEMM,), _runner, reusable=True)
