"""Int8 products with their epilogues: ``int8_gemm`` terms (``lowering/int8.py`` builds them), our tensor-core
kernels (mma.sync, wgmma) or cuBLASLt's, the fastest when the program is built (``mma.runner``)."""

from ..lowering.int8 import INT8_GEMM
from ..mma.runner import Int8Gemm
from . import Target
from .library import LibraryCall


def _runner(kernel, view):
    t = kernel.term
    a, b, *extras = t.args

    def arguments(placed, workspace):
        return placed[a], placed[b], tuple(placed[e] for e in extras), placed[t], workspace

    return LibraryCall(kernel, view, (), lambda reads: Int8Gemm(t, reads, (view.constant(a), view.constant(b))),
                       arguments)


TARGET = Target("int8", (INT8_GEMM,), _runner, reusable=True)
