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
import math

import numpy as np

from . import csource, native

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enumerations
PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}
C_TYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
NAMES = ("scipy_cblas_{p}{routine}64_", "cblas_{p}{routine}64_", "scipy_cblas_{p}{routine}", "cblas_{p}{routine}")


def _loaded_libraries():
    """The paths of the shared libraries loaded in this process whose names say BLAS (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "blas" in line.lower() and ".so" in line}
    except OSError:
        return []
    return sorted(paths)


@functools.cache
def entry(dtype, routine):
    """``(address, integer C type is 64 bits)`` of BLAS's ``?{routine}`` for ``dtype`` in the library NumPy calls, or
    None."""
    dtype = np.dtype(dtype)
    if dtype not in PREFIX:
        return None
    for path in _loaded_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for pattern in NAMES:
            name = pattern.format(p=PREFIX[dtype], routine=routine)
            if hasattr(library, name):
                return ctypes.cast(getattr(library, name), ctypes.c_void_p).value, name.endswith("64_")
    return None


@functools.cache
def gemm(dtype):
    """``entry(dtype, "gemm")``, checked against ``np.matmul``; None where there is none or it differs."""
    found = entry(dtype, "gemm")
    return found if found is not None and _agrees(found, np.dtype(dtype)) else None


def _agrees(found, dtype):
    """Whether calls of ``found`` give ``np.matmul``'s bits on products of every operand layout."""
    rng = np.random.default_rng(0)
    left = rng.standard_normal((37, 29)).astype(dtype)
    right = rng.standard_normal((29, 23)).astype(dtype)
    for a, b in ((left, right), (np.ascontiguousarray(left.T).T, right), (left, np.ascontiguousarray(right.T).T)):
        expected, out = a @ b, np.empty((a.shape[0], b.shape[1]), dtype)
        _gemm_call(found, dtype, a, b, out)
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


def call(a, b, out, function, pointers):
    """The C statements of ``np.matmul(a, b, out=out)`` as NumPy's ``?gemm``, the gemm at the C pointer ``function``,
    the three matrices' first elements at the C pointers ``pointers`` (each matrix of another place with ``a``'s,
    ``b``'s and ``out``'s shapes and strides): one call, or one a block of the sum (``blocks``) where that gives
    NumPy's bits on one thread (``one_thread``) and one call does not; None where NumPy would call something else (a
    row, a column or one term: a vector product), no BLAS is at hand, or no blocking gives NumPy's bits. A matrix
    times its own transpose (``syrk``) is the caller's to rule out: it depends on the places."""
    if not _gemm_shaped(a, b, out):
        return None
    found = blocks(a.dtype, a.shape[0], a.shape[1], b.shape[1], _layout(a)[0], _layout(b)[0], 1)
    return None if found is None else _statement(a, b, out, function, pointers, found)


