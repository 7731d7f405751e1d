"""cuBLASLt's GEMMs: ``gemm`` terms (``lowering/gemm.py`` builds them), each one call with its epilogue, the bias
gradient it makes written through the bias pointer."""

from ..blas import Gemm
from ..layout import gemm_copies
from ..lowering.gemm import GEMM, gemm_operands
from . import Target
from .library import LibraryCall


def _runner(kernel, view):
    t, terms = kernel.term, kernel.terms
    a, b, c, bias, aux = gemm_operands(t.args, t.attrs.beta, t.attrs.epilogue)

    def arguments(placed, workspace):
        bias_address = placed[terms[1]] if len(terms) > 1 else placed[bias] if bias is not None else None
        return (placed[a], placed[b], placed[c if c is not None else t], placed[t], workspace, bias_address,
                placed[aux] if aux is not None else None)

    return LibraryCall(kernel, view, gemm_copies(t, view.strides), lambda reads: Gemm(t, reads, view.options["tf32"]),
                       arguments, t.attrs.epilogue)


TARGET = Target("gemm", (GEMM,), _runner, reusable=True)
