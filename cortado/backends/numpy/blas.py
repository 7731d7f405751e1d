"""2-D products called from C through the BLAS NumPy itself calls, with the arguments NumPy gives it, so a product
is NumPy's bits at the cost of a C call instead of a Python one (``np.matmul`` on a 60 x 32 product took 1.2 to
3 us of the spirals step's 53).

NumPy's matmul computes a product of matrices of more than one row, column and term, each stored with its rows or
its columns contiguous, as one ``cblas_?gemm`` in row-major order: an operand whose rows are contiguous goes as it
is, one whose columns are as transposed, its leading dimension the other stride (a matrix times its own transpose
is ``?syrk`` instead, left to NumPy here). The library is the one loaded in this process that holds the entry
points NumPy's builds use (``scipy_cblas_sgemm64_`` in NumPy's wheels, ``cblas_sgemm`` in others); an entry point
ending in ``64_`` takes 64-bit integers. It is checked against ``np.matmul`` bit for bit on products of both
layouts before it is used; where it is not found or differs, products stay NumPy's.
"""

import ctypes
import functools
import hashlib

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enumerations
PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}
C_TYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
NAMES = ("scipy_cblas_{p}gemm64_", "cblas_{p}gemm64_", "scipy_cblas_{p}gemm", "cblas_{p}gemm")


def _loaded_libraries():
    """The paths of the shared libraries loaded in this process whose names say BLAS (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "blas" in line.lower() and ".so" in line}
    except OSError:
        return []
    return sorted(paths)


@functools.cache
def gemm(dtype):
    """``(address, integer C type)`` of the ``?gemm`` NumPy calls for ``dtype``, checked against ``np.matmul``;
    None where there is none."""
    dtype = np.dtype(dtype)
    if dtype not in PREFIX:
        return None
    for path in _loaded_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for pattern in NAMES:
            name = pattern.format(p=PREFIX[dtype])
            if hasattr(library, name):
                found = ctypes.cast(getattr(library, name), ctypes.c_void_p).value, name.endswith("64_")
                return found if _agrees(found, dtype) else None
    return None


def _agrees(found, dtype):
    """Whether calls of ``found`` give ``np.matmul``'s bits on products of every operand layout."""
    integer = ctypes.c_int64 if found[1] else ctypes.c_int32
    scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    pointer = ctypes.c_void_p
    call = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer, integer, scalar, pointer,
                            integer, pointer, integer, scalar, pointer, integer)(found[0])
    rng = np.random.default_rng(0)
    left = rng.standard_normal((37, 29)).astype(dtype)
    right = rng.standard_normal((29, 23)).astype(dtype)
    for a, b in ((left, right), (np.ascontiguousarray(left.T).T, right), (left, np.ascontiguousarray(right.T).T)):
        expected, out = a @ b, np.empty((a.shape[0], b.shape[1]), dtype)
        (trans_a, lda), (trans_b, ldb) = _layout(a), _layout(b)
        call(ROW_MAJOR, trans_a, trans_b, a.shape[0], b.shape[1], a.shape[1], 1.0, a.ctypes.data, lda, b.ctypes.data,
             ldb, 0.0, out.ctypes.data, out.shape[1])
        if not np.array_equal(out.view(np.uint8), expected.view(np.uint8)):
            return False
    return True


def _blasable(step, other, length, itemsize):
    """NumPy's test of a matrix BLAS can read: the inner step one element, the outer a whole number of elements
    no fewer than the inner length."""
    return other == itemsize and step % itemsize == 0 and step // itemsize >= length


def _layout(a):
    """``(transpose flag, leading dimension)`` NumPy passes for operand ``a``, or None where it passes none."""
    (rows, cols), (row_step, col_step), size = a.shape, a.strides, a.itemsize
    if _blasable(row_step, col_step, cols, size):
        return NO_TRANS, row_step // size
    if _blasable(col_step, row_step, rows, size):
        return TRANS, col_step // size
    return None


def product(a, b, out):
    """``(name, C source, pointers)`` of ``np.matmul(a, b, out=out)`` as NumPy's one ``?gemm``, or None where NumPy
    would call something else (a row, a column or one term: a vector product; a matrix times its transpose: syrk)
    or no BLAS is at hand."""
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or not (a.dtype == b.dtype == out.dtype):
        return None
    (m, n), p = a.shape, b.shape[1]
    if min(m, n, p) < 2 or _layout(out) != (NO_TRANS, out.strides[0] // out.itemsize):
        return None
    found, layouts = gemm(a.dtype), (_layout(a), _layout(b))
    if found is None or None in layouts or a.ctypes.data == b.ctypes.data:
        return None
    (trans_a, lda), (trans_b, ldb) = layouts
    integer, scalar = ("long long" if found[1] else "int"), C_TYPE[a.dtype]
    ldc = out.strides[0] // out.itemsize
    signature = (f"void (*)(int, int, int, {integer}, {integer}, {integer}, {scalar}, const {scalar}*, {integer}, "
                 f"const {scalar}*, {integer}, {scalar}, {scalar}*, {integer})")
    text = (f"{{\n  (({signature})p[0])({ROW_MAJOR}, {trans_a}, {trans_b}, {m}, {p}, {n}, 1, (const {scalar}*)p[1], "
            f"{lda}, (const {scalar}*)p[2], {ldb}, 0, ({scalar}*)p[3], {ldc});\n}}\n")
    name = "gemm_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}", [found[0], a.ctypes.data, b.ctypes.data, out.ctypes.data]
