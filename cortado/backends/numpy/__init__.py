"""The CPU backend: views into one NumPy arena, every op a NumPy call with ``out=``, no allocation.

Transposes and broadcasts are views and cost nothing; a reshape is a view where the layout
allows one. A fused region of elementwise arithmetic is one C loop nest (``csource``, ``native``);
any other runs its body op by op through a small workspace (``fused``). NumPy's matmul is already
the GEMM, so there is nothing to lower to.
"""

from ..interface import Backend
from . import layout
from .executor import Executor


class NumpyBackend(Backend):
    name = "numpy"
    alignment = 64

    def steps(self, kernels, options):
        return layout.steps(kernels, options)

    def executor(self, kernels, steps, plan, signature, outputs, updates, sinks, **options):
        return Executor(kernels, steps, plan, signature, outputs, updates, sinks)


backend = NumpyBackend()
