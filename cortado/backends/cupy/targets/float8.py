"""cuBLASLt's float8 GEMMs: ``float8_gemm`` terms (``lowering/float8.py`` builds them), each one call reading both
operands with the contracted axis innermost (those stored otherwise are copied so first), its scales and bias
through the descriptor's pointers, an added term as C (which the product may write over), and writing its other
results (the gelu's argument, a float8 product's amax) through them too."""

from ..calls.float8_gemm import Float8Gemm, Float8GemmCall
from ..codegen import contiguous_strides, in_c_order
from ..lowering.float8_op import FLOAT8_GEMM, operands_of, results
from . import Target
from .library import LibraryCall


def _runner(kernel, view):
    t = kernel.term
    dtype, epilogue = t.attrs.dtype, t.attrs.epilogue
    a, b, scale, bias, c, d_scale = operands_of(t)
    made = dict(zip(results(dtype, epilogue), kernel.terms))
    copies = tuple((x, contiguous_strides(x.shape)) for x in dict.fromkeys((a, b, bias, c))
                   if x is not None and not in_c_order(x.shape, view.strides[x]))
    call = Float8GemmCall(t.shape[0], t.shape[1], a.shape[1], a.dtype, b.dtype, dtype, epilogue, t.attrs.scaled,
                          t.attrs.added)

    def arguments(placed, workspace):
        return (placed[a], placed[b], placed[made["product"]], workspace,
                *(placed[x] if x is not None else None
                  for x in (scale, bias, c, made.get("gelu_argument"), d_scale, made.get("amax"))))

    detail = f"float8 {epilogue}" + (" + c" if c is not None else "") + (f" -> {dtype.name}" if "amax" in made else "")
    return LibraryCall(kernel, view, copies, lambda reads: Float8Gemm(call), arguments, detail)


TARGET = Target("float8", (FLOAT8_GEMM,), _runner, reusable=True)
