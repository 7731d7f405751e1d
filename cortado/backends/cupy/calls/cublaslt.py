"""``gemm`` terms as cuBLASLt calls, through nvmath-python's bindings, into planned buffers.

cuBLASLt is column-major; a row-major ``D = op(a) @ op(b)`` is the column-major
``D^T = op(b)^T @ op(a)^T``, so ``b`` goes first and the transposes stay as they are. Everything a
call needs is made once, when the program is built: the descriptors, the algorithm, alpha and
beta in host memory. A call then only passes pointers, so it allocates nothing and can be captured
in a CUDA graph (CuPy's own cuBLAS wrapper refuses to run during capture).

The algorithm is the fastest of cuBLASLt's first ``CANDIDATES`` heuristic choices, each timed on
the program's own buffers when it is built (``autotune=False``, or a product of ``SETTLED_PRODUCT``
multiply-adds or more: the first choice). The heuristic
alone often picks a tile too large for a small product: 128x1024x1024 float32 then fills a few of
the 132 multiprocessors. A choice is remembered (``choices``), by everything that describes the call,
for the process and on disk, so two programs with the same GEMM compute the same bits in every process
(timing alone could pick either of two close candidates).
"""

import math
from dataclasses import dataclass

import numpy as np

from ....errors import BackendError
from ..codegen import Operand
from ..lowering.gemm_op import BIAS_GRADIENT_RESULTS, GELU_ARGUMENT_RESULTS
from . import choices
from .timing import time_graph

WORKSPACE_LIMIT = (4 << 20, 32 << 20)  # the most scratch a candidate may need (split-K and the like): a product, a large one
LARGE_PRODUCT = 1 << 30  # multiply-adds from which a product is large
# ... and from which it keeps the heuristic's first choice, untimed: a card running products this large back to
# back is held at its power limit (an H100: 1260-1480 MHz of its 1980), candidates timed when a program is built rank
# by the clocks they happened to run at, and the large MLP step (three 8192^3 layers, 2^39 multiply-adds a product)
# ran slower with its tuned GEMMs than with the first choices in every H100 run: 13.37 against 12.49 ms, 13.17
# against 12.28, 13.39 against 12.45 (benchmarks/results/h100/experiments/sustained_tuning/)
SETTLED_PRODUCT = 1 << 38
CANDIDATES = 8  # heuristic choices timed when a program is built
MARGIN = 0.03  # how much faster than the heuristic's first choice another must be to replace it

_DATA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0, "float64": 1}  # cudaDataType
# the configuration attributes (cublasLtMatmulAlgoConfigAttributes_t) that name an algorithm (``algorithm_name``)
_CONFIGURATION = ("ID", "TILE_ID", "STAGES_ID", "SPLITK_NUM", "REDUCTION_SCHEME", "CTA_SWIZZLING", "CUSTOM_OPTION",
                  "INNER_SHAPE_ID", "CLUSTER_SHAPE_ID")
_handle = None
_heuristics = {}  # a call's description -> cuBLASLt's candidates for it
# ours -> cuBLASLt's, whose A is our b (see above): our bgrad_b is its BGRADA
_EPILOGUES = {"none": "DEFAULT", "bias": "BIAS", "relu": "RELU", "bias_relu": "RELU_BIAS", "gelu": "GELU",
              "bias_gelu": "GELU_BIAS", "gelu_aux": "GELU_AUX", "bias_gelu_aux": "GELU_AUX_BIAS", "dgelu": "DGELU",
              "dgelu_bgrad": "DGELU_BGRAD", "bgrad_a": "BGRADB", "bgrad_b": "BGRADA"}


def _lt():
    import nvmath.bindings.cublasLt as lt

    return lt


