"""``float8_gemm`` terms as cuBLASLt calls: ``epilogue(scale * a @ b^T + bias + c)`` of float8 matrices, summed in
float32 and rounded once to the output's dtype (a float8 output after its D scale, with its largest magnitude written
through the AMAX_D pointer; a ``*_aux`` epilogue's gelu argument through the auxiliary pointer, in bfloat16).

cuBLASLt multiplies float8 on Hopper only in its "TN" form: column-major, the first operand transposed, the second
not. Our row-major ``a`` (m, k) and ``b`` (n, k), both with the contracted axis innermost, are exactly that: the
column-major ``D^T = b^T' @ a'`` with ``b`` read transposed. The scale is a float32 on the device (a value the step
computes: the inverse of the operands' scales), passed through the A scale pointer; the sums are accumulated in
float32 throughout (no ``FAST_ACCUM``, whose partial sums on Hopper keep fewer bits). Everything else (tuning,
the descriptor's pointers, the heuristic's candidates) is the plain GEMM's (``cublaslt``).
"""

from dataclasses import dataclass

import numpy as np

from ....errors import BackendError
from ....exprgraph.dtypes import BFLOAT16, is_float8
from .cublaslt import _heuristics, _lt, Gemm, heuristic, matrix_layout

_DATA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0, "float8_e4m3fn": 28, "float8_e5m2": 29}  # cudaDataType
_EPILOGUES = {"none": "DEFAULT", "bias": "BIAS", "gelu": "GELU", "bias_gelu": "GELU_BIAS", "gelu_aux": "GELU_AUX",
              "bias_gelu_aux": "GELU_AUX_BIAS"}
# what the heuristic sees of a pointer that each call sets: null, but for the amax, which a null pointer would ask
# no algorithm to compute
_AMAX_PLACEHOLDER = 256
# the scratch a candidate may need where no algorithm needs none: cuBLASLt's float8 algorithms that take workspace ask
# for it zeroed, a memset before each call (96 in the large GPT step, each with its gap)
WORKSPACE_LIMIT = 32 << 20


@dataclass(frozen=True)
class Float8GemmCall:
    """All a float8 call is made from: ``a`` (m, k) and ``b`` (n, k) stored in C order, their dtypes, the output's
    (a float8 one reads a D scale and writes its amax), the epilogue, whether a scale is read, and whether a term
    is added (C, read at beta 1, stored like the output)."""

    m: int
    n: int
    k: int
    a_dtype: np.dtype
    b_dtype: np.dtype
    dtype: np.dtype
    epilogue: str = "none"
    scaled: bool = False
    added: bool = False


class Float8Gemm(Gemm):
    """The cuBLASLt call ``Float8GemmCall`` describes, over fixed pointers: a plain GEMM's tuning and pointers, a
    descriptor of its own (so ``Gemm.__init__`` is not called)."""

    def __init__(self, call):
        lt = _lt()
        from nvmath.bindings.cublas import ComputeType

        output = np.dtype(call.dtype)
        self.float8_output = is_float8(output)
        # the bias's, C's (read at beta 1 where a term is added; a float8 D pairs with a bfloat16 C, never read),
        # what tuning fills with
        wide = np.dtype(BFLOAT16) if self.float8_output else output
        self.dtype = wide
        self.scalars = np.array([1.0, 1.0 if call.added else 0.0], np.float32)
        self.desc = lt.matmul_desc_create(ComputeType.COMPUTE_32F, 0)  # scales in float32 (CUDA_R_32F)
        self._set(lt.MatmulDescAttribute.TRANSA, 1)
        self._set(lt.MatmulDescAttribute.TRANSB, 0)
        self._set(lt.MatmulDescAttribute.EPILOGUE, int(getattr(lt.Epilogue, _EPILOGUES[call.epilogue])))
        self.bias = "bias" in call.epilogue
        self.aux = call.epilogue.endswith("_aux")
        self.bias_gradient = False
        self.pointed = {}
        m, n, k = call.m, call.n, call.k
        if self.bias:
            self._set(lt.MatmulDescAttribute.BIAS_DATA_TYPE, _DATA_TYPES[wide.name])
        if self.aux:  # the gelu's argument, row-major like the product, in bfloat16
            self._set(lt.MatmulDescAttribute.EPILOGUE_AUX_LD, n)
            self._set(lt.MatmulDescAttribute.EPILOGUE_AUX_DATA_TYPE, _DATA_TYPES["bfloat16"])
        self.scaled = call.scaled
        types = (_DATA_TYPES[np.dtype(call.b_dtype).name], _DATA_TYPES[np.dtype(call.a_dtype).name],
                 _DATA_TYPES[wide.name], _DATA_TYPES[output.name])
        shapes = [(k, n, k), (k, m, k), (n, m, n), (n, m, n)]
        self.layouts = [matrix_layout(data, *shape) for data, shape in zip(types, shapes)]
        self.key = ("float8", types, tuple(shapes), call.epilogue, call.scaled, call.added)
        if self.key not in _heuristics:  # the heuristic looks at the epilogue's pointers too
            for name, used in (("BIAS_POINTER", self.bias), ("A_SCALE_POINTER", self.scaled),
                               ("EPILOGUE_AUX_POINTER", self.aux), ("D_SCALE_POINTER", self.float8_output),
                               ("AMAX_D_POINTER", self.float8_output)):
                if used:
                    self._point(name, _AMAX_PLACEHOLDER if name == "AMAX_D_POINTER" else 0)
            _heuristics[self.key] = _workspace_free_first(self.desc, self.layouts)
        self.candidates = _heuristics[self.key]
        self.workspace_bytes = int(self.candidates["workspace_size"].max())
        self.choice = 0

    def call(self, a, b, d, workspace, scale, bias, c, aux, d_scale, amax, stream):
        """Run on device pointers (``scale``, ``bias``, ``c``, ``aux``, ``d_scale``, ``amax``: None where the call has
        none) on ``stream``. Without ``c``, C is not read (beta is 0): it is ``aux`` where there is one (a float8 D
        pairs with a bfloat16 C), else ``d``."""
        for name, pointer in (("A_SCALE_POINTER", scale), ("BIAS_POINTER", bias), ("EPILOGUE_AUX_POINTER", aux),
                              ("D_SCALE_POINTER", d_scale), ("AMAX_D_POINTER", amax)):
            if pointer is not None:
                self._point(name, pointer)
        self._matmul(a, b, c if c is not None else aux if aux is not None else d, d, workspace, stream)


def _workspace_free_first(desc, layouts):
    """The heuristic's candidates that need no workspace, else those within ``WORKSPACE_LIMIT``."""
    try:
        return heuristic(desc, layouts, 0)
    except BackendError:
        return heuristic(desc, layouts, WORKSPACE_LIMIT)
