"""Products of matrices by cortado's own C, where the CPU has AVX-512: NumPy's OpenBLAS may run a CPU it does not
know on narrower kernels (on an AMD EPYC of family 26 OpenBLAS 0.3.31 takes its Haswell kernels: 250 GFLOP/s on two
cores, where AVX-512 multiplies at 520), and there a product on its threads sums otherwise than any of its calls on
one thread, which kept every product of a step NumPy's own call and the step's other work on one thread.

Each element of a product here is the sum of its terms in blocks fixed by their number alone (as few blocks of at
most 256 terms as hold them, of equal lengths but the last), each block one chain of fused multiply-adds in order
from 0, ``s = fma(a[i, p], b[p, j], s)``, the blocks' sums added in order. How the product is cut (tiles of 8 rows
by 32 or 16 columns in registers, operands packed or read where they lie, parts of rows or columns on the pool's
threads) changes none of it, so the bits are the same on one thread and on many and for every operand layout
(``tests/test_gemm.py`` holds them to a scalar loop of ``fma``); the blocks keep the rounding error of a long sum
near a blocked BLAS's. They differ from NumPy's BLAS in rounding only: a product is the written one up to its
rounding, as every compiled form is. ``CORTADO_GEMM=blas`` keeps NumPy's BLAS (its bits, through ``blas``) on such
a CPU too.
"""

import ctypes
import functools
import hashlib
import os
import platform

import numpy as np

from . import csource, native

C_TYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# a product is cut into parts of at least this many multiply-adds, one a thread
PART_SMALLEST = 1 << 19

