"""``float8_gemm`` terms as cuBLASLt calls: ``epilogue(scale * a @ b^T + bias)`` of float8 matrices, summed in
float32 and rounded once to the output's dtype.

cuBLASLt multiplies float8 on Hopper only in its "TN" form: column-major, the first operand transposed, the second
not. Our row-major ``a`` (m, k) and ``b`` (n, k), both with the contracted axis innermost, are exactly that: the
column-major ``D^T = b^T' @ a'`` with ``b`` read transposed. The scale is a float32 on the device (a value the step
computes: the inverse of the operands' scales), passed through the A scale pointer; the sums are accumulated in
float32 throughout (no ``FAST_ACCUM``, whose partial sums on Hopper keep fewer bits). Everything else (tuning,
the descriptor's pointers, the heuristic's candidates) is the plain GEMM's (``cublaslt``).
"""

from dataclasses import dataclass

import numpy as np

from .cublaslt import _heuristics, _lt, Gemm, heuristic, matrix_layout

_DATA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0, "float8_e4m3fn": 28, "float8_e5m2": 29}  # cudaDataType
_EPILOGUES = {"none": "DEFAULT", "bias": "BIAS", "gelu": "GELU", "bias_gelu": "GELU_BIAS"}
WORKSPACE_LIMIT = 32 << 20


@dataclass(frozen=True)
class Float8GemmCall:
    """All a float8 call is made from: ``a`` (m, k) and ``b`` (n, k) stored in C order, their dtypes, the output's,
    the epilogue, and whether a scale is read."""

    m: int
    n: int
    k: int
    a_dtype: np.dtype
    b_dtype: np.dtype
    dtype: np.dtype
    epilogue: str = "none"
    scaled: bool = False


class Float8Gemm(Gemm):
    """The cuBLASLt call ``Float8GemmCall`` describes, over fixed pointers: a plain GEMM's tuning and pointers, a
    descriptor of its own (so ``Gemm.__init__`` is not called)."""

    def __init__(self, call):
        lt = _lt()
        from nvmath.bindings.cublas import ComputeType

        self.dtype = np.dtype(call.dtype)
        self.scalars = np.array([1.0, 0.0], np.float32)
        self.desc = lt.matmul_desc_create(ComputeType.COMPUTE_32F, 0)  # scales in float32 (CUDA_R_32F)
        self._set(lt.MatmulDescAttribute.TRANSA, 1)
        self._set(lt.MatmulDescAttribute.TRANSB, 0)
        self._set(lt.MatmulDescAttribute.EPILOGUE, int(getattr(lt.Epilogue, _EPILOGUES[call.epilogue])))
        self.bias = "bias" in call.epilogue
        self.bias_gradient = self.aux = False
        self.pointed = {}
        if self.bias:
            self._set(lt.MatmulDescAttribute.BIAS_DATA_TYPE, _DATA_TYPES[self.dtype.name])
        self.scaled = call.scaled
        m, n, k = call.m, call.n, call.k
        types = (_DATA_TYPES[np.dtype(call.b_dtype).name], _DATA_TYPES[np.dtype(call.a_dtype).name],
                 _DATA_TYPES[self.dtype.name], _DATA_TYPES[self.dtype.name])
        shapes = [(k, n, k), (k, m, k), (n, m, n), (n, m, n)]
        self.layouts = [matrix_layout(data, *shape) for data, shape in zip(types, shapes)]
        self.key = ("float8", types, tuple(shapes), call.epilogue, call.scaled)
        if self.key not in _heuristics:
            if self.bias:  # the heuristic looks at the epilogue's pointers too
                self._point("BIAS_POINTER", 0)
            if self.scaled:
                self._point("A_SCALE_POINTER", 0)
            _heuristics[self.key] = heuristic(self.desc, self.layouts, WORKSPACE_LIMIT)
        self.candidates = _heuristics[self.key]
        self.workspace_bytes = int(self.candidates["workspace_size"].max())
        self.choice = 0

    def call(self, a, b, d, workspace, scale, bias, stream):
        """Run on device pointers (``scale``, ``bias``: None where the call reads none) on ``stream``."""
        if scale is not None:
            self._point("A_SCALE_POINTER", scale)
        if bias is not None:
            self._point("BIAS_POINTER", bias)
        self._matmul(a, b, d, d, workspace, stream)
