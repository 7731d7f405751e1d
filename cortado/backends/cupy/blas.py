"""``gemm`` terms as cuBLASLt calls, through nvmath-python's bindings, into planned buffers.

cuBLASLt is column-major; a row-major ``D = op(a) @ op(b)`` is the column-major
``D^T = op(b)^T @ op(a)^T``, so ``b`` goes first and the transposes stay as they are. Everything a
call needs is made once, when the program is built: the descriptors, the algorithm (cuBLASLt's
first heuristic choice for the workspace the plan gives), alpha and beta in host memory. A call
then only passes pointers, so it allocates nothing and can be captured in a CUDA graph (CuPy's
own cuBLAS wrapper refuses to run during capture).
"""

import numpy as np

from ...errors import BackendError
from ...exprgraph.ops import gemm_operands

WORKSPACE_BYTES = 4 << 20  # what cuBLASLt may use for split-K and the like; the planner places it

_DATA_TYPES = {"float16": 2, "float32": 0, "float64": 1}  # cudaDataType
_handle = None


def _lt():
    import nvmath.bindings.cublasLt as lt

    return lt


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


class Gemm:
    """One cuBLASLt call for one gemm term, over fixed pointers."""

    def __init__(self, term, layouts, tf32):
        lt = _lt()
        from nvmath.bindings.cublas import ComputeType

        transpose_a, transpose_b, alpha, beta, epilogue = term.attrs
        a, b, c, bias = gemm_operands(term.args, beta, epilogue)
        dtype = term.dtype
        if dtype.name not in _DATA_TYPES:
            raise BackendError(f"{term!r}: cuBLASLt takes float16, float32 and float64, not {dtype}")
        batch = term.shape[:-2]
        count = int(np.prod(batch, dtype=np.int64))
        m, n = term.shape[-2:]
        found = {}
        for name, operand, transpose in (("a", a, transpose_a), ("b", b, transpose_b)):
            layout = matrix(operand.shape, layouts[operand], batch)
            if layout is None:
                raise BackendError(f"{term!r}: operand {name} has a layout cuBLASLt cannot read; it should have been copied")
            stored_transposed, ld, batch_stride = layout
            rows, cols = operand.shape[-2:]
            if stored_transposed:
                rows, cols = cols, rows
            found[name] = (transpose != stored_transposed, rows, cols, ld, batch_stride)
        scale = np.float64 if dtype == np.float64 else np.float32
        compute = {np.dtype(np.float64): ComputeType.COMPUTE_64F}.get(
            dtype, ComputeType.COMPUTE_32F_FAST_TF32 if (tf32 and dtype == np.float32) else ComputeType.COMPUTE_32F)
        self.scalars = np.array([alpha, beta], scale)
        self.desc = lt.matmul_desc_create(compute, 1 if scale is np.float64 else 0)
        # column-major: the first operand is b (rows = b's columns), the second a
        trans_first, b_rows, b_cols, b_ld, b_stride = found["b"]
        trans_second, a_rows, a_cols, a_ld, a_stride = found["a"]
        self._set(lt.MatmulDescAttribute.TRANSA, int(trans_first))
        self._set(lt.MatmulDescAttribute.TRANSB, int(trans_second))
        kind = {"none": lt.Epilogue.DEFAULT, "bias": lt.Epilogue.BIAS, "relu": lt.Epilogue.RELU,
                "bias_relu": lt.Epilogue.RELU_BIAS}[epilogue]
        self._set(lt.MatmulDescAttribute.EPILOGUE, int(kind))
        self.bias = bias
        data = _DATA_TYPES[dtype.name]
        self.layouts = [
            self._layout(data, b_cols, b_rows, b_ld, count, b_stride),
            self._layout(data, a_cols, a_rows, a_ld, count, a_stride),
            self._layout(data, n, m, n, count, m * n),
            self._layout(data, n, m, n, count, m * n),
        ]
        self.operands = (a, b, c)
        self.algo = self._algorithm()

    def _set(self, attribute, value):
        lt = _lt()
        buffer = np.array([value], lt.get_matmul_desc_attribute_dtype(attribute))
        lt.matmul_desc_set_attribute(self.desc, attribute, buffer.ctypes.data, buffer.nbytes)

    @staticmethod
    def _layout(data, rows, cols, ld, count, stride):
        """A column-major ``rows x cols`` matrix layout (cuBLASLt's own words), batched if ``count > 1``."""
        lt = _lt()
        layout = lt.matrix_layout_create(data, rows, cols, ld)
        if count > 1:
            for attribute, value in ((lt.MatrixLayoutAttribute.BATCH_COUNT, count),
                                     (lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, stride)):
                buffer = np.array([value], lt.get_matrix_layout_attribute_dtype(attribute))
                lt.matrix_layout_set_attribute(layout, attribute, buffer.ctypes.data, buffer.nbytes)
        return layout

    def _algorithm(self):
        lt = _lt()
        preference = lt.matmul_preference_create()
        limit = np.array([WORKSPACE_BYTES], np.uint64)
        lt.matmul_preference_set_attribute(preference, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                           limit.ctypes.data, limit.nbytes)
        results = np.zeros(1, lt.matmul_heuristic_result_dtype)
        count = np.zeros(1, np.int32)
        if self.bias is not None:  # the heuristic looks at the epilogue's pointers too
            self.set_bias(0)
        first, second, c_layout, d_layout = self.layouts
        lt.matmul_algo_get_heuristic(handle(), self.desc, first, second, c_layout, d_layout, preference, 1,
                                     results.ctypes.data, count.ctypes.data)
        lt.matmul_preference_destroy(preference)
        if count[0] == 0:
            raise BackendError("cuBLASLt found no algorithm for this gemm")
        return results

    def set_bias(self, pointer):
        self._set(_lt().MatmulDescAttribute.BIAS_POINTER, int(pointer))

    def call(self, a, b, c, d, workspace, stream):
        """Run on device pointers (``c`` is ``d`` where there is no c) on ``stream`` (a pointer)."""
        first, second, c_layout, d_layout = self.layouts
        base = self.scalars.ctypes.data
        _lt().matmul(handle(), self.desc, base, b, first, a, second, base + self.scalars.itemsize, c, c_layout,
                     d, d_layout, self.algo.ctypes.data, workspace, WORKSPACE_BYTES, stream)