# Tiles of 8 rows by 32 columns (16 where the result has no more: a convolution's weight gradient, a column a tap)
# in 16 or 8 registers; the sum in blocks of at most CT_KC terms; an operand packed (A 96 rows at a time, B 1024
# columns: 1 MiB of floats on the stack of the thread computing) where its tiles read it again and again, read where
# it lies where they read it once (one tile of rows or of columns) or B's block is at most CT_DIRECT_BYTES. On one
# core of the AMD EPYC above: 250 to 270 GFLOP/s at the MLP's and GPT's shapes, 100 to 270 at the CNN's convolutions,
# against OpenBLAS's 125; blocks of 192 to 512 terms and tiles of 12 rows changed the large ones by under 5%.
SOURCE = r"""#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#define CT_MR 8
#define CT_KC 256
#define CT_MC 96
#define CT_NC_F32 1024
#define CT_NC_F64 512
#define CT_DIRECT_BYTES (128 << 10)

/* c[:rows, :cols] (rows ldc apart) = packed a (kc x 8) times packed b (kc x NR), NR a whole number of vectors of VL
   lanes: each element's terms one chain of fused multiply-adds from 0, added to c's value unless first */
#define CT_TILE(T, S, NR, VL, VEC, MASK, SUFFIX) \
__attribute__((target("avx512f"))) \
static void ct_tile_##S##_##NR(long kc, const T* pa, const T* pb, T* c, long ldc, int first, int rows, int cols) { \
  MASK mask[NR / VL]; \
  for (int v = 0; v < NR / VL; ++v) { \
    const int left = cols - v * VL; \
    mask[v] = left >= VL ? (MASK)-1 : left <= 0 ? 0 : (MASK)((1u << left) - 1); \
  } \
  VEC acc[CT_MR][NR / VL]; \
  _Pragma("GCC unroll 8") for (int r = 0; r < CT_MR; ++r) \
    for (int v = 0; v < NR / VL; ++v) acc[r][v] = _mm512_setzero_##SUFFIX(); \
  for (long p = 0; p < kc; ++p) { \
    VEC b[NR / VL]; \
    for (int v = 0; v < NR / VL; ++v) b[v] = _mm512_loadu_##SUFFIX(pb + v * VL); \
    _Pragma("GCC unroll 8") for (int r = 0; r < CT_MR; ++r) { \
      const VEC a = _mm512_set1_##SUFFIX(pa[r]); \
      for (int v = 0; v < NR / VL; ++v) acc[r][v] = _mm512_fmadd_##SUFFIX(a, b[v], acc[r][v]); \
    } \
    pa += CT_MR; pb += NR; \
  } \
  _Pragma("GCC unroll 8") for (int r = 0; r < CT_MR; ++r) \
    if (r < rows) \
      for (int v = 0; v < NR / VL; ++v) { \
        T* at = c + r * ldc + v * VL; \
        if (!first) acc[r][v] = _mm512_add_##SUFFIX(_mm512_maskz_loadu_##SUFFIX(mask[v], at), acc[r][v]); \
        _mm512_mask_storeu_##SUFFIX(at, mask[v], acc[r][v]); \
      } \
}

/* the same, a read where it lies (its rows ars apart, its terms acs; rows past the last read as the first and left
   out), b's terms brs apart with their columns adjacent (masked past the last) */
#define CT_TILE_DIRECT(T, S, NR, VL, VEC, MASK, SUFFIX) \
__attribute__((target("avx512f"))) \
static void ct_direct_tile_##S##_##NR(long kc, const T* a, long ars, long acs, const T* b, long brs, T* c, long ldc, \
                                      int first, int rows, int cols) { \
  MASK mask[NR / VL]; \
  for (int v = 0; v < NR / VL; ++v) { \
    const int left = cols - v * VL; \
    mask[v] = left >= VL ? (MASK)-1 : left <= 0 ? 0 : (MASK)((1u << left) - 1); \
  } \
  const T* row[CT_MR]; \
  for (int r = 0; r < CT_MR; ++r) row[r] = a + (r < rows ? r : 0) * ars; \
  VEC acc[CT_MR][NR / VL]; \
  _Pragma("GCC unroll 8") for (int r = 0; r < CT_MR; ++r) \
    for (int v = 0; v < NR / VL; ++v) acc[r][v] = _mm512_setzero_##SUFFIX(); \
  for (long p = 0; p < kc; ++p) { \
    VEC bv[NR / VL]; \
    for (int v = 0; v < NR / VL; ++v) bv[v] = _mm512_maskz_loadu_##SUFFIX(mask[v], b + p * brs + v * VL); \
    _Pragma("GCC unroll 8") for (int r = 0; r < CT_MR; ++r) { \
      const VEC av = _mm512_set1_##SUFFIX(row[r][p * acs]); \
      for (int v = 0; v < NR / VL; ++v) acc[r][v] = _mm512_fmadd_##SUFFIX(av, bv[v], acc[r][v]); \
    } \
  } \
  _Pragma("GCC unroll 8") for (int r = 0; r < CT_MR; ++r) \
    if (r < rows) \
      for (int v = 0; v < NR / VL; ++v) { \
        T* at = c + r * ldc + v * VL; \
        if (!first) acc[r][v] = _mm512_add_##SUFFIX(_mm512_maskz_loadu_##SUFFIX(mask[v], at), acc[r][v]); \
        _mm512_mask_storeu_##SUFFIX(at, mask[v], acc[r][v]); \
      } \
}

/* c (m x n, rows ldc apart, columns adjacent) = a (m x k) times b (k x n), any element strides: a's rows packed in
   slivers of 8, b's columns in slivers of NR, each sliver's terms in order, zeros past the edges; the terms in
   blocks of at most CT_KC, the same for every NR */
#define CT_GEMM(T, S, NR, NC) \
static void ct_pack_b_##S##_##NR(const T* b, long rs, long cs, long kc, long nc, T* out) { \
  for (long j0 = 0; j0 < nc; j0 += NR) \
    for (long p = 0; p < kc; ++p) \
      for (long q = 0; q < NR; ++q) *out++ = j0 + q < nc ? b[p * rs + (j0 + q) * cs] : (T)0; \
} \
static void ct_gemm_##S##_##NR(long m, long n, long k, const T* a, long ars, long acs, const T* b, long brs, \
                               long bcs, T* c, long ldc) { \
  const long blocks = (k + CT_KC - 1) / CT_KC, kmax = (k + blocks - 1) / blocks; \
  if (bcs == 1 && (n <= NR || m <= CT_MR || kmax * n * (long)sizeof(T) <= CT_DIRECT_BYTES)) { \
    for (long pc = 0; pc < k; pc += kmax) { \
      const long kc = k - pc < kmax ? k - pc : kmax; \
      for (long jr = 0; jr < n; jr += NR) \
        for (long ir = 0; ir < m; ir += CT_MR) \
          ct_direct_tile_##S##_##NR(kc, a + ir * ars + pc * acs, ars, acs, b + pc * brs + jr, brs, c + ir * ldc + jr, \
                                    ldc, pc == 0, m - ir < CT_MR ? (int)(m - ir) : CT_MR, \
                                    n - jr < NR ? (int)(n - jr) : NR); \
    } \
    return; \
  } \
  const long mmax = m < CT_MC ? (m + CT_MR - 1) / CT_MR * CT_MR : CT_MC, nmax = n < NC ? (n + NR - 1) / NR * NR : NC; \
  T packed_a[mmax * kmax + 64 / sizeof(T)], packed_b[nmax * kmax + 64 / sizeof(T)]; \
  T* pa = (T*)(((uintptr_t)packed_a + 63) & ~(uintptr_t)63); \
  T* pb = (T*)(((uintptr_t)packed_b + 63) & ~(uintptr_t)63); \
  for (long jc = 0; jc < n; jc += NC) { \
    const long nc = n - jc < NC ? n - jc : NC; \
    for (long pc = 0; pc < k; pc += kmax) { \
      const long kc = k - pc < kmax ? k - pc : kmax; \
      ct_pack_b_##S##_##NR(b + pc * brs + jc * bcs, brs, bcs, kc, nc, pb); \
      for (long ic = 0; ic < m; ic += CT_MC) { \
        const long mc = m - ic < CT_MC ? m - ic : CT_MC; \
        ct_pack_a_##S(a + ic * ars + pc * acs, ars, acs, mc, kc, pa); \
        for (long jr = 0; jr < nc; jr += NR) \
          for (long ir = 0; ir < mc; ir += CT_MR) \
            ct_tile_##S##_##NR(kc, pa + ir * kc, pb + jr * kc, c + (ic + ir) * ldc + jc + jr, ldc, pc == 0, \
                               mc - ir < CT_MR ? (int)(mc - ir) : CT_MR, nc - jr < NR ? (int)(nc - jr) : NR); \
      } \
    } \
  } \
}

/* the product for type T: tiles one vector of VL lanes wide for results of at most VL columns (a convolution's weight
   gradient: as many columns as a filter has taps), two (NR2 = 2 VL) otherwise */
#define CT_TYPE(T, S, VL, NR2, VEC, MASK, SUFFIX, NC) \
static void ct_pack_a_##S(const T* a, long rs, long cs, long mc, long kc, T* out) { \
  for (long i0 = 0; i0 < mc; i0 += CT_MR) \
    for (long p = 0; p < kc; ++p) \
      for (long r = 0; r < CT_MR; ++r) *out++ = i0 + r < mc ? a[(i0 + r) * rs + p * cs] : (T)0; \
} \
CT_TILE(T, S, VL, VL, VEC, MASK, SUFFIX) \
CT_TILE(T, S, NR2, VL, VEC, MASK, SUFFIX) \
CT_TILE_DIRECT(T, S, VL, VL, VEC, MASK, SUFFIX) \
CT_TILE_DIRECT(T, S, NR2, VL, VEC, MASK, SUFFIX) \
CT_GEMM(T, S, VL, NC) \
CT_GEMM(T, S, NR2, NC) \
void ct_gemm_##S(long m, long n, long k, const T* a, long ars, long acs, const T* b, long brs, long bcs, T* c, \
                 long ldc) { \
  if (m <= 0 || n <= 0) return; \
  if (k <= 0) { for (long i = 0; i < m; ++i) memset(c + i * ldc, 0, n * sizeof(T)); return; } \
  if (n <= VL) ct_gemm_##S##_##VL(m, n, k, a, ars, acs, b, brs, bcs, c, ldc); \
  else ct_gemm_##S##_##NR2(m, n, k, a, ars, acs, b, brs, bcs, c, ldc); \
}
CT_TYPE(float, f32, 16, 32, __m512, __mmask16, ps, CT_NC_F32)
CT_TYPE(double, f64, 8, 16, __m512d, __mmask8, pd, CT_NC_F64)
"""


