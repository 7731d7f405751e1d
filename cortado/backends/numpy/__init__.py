"""The CPU backend: views into one NumPy arena, every op a NumPy call with ``out=``, no allocation.

Transposes and broadcasts are views and cost nothing; a reshape is a view where the layout
allows one. A fused region of elementwise arithmetic is one C loop nest (``csource``, ``native``);
any other runs its body op by op through a small workspace (``fused``). NumPy's matmul is the GEMM;
the one lowering is an einsum of two floating operands as transposes and reshapes around one matmul
(``rules.decompositions.einsums_as_matmuls``): ``np.einsum`` contracts without BLAS.
"""

from ...rules.decompositions import einsums_as_matmuls
from ...rules.engine import Postwalk
from ..interface import Backend
from . import layout
from .executor import Executor


class EinsumsAsMatmuls:
    """The CPU's lowering: ``einsums_as_matmuls`` over the whole graph."""

    rules = Postwalk(einsums_as_matmuls)

    def run(self, roots, trace=None, variant=None):
        return self.rules.run(list(roots), trace)


class NumpyBackend(Backend):
    name = "numpy"
    alignment = 64
    lowering = EinsumsAsMatmuls()

    def steps(self, kernels, options):
        return layout.steps(kernels, options)

    def executor(self, kernels, steps, plan, signature, outputs, updates, sinks, **options):
        return Executor(kernels, steps, plan, signature, outputs, updates, sinks)


backend = NumpyBackend()
