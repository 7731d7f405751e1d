"""The GPU backend: generated CUDA kernels for fused regions, cuBLASLt for GEMMs, one CUDA graph a step.

``lowering`` (one rule file per target) turns matmuls into gemm calls, with their transposes, scale,
added term, bias and epilogues folded in, and spells composite reductions out for the kernel
generator. ``layout.steps`` tells the planner which values are views and what may be written in
place; the ``Executor`` runs the plan. CuPy and nvmath-python are imported only when a program is built.
"""

from ...errors import BackendError
from ...memplan.copy_hosts import remapped
from ...rules.fusion import KernelShapes
from ..interface import Backend
from . import layout
from .runtime.beside import chosen as chosen_beside
from .runtime.executor import Executor
from .lowering import lowering
from .lowering.bias_gradient_ones import ones_into_writers
from .lowering.float8_transposes import written_transposed
from .lowering.transposed_sums import sums_into_transposed


class CupyBackend(Backend):
    name = "cupy"
    alignment = layout.ALIGNMENT
    options = {"cuda_graph": True, "tf32": False, "autotune": True, "nhwc": "auto", "deterministic": True,
               "channels_last_io": False, "overlap_updates": True}
    feeds_in_place = True  # the executor reads feeds where the caller keeps them (or stages them)
    lowering = lowering
    # codegen makes every kernel from a fused body, and reduction_kernels._column_lines sums several columns a pass
    kernel_shapes = KernelShapes(one_op=True, sibling_columns=True, horizontal=True)
    collectives = True  # all-reduces through NCCL (cortado.distributed)
    keeps_casts = True  # the optimizer's kernels write the weights' casts, which the step's start read all of
    gathers_raise = False  # the GPU's gathers clamp an index into the axis: no kernel stops a step on its values

    def require(self):
        try:
            import cupy  # noqa: F401
            import nvmath  # noqa: F401
        except ImportError as error:
            raise BackendError(f"compile: the cupy backend needs CuPy and nvmath-python (pip install -e \".[gpu]\"): "
                               f"{error}") from None

    def steps(self, kernels, options):
        return layout.steps(kernels, options)

    def direct_outputs(self, kernels, steps, outputs, sinks, options):
        return layout.direct_outputs(kernels, steps, outputs, sinks, options)

    def beside(self, kernels, steps, sinks, options):
        return chosen_beside(kernels, steps, sinks, options)

    def after_fusion(self, roots, trace):
        return sums_into_transposed(written_transposed(roots, trace), trace)

    def after_recomputation(self, roots, copies, trace):
        roots, made = ones_into_writers(roots, trace, {r for readers in copies.values() for r in readers} | set(copies))
        return roots, remapped(copies, made)

    def alternatives(self, planned):
        return self.lowering.alternatives(planned)

    def executor(self, kernels, steps, plan, signature, outputs, updates, sinks, beside, overlap_updates=True,
                 **options):
        return Executor(kernels, steps, plan, signature, outputs, updates, sinks, beside, **options)


backend = CupyBackend()