@functools.cache
def available():
    """Whether products are this module's: an x86-64 CPU with AVX-512F, a compiler that builds ``SOURCE``, and no
    ``CORTADO_GEMM=blas``."""
    choice = os.environ.get("CORTADO_GEMM", "own")
    if choice not in ("own", "blas"):
        raise ValueError(f"CORTADO_GEMM={choice!r}: give 'own' (cortado's products where the CPU has AVX-512) or "
                         "'blas' (NumPy's BLAS)")
    if choice == "blas" or platform.machine().lower() not in ("x86_64", "amd64") or not _has_avx512f():
        return False
    return native.toolchain() is not None and _library() is not None


@functools.cache
def _library():
    """``SOURCE``'s library, built once (then found in the disk cache) apart from every program's, whose products call
    it through the address of ``ct_gemm_*``; None where it does not build."""
    try:
        return native.load(SOURCE)
    except (OSError, RuntimeError):
        return None


def address(dtype):
    """The address of the product function for ``dtype``: ``void ct_gemm_*(m, n, k, a, a's row step, its term step,
    b, b's term step, its column step, c, c's row step)``, steps in elements."""
    return ctypes.cast(getattr(_library(), f"ct_gemm_{SUFFIX[np.dtype(dtype)]}"), ctypes.c_void_p).value


def _has_avx512f():
    try:
        with open("/proc/cpuinfo") as file:
            return any(line.startswith("flags") and " avx512f " in f"{line.strip()} " for line in file)
    except OSError:
        return False