@dataclass(frozen=True)
class GemmCall:
    """All a cuBLASLt call is made from: ``d = alpha op(a) @ op(b) + beta c`` of ``shape`` and ``dtype``, then its
    ``epilogue``; ``a`` and ``b`` as they are stored (``Operand``: shape, dtype, element strides); ``c``, a bias and
    the epilogue's auxiliary operand, where it has them, in C order; float32 on TF32 tensor cores if ``tf32``."""

    a: Operand
    b: Operand
    shape: tuple
    dtype: np.dtype
    transpose_a: bool = False
    transpose_b: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    epilogue: str = "none"
    tf32: bool = False

    @classmethod
    def product(cls, a, b, transpose_a=False, transpose_b=False, **rest):
        """The call computing ``op(a) @ op(b)``, its batch axes broadcast, in ``a``'s dtype."""
        m = a.shape[-1] if transpose_a else a.shape[-2]
        n = b.shape[-2] if transpose_b else b.shape[-1]
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
        return cls(a, b, shape, a.dtype, transpose_a, transpose_b, **rest)

    @property
    def multiply_adds(self):
        return math.prod(self.shape) * (self.a.shape[-2] if self.transpose_a else self.a.shape[-1])

    @property
    def workspace_limit(self):
        """The scratch the call may ask for: more for a large product, where it buys faster algorithms."""
        return WORKSPACE_LIMIT[self.multiply_adds >= LARGE_PRODUCT]

    @property
    def timed(self):
        """Whether its candidates are timed when a program is built (``SETTLED_PRODUCT``)."""
        return self.multiply_adds < SETTLED_PRODUCT


def handle():
    """The process's cuBLASLt handle, made on first use."""
    global _handle
    if _handle is None:
        _handle = _lt().create()
    return _handle


def matrix(shape, strides, batch):
    """``(transposed, ld, batch stride)`` of an operand as cuBLASLt can read it, or None.

    Row-major (unit stride along the last axis) reads as it is; column-major (a transposed view)
    reads as the transpose of a row-major matrix. The batch axes must collapse to one stride,
    or be broadcast (stride 0).
    """
    rows, cols = shape[-2:]
    row_stride, col_stride = strides[-2:]
    if col_stride == 1 and (row_stride >= max(cols, 1) or rows == 1):
        transposed, ld = False, max(row_stride, cols, 1)
    elif row_stride == 1 and (col_stride >= max(rows, 1) or cols == 1):
        transposed, ld = True, max(col_stride, rows, 1)
    else:
        return None
    batch_dims = [(d, s) for d, s in zip(shape[:-2], strides[:-2]) if d != 1]
    if not batch_dims or all(s == 0 for _, s in batch_dims):
        return transposed, ld, 0
    if len(batch_dims) != len(batch) - list(batch).count(1) or any(s == 0 for _, s in batch_dims):
        return None
    for (_, outer), (size, inner) in zip(batch_dims, batch_dims[1:]):
        if outer != inner * size:
            return None
    return transposed, ld, batch_dims[-1][1]


def heuristic(desc, layouts, workspace_limit, count=CANDIDATES):
    """cuBLASLt's first ``count`` algorithms for the matmul ``desc`` over ``layouts`` (first operand, second, c,
    d), none needing more than ``workspace_limit`` bytes of scratch; a ``BackendError`` where it has none."""
    lt = _lt()
    preference = lt.matmul_preference_create()
    limit = np.array([workspace_limit], np.uint64)
    lt.matmul_preference_set_attribute(preference, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                       limit.ctypes.data, limit.nbytes)
    results = np.zeros(count, lt.matmul_heuristic_result_dtype)
    found = np.zeros(1, np.int32)
    first, second, c_layout, d_layout = layouts
    lt.matmul_algo_get_heuristic(handle(), desc, first, second, c_layout, d_layout, preference, count,
                                 results.ctypes.data, found.ctypes.data)
    lt.matmul_preference_destroy(preference)
    if found[0] == 0:
        raise BackendError("cuBLASLt found no algorithm for this gemm")
    return results[:found[0]].copy()


def algorithm_name(results, k):
    """What names heuristic result ``k``'s algorithm in every process: its configuration (cuBLASLt's algorithm,
    tile, stages, split-K and the rest) and the scratch it needs. Not its bytes: two processes' results for one
    algorithm differed in bytes that no configuration reads."""
    lt = _lt()
    algorithm = results[k:k + 1]["algo"].copy()
    values = []
    for name in _CONFIGURATION:
        attribute = getattr(lt.MatmulAlgoConfigAttribute, name)
        value = np.zeros(1, lt.get_matmul_algo_config_attribute_dtype(attribute))
        written = np.zeros(1, np.uint64)
        lt.matmul_algo_config_get_attribute(algorithm.ctypes.data, attribute, value.ctypes.data, value.nbytes,
                                            written.ctypes.data)
        values.append(int(value[0]))
    return " ".join(map(str, values + [int(results[k]["workspace_size"])]))


