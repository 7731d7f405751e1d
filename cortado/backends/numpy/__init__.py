"""The CPU backend: views into one NumPy arena, every op a NumPy call with ``out=``, no allocation.

Transposes and broadcasts are views and cost nothing; a reshape is a view where the layout
allows one. Fused regions run their body op by op through a small workspace (``fused``).
"""

from .executor import Executor  # noqa: F401
from .layout import steps  # noqa: F401

name = "numpy"
alignment = 64
lowering = None  # NumPy's matmul is already the GEMM; there is nothing to lower to
