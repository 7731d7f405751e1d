"""The CPU backend: views into one NumPy arena, every op a NumPy call with ``out=``, no allocation.

Transposes and broadcasts are views and cost nothing; a reshape is a view where the layout
allows one. A fused region of elementwise arithmetic is one C loop nest (``csource``, ``native``);
any other runs its body op by op through a small workspace (``fused``). NumPy's matmul is the GEMM;
the lowering (``lowering``) makes an einsum of two floating operands one matmul, and an attention of few queries
keep its probabilities for its gradient.
"""

from ..interface import Backend
from . import layout
from .executor import Executor
from .lowering import Lowering


class NumpyBackend(Backend):
    name = "numpy"
    alignment = 64
    lowering = Lowering()

    def steps(self, kernels, options):
        return layout.steps(kernels, options)

    def executor(self, kernels, steps, plan, signature, outputs, updates, sinks, beside, **options):
        return Executor(kernels, steps, plan, signature, outputs, updates, sinks)


backend = NumpyBackend()
