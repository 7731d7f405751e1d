"""cuBLASLt's GEMMs: ``gemm`` terms (``lowering/gemm.py``'s rules build them), each one call with its epilogue, the bias
gradient it makes written through the bias pointer, the gelu argument it keeps through the auxiliary pointer."""

from ..calls.cublaslt import Gemm, GemmCall
from ..codegen import Operand
from ..layout import gemm_copies, gemm_padded_result, gemm_padding
from ..lowering.gemm_op import GELU_ARGUMENT_RESULTS, GEMM, gemm_operands
from . import Target
from .library import LibraryCall


def gemm_call(t, strides, tf32, padding=None):
    """The ``GemmCall`` of gemm term ``t``, its operands stored at ``strides``; of the product padded to ``padding``
    (``layout.gemm_padding``: ``(m, n, k)``, its product and operands' copies C-order blocks of that padding), where
    given."""
    a, b = t.args[:2]
    attrs = t.attrs
    shape, a_shape, b_shape = t.shape, a.shape, b.shape
    if padding is not None:
        m, n, k = padding
        shape = (m, n)
        a_shape = (k, m) if attrs.transpose_a else (m, k)
        b_shape = (n, k) if attrs.transpose_b else (k, n)
    return GemmCall(Operand(a_shape, a.dtype, strides[a]), Operand(b_shape, b.dtype, strides[b]), shape, t.dtype,
                    attrs.transpose_a, attrs.transpose_b, attrs.alpha, attrs.beta, attrs.epilogue, tf32)


def _runner(kernel, view):
    t, terms = kernel.term, kernel.terms
    a, b, c, bias, aux = gemm_operands(t.args, t.attrs.beta, t.attrs.epilogue)

    second = terms[1] if len(terms) > 1 else None  # a bias gradient, or the gelu's argument
    kept = t.attrs.epilogue in GELU_ARGUMENT_RESULTS

    def arguments(placed, workspace):
        bias_address = placed[bias] if bias is not None else placed[second] if second is not None and not kept else None
        aux_address = placed[aux] if aux is not None else placed[second] if kept else None
        return (placed[a], placed[b], placed[c if c is not None else t], placed[t], workspace, bias_address, aux_address)

    padding = gemm_padding(t, view.strides)
    written = gemm_padded_result(t, padding)
    return LibraryCall(kernel, view, gemm_copies(t, view.strides),
                       lambda reads: Gemm(gemm_call(t, reads, view.options["tf32"], padding)), arguments,
                       t.attrs.epilogue, written=None if written is None else (t, *written))


TARGET = Target("gemm", (GEMM,), _runner, reusable=True)