def _strides(x):
    """``x``'s element strides, or None where they are not whole elements."""
    if any(step % x.itemsize for step in x.strides):
        return None
    return tuple(step // x.itemsize for step in x.strides)


def _matrices(a, b, out):
    """``(a, b, out)`` with ``out``'s columns adjacent (a result stored by columns is the transposed product:
    ``out.T = b.T @ a.T``), or None where neither are or a stride is not whole elements."""
    if out.ndim >= 2 and out.shape[-1] > 1 and out.strides[-1] != out.itemsize and out.strides[-2] == out.itemsize:
        swap = lambda x: np.swapaxes(x, -1, -2)  # noqa: E731
        a, b, out = swap(b), swap(a), swap(out)
    if out.shape[-1] > 1 and out.strides[-1] != out.itemsize:
        return None
    return None if None in (_strides(a), _strides(b), _strides(out)) else (a, b, out)


def usable(a, b, out):
    """Whether ``a @ b`` into ``out`` (2-D or stacks of matrices) is this module's to compute."""
    return (available() and a.dtype == b.dtype == out.dtype and a.dtype in C_TYPE and a.ndim >= 2 and b.ndim >= 2
            and _matrices(a, b, out) is not None)


def product(a, b, out):
    """``(name, C source, pointers)`` of ``np.matmul(a, b, out=out)`` (``a``, ``b`` broadcast against ``out``'s lead
    axes, if any) as ``ct_gemm`` calls on the pool's threads: the matrices in parts, each matrix cut into parts of its
    rows or of its columns (the longer) where there are fewer matrices than threads, each part of at least
    ``PART_SMALLEST`` multiply-adds. The caller checks ``usable`` first."""
    a, b, out = _matrices(a, b, out)
    lead = out.shape[:-2]
    a, b = np.broadcast_to(a, lead + a.shape[-2:]), np.broadcast_to(b, lead + b.shape[-2:])
    (m, k), n, matrices = a.shape[-2:], b.shape[-1], int(np.prod(lead, dtype=np.int64))
    count = native.parts(matrices * m * k * n, PART_SMALLEST)
    cuts = max(1, min(count // matrices, max(m, n) // 2))  # each matrix's parts
    count = min(count, matrices * cuts)
    c, pointers = C_TYPE[a.dtype], [address(a.dtype), a, b, out]
    (ars, acs), (brs, bcs), ldc = _strides(a)[-2:], _strides(b)[-2:], _strides(out)[-2]
    along_rows = m >= n
    length = m if along_rows else n
    body = (f"  for (long q = part * {matrices * cuts}L / {count}; q < (part + 1) * {matrices * cuts}L / {count}; ++q) "
            f"{{\n    const long i = q / {cuts}L, cut = q % {cuts}L;\n"
            f"    const long start = cut * {length}L / {cuts}, stop = (cut + 1) * {length}L / {cuts};\n")
    offsets = {"a": [], "b": [], "c": []}
    for d in reversed(range(len(lead))):
        body += f"    const long i{d} = i / {int(np.prod(lead[d + 1:], dtype=np.int64))}L % {lead[d]}L;\n"
        for name, x in (("a", a), ("b", b), ("c", out)):
            step = _strides(x)[d]
            if step:
                offsets[name].append(f"i{d} * {step}L")
    place = {name: " + ".join(found) or "0" for name, found in offsets.items()}
    if along_rows:
        call = (f"gemm(stop - start, {n}L, {k}L, a + {place['a']} + start * {ars}L, {ars}L, {acs}L, "
                f"b + {place['b']}, {brs}L, {bcs}L, c + {place['c']} + start * {ldc}L, {ldc}L);")
    else:
        call = (f"gemm({m}L, stop - start, {k}L, a + {place['a']}, {ars}L, {acs}L, "
                f"b + {place['b']} + start * {bcs}L, {brs}L, {bcs}L, c + {place['c']} + start, {ldc}L);")
    body += f"    {call}\n  }}\n"
    before = (f"  void (*gemm)(long, long, long, const {c}*, long, long, const {c}*, long, long, {c}*, long) = p[0];\n"
              f"  const {c}* a = (const {c}*)p[1]; const {c}* b = (const {c}*)p[2]; {c}* c = ({c}*)p[3];\n")
    text = "{\n" + before + body + "}\n"
    if count == 1:
        name = "gemm_own_" + hashlib.sha256(text.encode()).hexdigest()[:16]
        return name, f"void {name}(void* const* p) {{\n  const long part = 0;\n{text}}}\n", pointers
    name, source = csource.in_parts("gemm_own", text, count)
    return name, source, pointers

