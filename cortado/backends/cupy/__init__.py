"""The GPU backend: generated CUDA kernels for fused regions, cuBLASLt for GEMMs, one CUDA graph a step.

``lowering`` turns matmuls into gemm calls (with their transposes, scale, added term, bias and
relu folded in) and spells composite reductions out for the kernel generator (``rules.lowering``).
``steps`` tells the planner which values are views and what may be written in place; the
``Executor`` runs the plan. CuPy and nvmath-python are imported only when a program is built.
"""

from ...rules.lowering import gpu_lowering
from .executor import Executor  # noqa: F401
from .layout import ALIGNMENT, direct_outputs, steps  # noqa: F401

name = "cupy"
alignment = ALIGNMENT
lowering = gpu_lowering
feeds_in_place = True  # the executor reads feeds where the caller keeps them (or stages them): the arena has none
OPTIONS = {"cuda_graph": True, "tf32": False, "autotune": True}