def set_attribute(desc, attribute, value):
    """Set matmul descriptor ``desc``'s ``attribute`` (a MatmulDescAttribute) to ``value``."""
    lt = _lt()
    buffer = np.array([value], lt.get_matmul_desc_attribute_dtype(attribute))
    lt.matmul_desc_set_attribute(desc, attribute, buffer.ctypes.data, buffer.nbytes)


def matrix_layout(data, rows, cols, ld, count=1, stride=0):
    """A column-major ``rows x cols`` matrix layout (cuBLASLt's own words), batched if ``count > 1``."""
    lt = _lt()
    layout = lt.matrix_layout_create(data, rows, cols, ld)
    if count > 1:
        for attribute, value in ((lt.MatrixLayoutAttribute.BATCH_COUNT, count),
                                 (lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, stride)):
            buffer = np.array([value], lt.get_matrix_layout_attribute_dtype(attribute))
            lt.matrix_layout_set_attribute(layout, attribute, buffer.ctypes.data, buffer.nbytes)
    return layout


class Gemm:
    """The cuBLASLt call ``GemmCall`` describes, over fixed pointers."""

    timed = True  # whether ``tune`` times its candidates (a float8 GEMM's always are)

    def __init__(self, call):
        lt = _lt()
        from nvmath.bindings.cublas import ComputeType

        alpha, beta, epilogue, dtype = call.alpha, call.beta, call.epilogue, np.dtype(call.dtype)
        if dtype.name not in _DATA_TYPES:
            raise BackendError(f"cuBLASLt takes {', '.join(_DATA_TYPES)}, not {dtype}")
        batch = call.shape[:-2]
        count = int(np.prod(batch, dtype=np.int64))
        m, n = call.shape[-2:]
        found = {}
        for name, operand, transpose in (("a", call.a, call.transpose_a), ("b", call.b, call.transpose_b)):
            layout = matrix(operand.shape, operand.strides, batch)
            if layout is None:
                raise BackendError(f"gemm operand {name} of shape {operand.shape} has strides {operand.strides} that "
                                   f"cuBLASLt cannot read; it should have been copied")
            stored_transposed, ld, batch_stride = layout
            rows, cols = operand.shape[-2:]
            if stored_transposed:
                rows, cols = cols, rows
            found[name] = (transpose != stored_transposed, rows, cols, ld, batch_stride)
        scale = np.float64 if dtype == np.float64 else np.float32
        compute = {np.dtype(np.float64): ComputeType.COMPUTE_64F}.get(
            dtype, ComputeType.COMPUTE_32F_FAST_TF32 if (call.tf32 and dtype == np.float32) else ComputeType.COMPUTE_32F)
        self.scalars = np.array([alpha, beta], scale)
        self.desc = lt.matmul_desc_create(compute, 1 if scale is np.float64 else 0)
        # column-major: the first operand is b (rows = b's columns), the second a
        trans_first, b_rows, b_cols, b_ld, b_stride = found["b"]
        trans_second, a_rows, a_cols, a_ld, a_stride = found["a"]
        self._set(lt.MatmulDescAttribute.TRANSA, int(trans_first))
        self._set(lt.MatmulDescAttribute.TRANSB, int(trans_second))
        self._set(lt.MatmulDescAttribute.EPILOGUE, int(getattr(lt.Epilogue, _EPILOGUES[epilogue])))
        self.bias = "bias" in epilogue  # read through the bias pointer
        # the gelu's argument read (dgelu) or written (the second result of gelu_aux) through the auxiliary pointer
        self.aux = epilogue.startswith("dgelu") or epilogue in GELU_ARGUMENT_RESULTS
        self.bias_gradient = epilogue in BIAS_GRADIENT_RESULTS  # written through the bias pointer
        self.pointed = {}  # epilogue pointer attribute -> the pointer set in the descriptor
        if self.aux:  # row-major like the product: its leading dimension is the product's
            self._set(lt.MatmulDescAttribute.EPILOGUE_AUX_LD, n)
        data = _DATA_TYPES[dtype.name]
        shapes = [(b_cols, b_rows, b_ld, count, b_stride), (a_cols, a_rows, a_ld, count, a_stride),
                  (n, m, n, count, m * n), (n, m, n, count, m * n)]
        self.layouts = [matrix_layout(data, *shape) for shape in shapes]
        self.key = (int(compute), data, trans_first, trans_second, tuple(shapes), epilogue, alpha, beta)
        self.dtype = dtype
        if self.key not in _heuristics:
            _heuristics[self.key] = self._candidates(call.workspace_limit)
        self.candidates = _heuristics[self.key]
        self.workspace_bytes = int(self.candidates["workspace_size"].max())  # what any candidate needs: often 0
        self.choice = 0
        self.timed = call.timed

    def _set(self, attribute, value):
        set_attribute(self.desc, attribute, value)

    def _candidates(self, workspace_limit):
        """cuBLASLt's heuristic results for this call, best guess first, none needing more than ``workspace_limit``
        bytes of scratch."""
        if self.bias or self.bias_gradient:  # the heuristic looks at the epilogue's pointers too
            self._point("BIAS_POINTER", 0)
        if self.aux:
            self._point("EPILOGUE_AUX_POINTER", 0)
        return heuristic(self.desc, self.layouts, workspace_limit)

    def tune(self, pointers, stream):
        """Choose the fastest candidate, timed on ``pointers`` (``call``'s), whose contents it overwrites, or take the
        one ``choices`` remembers for this call. The heuristic's first choice stays unless another is faster by
        ``MARGIN``: closer than that, clocks that drift under load rank candidates by chance."""
        offered = [algorithm_name(self.candidates, k) for k in range(len(self.candidates))]
        remembered = choices.recall("cublaslt", self.key)
        if remembered in offered:
            self.choice = offered.index(remembered)
            return
        if not self.timed:  # a product as large as ``SETTLED_PRODUCT``: the heuristic's first choice
            return
        times = [self._time(k, pointers, stream) for k in range(len(self.candidates))]
        if np.isinf(min(times)):
            raise BackendError("cuBLASLt refused every algorithm its heuristic offered for this gemm")
        best = int(np.argmin(times))
        self.choice = best if times[best] < times[0] * (1 - MARGIN) else 0
        choices.remember("cublaslt", self.key, offered[self.choice])

    def _time(self, k, pointers, stream):
        """Milliseconds a call with candidate ``k`` takes (``timing``); infinite if cuBLASLt refuses it."""
        self.choice = k
        try:
            return time_graph(lambda: self.call(*pointers, stream.ptr), stream)
        except _lt().cuBLASLtError:  # a candidate the heuristic offers may still refuse these operands
            return np.inf

    def _point(self, name, pointer):
        """Set the descriptor's epilogue pointer ``name`` (a MatmulDescAttribute) unless it is set so already."""
        if self.pointed.get(name) != pointer:
            self._set(getattr(_lt().MatmulDescAttribute, name), int(pointer))
            self.pointed[name] = pointer

    def call(self, a, b, c, d, workspace, bias, aux, stream):
        """Run on device pointers (``c`` is ``d`` where there is no c; ``bias``, ``aux``: None where the epilogue
        reads none) on ``stream`` (a pointer). A call captured in a CUDA graph keeps the pointers it was given."""
        if bias is not None:
            self._point("BIAS_POINTER", bias)
        if aux is not None:
            self._point("EPILOGUE_AUX_POINTER", aux)
        self._matmul(a, b, c, d, workspace, stream)

    def _matmul(self, a, b, c, d, workspace, stream):
        """cuBLASLt's matmul with the chosen algorithm and the descriptor as its pointers are set now."""
        first, second, c_layout, d_layout = self.layouts
        base = self.scalars.ctypes.data
        algorithm = self.candidates.ctypes.data + self.choice * self.candidates.itemsize
        _lt().matmul(handle(), self.desc, base, b, first, a, second, base + self.scalars.itemsize, c, c_layout,
                     d, d_layout, algorithm, workspace, self.workspace_bytes, stream)