def _gemm_shaped(a, b, out):
    """Whether NumPy computes ``a @ b`` into ``out`` as one ``?gemm`` and one is at hand."""
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or not (a.dtype == b.dtype == out.dtype):
        return False
    (m, n), p = a.shape, b.shape[1]
    if min(m, n, p) < 2 or _layout(out) != (NO_TRANS, out.strides[0] // out.itemsize):
        return False
    return gemm(a.dtype) is not None and None not in (_layout(a), _layout(b))


def _statement(a, b, out, function, pointers, sums):
    """The C of ``a @ b`` into ``out`` (``call``'s arguments) as one ``?gemm`` a block of the sum, ``sums`` the blocks'
    lengths: the first writes the result, each other adds its block's products to it."""
    found, (trans_a, lda), (trans_b, ldb) = gemm(a.dtype), _layout(a), _layout(b)
    integer, scalar = ("long long" if found[1] else "int"), C_TYPE[a.dtype]
    ldc = out.strides[0] // out.itemsize
    signature = (f"void (*)(int, int, int, {integer}, {integer}, {integer}, {scalar}, const {scalar}*, {integer}, "
                 f"const {scalar}*, {integer}, {scalar}, {scalar}*, {integer})")
    pa, pb, pc = pointers
    text, start = "", 0
    for length in sums:
        at_a = start if trans_a == NO_TRANS else start * lda  # the block's first term: a column of a, a row of b
        at_b = start * ldb if trans_b == NO_TRANS else start
        text += (f"(({signature})({function}))({ROW_MAJOR}, {trans_a}, {trans_b}, {a.shape[0]}, {b.shape[1]}, {length}, "
                 f"1, (const {scalar}*)({pa}) + {at_a}L, {lda}, (const {scalar}*)({pb}) + {at_b}L, {ldb}, "
                 f"{0 if start == 0 else 1}, ({scalar}*)({pc}), {ldc});\n")
        start += length
    return text


# a product is computed in parts of at least this many multiply-adds, one a thread (``native``'s ``ct_in_parts``),
# with OpenBLAS's own threads held to one while a step runs (``one_thread``): OpenBLAS's idle threads spin for
# 2^28 cycles after each threaded call (without yielding: ``nop`` loops), which took a core from the step's other
# work. The GPT example's step took 5.6 ms on 16 cores with parts of 2^19, 7.1 with parts of 2^21; the same on two.
PART_SMALLEST = 1 << 19


def _parts(a, b, out, count):
    """``count`` parts of ``a @ b`` into ``out``, ``[(a, b, out), ...]``, cut along the longer of the result's rows
    and columns, each with the element offset of its first element of ``a``, ``b``, ``out``."""
    m, p = out.shape
    cuts = [(m if m >= p else p) * k // count for k in range(count + 1)]
    if m >= p:
        parts = [(a[start:stop], b, out[start:stop]) for start, stop in zip(cuts, cuts[1:])]
    else:
        parts = [(a, b[:, start:stop], out[:, start:stop]) for start, stop in zip(cuts, cuts[1:])]
    first = [x.ctypes.data for x in (a, b, out)]
    return [(part, [(x.ctypes.data - f) // x.itemsize for x, f in zip(part, first)]) for part in parts]


@functools.lru_cache(maxsize=4)
def _operands(dtype, m, n, p, trans_a, trans_b):
    """Random operands of an ``m x n`` times ``n x p`` product, stored as ``trans_a`` and ``trans_b`` say, and
    ``np.matmul``'s product of them (on OpenBLAS's threads): what ``blocks`` checks against, drawn once a shape."""
    rng = np.random.default_rng(0)
    a = rng.random((m, n) if trans_a == NO_TRANS else (n, m), dtype) - dtype.type(0.5)
    b = rng.random((n, p) if trans_b == NO_TRANS else (p, n), dtype) - dtype.type(0.5)
    a, b = (a if trans_a == NO_TRANS else a.T), (b if trans_b == NO_TRANS else b.T)
    return a, b, a @ b


def _blockings(n):
    """Ways OpenBLAS may cut a sum of ``n`` terms into blocks, each ``?gemm`` call's (it cuts its own on one thread
    and on its threads alike, by sizes its build and the CPU fix): all ``n``; or blocks of ``q`` while ``2q`` or more
    terms are left, then, of more than ``q``, half of them rounded up to a multiple of ``u``, then the rest. NumPy's
    product of 128 x 784 x 256 on two OpenBLAS threads sums blocks of 392 and 392; on one, of 400 and 384."""
    found = {(n,): None}
    common = [q for q in (384, 512, 256, 320, 448, 640, 768, 1024, 192, 128) if q < n]  # OpenBLAS's usual sizes first
    for q in common + [q for q in range(64, n, 32) if q not in common]:
        for u in (1, 2, 4, 8, 16, 32, 64):
            sums, left = [], n
            while left:
                length = q if left >= 2 * q else -(-(left // 2) // u) * u if left > q else left
                sums.append(min(length, left))
                left -= sums[-1]
            found.setdefault(tuple(sums))
    return list(found)


SEARCH_LIMIT = 1 << 32  # the multiply-adds ``blocks`` spends on one shape's search: about 0.1 s on one core


@functools.cache
def blocks(dtype, m, n, p, trans_a, trans_b, count):
    """The blocks of the sum (``_blockings``) in which ``count`` parts (``_parts``) of an ``m x n`` times ``n x p``
    product (operands stored as ``trans_a``, ``trans_b`` say), each one ``?gemm`` call a block on one thread, give
    ``np.matmul``'s bits on random values (on OpenBLAS's threads, which at some shapes sum in other blocks than one
    thread does); None where none does, or none within ``SEARCH_LIMIT``'s work."""
    a, b, expected = _operands(dtype, m, n, p, trans_a, trans_b)
    out = np.empty((m, p), dtype)
    for tried, sums in enumerate(_blockings(n)):
        if tried * m * n * p > SEARCH_LIMIT:
            return None
        with one_thread():
            for (x, y, z), _ in _parts(a, b, out, count):
                _gemm_call(gemm(dtype), dtype, x, y, z, sums)
        if np.array_equal(out.view(np.uint8), expected.view(np.uint8)):
            return sums
    return None


def _gemm_call(found, dtype, a, b, out, sums=None):
    """``a @ b`` into ``out`` through ``?gemm`` (``found``) from Python, with NumPy's arguments: one call, or one a
    block of the sum (``sums``: the blocks' lengths)."""
    integer = ctypes.c_int64 if found[1] else ctypes.c_int32
    scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    pointer = ctypes.c_void_p
    call_ = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer, integer, scalar, pointer,
                             integer, pointer, integer, scalar, pointer, integer)(found[0])
    (trans_a, lda), (trans_b, ldb) = _layout(a), _layout(b)
    start = 0
    for length in sums or (a.shape[1],):
        block_a, block_b = a[:, start:start + length], b[start:start + length]
        call_(ROW_MAJOR, trans_a, trans_b, a.shape[0], b.shape[1], length, 1.0, block_a.ctypes.data, lda,
              block_b.ctypes.data, ldb, 0.0 if start == 0 else 1.0, out.ctypes.data, out.strides[0] // out.itemsize)
        start += length


def product(a, b, out):
    """``(name, C source, pointers)`` of ``np.matmul(a, b, out=out)`` as NumPy's ``?gemm`` (``call``), as parts on
    the pool's threads where it is large and they give its bits; None where NumPy would call something else (a matrix
    times its transpose: syrk), no BLAS is at hand, or no blocking of the sum gives NumPy's bits."""
    if a.ctypes.data == b.ctypes.data or not _gemm_shaped(a, b, out):
        return None
    pointers, c = [gemm(a.dtype)[0], a.ctypes.data, b.ctypes.data, out.ctypes.data], C_TYPE[a.dtype]
    count, sums = _parting(a, b, out)
    if count > 1:
        statements = _part_statements(a, b, out, count, [f"({c}*)p[{k + 1}]" for k in range(3)], sums)
        name, source = csource.in_parts("gemm_parts", f"{{\n{csource.switch('part', statements)}}}\n", count)
        return name, source, pointers
    statement = call(a, b, out, "p[0]", ("p[1]", "p[2]", "p[3]"))
    if statement is None:
        return None
    text = f"{{\n  {statement}}}\n"
    name = "gemm_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}", pointers


def stacked_product(a, b, out):
    """``(name, C source, pointers)`` of ``np.matmul(a, b, out=out)`` over stacks of matrices (``a`` and ``b``
    broadcast against ``out``'s lead axes) as NumPy computes it, one ``?gemm`` a matrix (``call``), made from C, on
    the pool's threads: the matrices in parts, and each matrix cut into parts too (``_parts``) where there are fewer
    matrices than threads (a convolution's weight gradient: a matrix an input channel); None where NumPy would call
    something else for them (a vector product; syrk, for a matrix times its own transpose), no BLAS is at hand, or
    no blocking of the sum gives NumPy's bits."""
    lead = out.shape[:-2]
    a, b = np.broadcast_to(a, lead + a.shape[-2:]), np.broadcast_to(b, lead + b.shape[-2:])
    first = (0,) * len(lead)
    if not lead or out.size == 0 or not _gemm_shaped(a[first], b[first], out[first]):  # empty: NumPy's, no parts
        return None
    if any(a[i].ctypes.data == b[i].ctypes.data for i in np.ndindex(*lead)):
        return None
    (m, n), p, matrices = a.shape[-2:], b.shape[-1], math.prod(lead)
    count = native.parts(matrices * m * n * p, PART_SMALLEST)
    cuts = max(1, min(count // matrices, max(m, p) // 2))  # each matrix's parts
    layouts = (a.dtype, m, n, p, _layout(a[first])[0], _layout(b[first])[0])
    sums = blocks(*layouts, cuts) if cuts > 1 else None
    if sums is None:
        cuts, sums = 1, blocks(*layouts, 1)
        if sums is None:
            return None
    count, c = min(count, matrices * cuts), C_TYPE[a.dtype]
    index = (f"  for (long q = part * {matrices * cuts}L / {count}; q < (part + 1) * {matrices * cuts}L / {count}; ++q) "
             f"{{\n    const long i = q / {cuts}L;\n")
    offsets = {"a": [], "b": [], "c": []}
    for d in reversed(range(len(lead))):
        index += f"    const long i{d} = i / {math.prod(lead[d + 1:])}L % {lead[d]}L;\n"
        for name, x in (("a", a), ("b", b), ("c", out)):
            if x.strides[d]:
                offsets[name].append(f"i{d} * {x.strides[d] // x.itemsize}L")
    places = [f"({c}*)p[{k + 1}] + {' + '.join(offsets[name]) or '0'}" for k, name in enumerate("abc")]
    index += "".join(f"    {c}* {name} = {place};\n" for name, place in zip(("ma", "mb", "mc"), places))
    statements = _part_statements(a[first], b[first], out[first], cuts, ["ma", "mb", "mc"], sums)
    body = f"{{\n{index}{csource.switch(f'q % {cuts}L', statements)}  }}\n}}\n"
    name, source = csource.in_parts("gemm_stack", body, count)
    return name, source, [gemm(a.dtype)[0], a.ctypes.data, b.ctypes.data, out.ctypes.data]


def _part_statements(a, b, out, count, bases, sums):
    """The C of each of ``count`` parts (``_parts``) of ``a @ b`` into ``out``, its matrices' first elements at the C
    pointers ``bases`` plus each part's offsets, summed in blocks ``sums`` (``_statement``)."""
    return [_statement(*part, "p[0]", [f"{base} + {offset}L" for base, offset in zip(bases, offsets)], sums)
            for part, offsets in _parts(a, b, out, count)]


def _parting(a, b, out):
    """``(count, blocks)``: into how many parts (``native.parts``, no more than the result's longer side, each of at
    least two rows and columns) the product is cut, and in which blocks each sums (``blocks``); ``(1, None)`` where it
    is small, OpenBLAS's threads cannot be held, or no blocking of the parts gives its bits."""
    (m, n), p = a.shape, b.shape[1]
    count = min(native.parts(m * n * p, PART_SMALLEST), max(m, p) // 2)
    if count < 2 or threads() is None:
        return 1, None
    found = blocks(a.dtype, m, n, p, _layout(a)[0], _layout(b)[0], count)
    return (1, None) if found is None else (count, found)


@functools.cache
def threads():
    """``(set, get)``: OpenBLAS's calls setting and reading its number of threads, from the library NumPy calls;
    None where there are none."""
    for path in _loaded_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for suffix, prefix in (("64_", "scipy_"), ("", "scipy_"), ("64_", ""), ("", "")):
            setter, getter = f"{prefix}openblas_set_num_threads{suffix}", f"{prefix}openblas_get_num_threads{suffix}"
            if hasattr(library, setter) and hasattr(library, getter):
                set_, get = getattr(library, setter), getattr(library, getter)
                set_.argtypes, set_.restype, get.argtypes, get.restype = [ctypes.c_int], None, [], ctypes.c_int
                return set_, get
    return None


class one_thread:
    """OpenBLAS's own threads held to one while in ``with`` (where it has any), as they were after."""

    def __enter__(self):
        found = threads()
        self.before = found[1]() if found is not None else 1
        if self.before > 1:
            found[0](1)

    def __exit__(self, *raised):
        if self.before > 1:
            threads()[0](self.before)
