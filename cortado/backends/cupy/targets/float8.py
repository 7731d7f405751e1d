"""cuBLASLt's float8 GEMMs: ``float8_gemm`` terms (``lowering/float8.py`` builds them), each one call reading both
operands with the contracted axis innermost (those stored otherwise are copied so first), its scale and bias
through the descriptor's pointers."""

from ..calls.float8_gemm import Float8Gemm, Float8GemmCall
from ..codegen import contiguous_strides, in_c_order
from ..lowering.float8 import FLOAT8_GEMM, float8_operands
from . import Target
from .library import LibraryCall


def _runner(kernel, view):
    t = kernel.term
    a, b, scale, bias = float8_operands(t.args, t.attrs.scaled, t.attrs.epilogue)
    copies = tuple((x, contiguous_strides(x.shape)) for x in dict.fromkeys((a, b, bias))
                   if x is not None and not in_c_order(x.shape, view.strides[x]))
    call = Float8GemmCall(t.shape[0], t.shape[1], a.shape[1], a.dtype, b.dtype, t.dtype, t.attrs.epilogue, t.attrs.scaled)

    def arguments(placed, workspace):
        return (placed[a], placed[b], placed[t], workspace, placed[scale] if scale is not None else None,
                placed[bias] if bias is not None else None)

    return LibraryCall(kernel, view, copies, lambda reads: Float8Gemm(call), arguments, f"float8 {t.attrs.epilogue}")


TARGET = Target("float8", (FLOAT8_GEMM,), _runner, reusable=True)
