"""Products of matrices by cortado's own C, on x86-64 CPUs with AVX2 and FMA (AVX-512 where there is): the same bits
on every such CPU and on any number of threads. NumPy's OpenBLAS sums a product on its threads otherwise than on
one, and otherwise from one CPU to the next; and it may run a CPU it does not know on narrower kernels (an AMD EPYC
of family 26 on its Haswell kernels with OpenBLAS 0.3.31: 250 GFLOP/s on two cores, where AVX-512 multiplies at 520).

Each element of a product here is the sum of its terms in blocks fixed by their number alone (as few blocks of at
most 256 terms as hold them, of equal lengths but the last), each block one chain of fused multiply-adds in order
from 0, ``s = fma(a[i, p], b[p, j], s)``, the blocks' sums added in order. How the product is cut (tiles of rows and
columns in registers, vectors of 8 or 16 floats, operands packed or read where they lie, parts of rows or columns on
the pool's threads) changes none of it, so the bits are the same on one thread and on many, for every operand layout
and with either CPU's vectors (``tests/test_gemm.py`` holds them to a scalar loop of ``fma``); the blocks keep the
rounding error of a long sum near a blocked BLAS's. They differ from NumPy's BLAS in rounding only: a product is the
written one up to its rounding, as every compiled form is. ``CORTADO_GEMM=blas`` keeps NumPy's BLAS (its bits,
through ``blas``). On one core of the EPYC above, against the BLAS call NumPy makes (``bench_gemm_cpu.py``): with
AVX-512 1.8x to 3.0x OpenBLAS's speed; with AVX2 alone 0.80x to 1.15x, as fast as its Haswell kernels within a few
per cent at the larger shapes.
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

# Each CPU's vectors: the target GCC is told for the tiles, the rows of a tile (its accumulators, two vectors a row,
# and three more registers fit the registers: 16 of AVX-512's 32, 12 of AVX2's 16), and the lanes of a vector and the
# operations on them for each type, as C macros.
ISAS = {
    "avx512": {"target": "avx512f", "rows": 8, "lanes": {"f32": 16, "f64": 8}, "ops": r"""
#define CT_VEC_f32 __m512
#define CT_MASK_f32 __mmask16
#define CT_MASK_OF_f32(left) ((left) >= 16 ? (__mmask16)0xffff : (left) <= 0 ? (__mmask16)0 : (__mmask16)((1u << (left)) - 1))
#define CT_ZERO_f32() _mm512_setzero_ps()
#define CT_LOAD_f32(p) _mm512_loadu_ps(p)
#define CT_LOAD_MASKED_f32(m, p) _mm512_maskz_loadu_ps(m, p)
#define CT_STORE_MASKED_f32(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define CT_SET1_f32(x) _mm512_set1_ps(x)
#define CT_FMA_f32(a, b, c) _mm512_fmadd_ps(a, b, c)
#define CT_ADD_f32(a, b) _mm512_add_ps(a, b)
#define CT_VEC_f64 __m512d
#define CT_MASK_f64 __mmask8
#define CT_MASK_OF_f64(left) ((left) >= 8 ? (__mmask8)0xff : (left) <= 0 ? (__mmask8)0 : (__mmask8)((1u << (left)) - 1))
#define CT_ZERO_f64() _mm512_setzero_pd()
#define CT_LOAD_f64(p) _mm512_loadu_pd(p)
#define CT_LOAD_MASKED_f64(m, p) _mm512_maskz_loadu_pd(m, p)
#define CT_STORE_MASKED_f64(p, m, v) _mm512_mask_storeu_pd(p, m, v)
#define CT_SET1_f64(x) _mm512_set1_pd(x)
#define CT_FMA_f64(a, b, c) _mm512_fmadd_pd(a, b, c)
#define CT_ADD_f64(a, b) _mm512_add_pd(a, b)
"""},
    "avx2": {"target": "avx2,fma", "rows": 6, "lanes": {"f32": 8, "f64": 4}, "ops": r"""
#define CT_VEC_f32 __m256
#define CT_MASK_f32 __m256i
#define CT_MASK_OF_f32(left) _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define CT_ZERO_f32() _mm256_setzero_ps()
#define CT_LOAD_f32(p) _mm256_loadu_ps(p)
#define CT_LOAD_MASKED_f32(m, p) _mm256_maskload_ps(p, m)
#define CT_STORE_MASKED_f32(p, m, v) _mm256_maskstore_ps(p, m, v)
#define CT_SET1_f32(x) _mm256_set1_ps(x)
#define CT_FMA_f32(a, b, c) _mm256_fmadd_ps(a, b, c)
#define CT_ADD_f32(a, b) _mm256_add_ps(a, b)
#define CT_VEC_f64 __m256d
#define CT_MASK_f64 __m256i
#define CT_MASK_OF_f64(left) _mm256_cmpgt_epi64(_mm256_set1_epi64x(left), _mm256_setr_epi64x(0, 1, 2, 3))
#define CT_ZERO_f64() _mm256_setzero_pd()
#define CT_LOAD_f64(p) _mm256_loadu_pd(p)
#define CT_LOAD_MASKED_f64(m, p) _mm256_maskload_pd(p, m)
#define CT_STORE_MASKED_f64(p, m, v) _mm256_maskstore_pd(p, m, v)
#define CT_SET1_f64(x) _mm256_set1_pd(x)
#define CT_FMA_f64(a, b, c) _mm256_fmadd_pd(a, b, c)
#define CT_ADD_f64(a, b) _mm256_add_pd(a, b)
"""},
}

# Tiles of ``rows`` rows by two vectors' columns (one where the result has no more: a convolution's weight gradient,
# a column a tap) in registers; the sum in blocks of at most CT_KC terms; an operand packed (A 96 rows at a time, B
# 1024 columns of floats, 512 of doubles: 1 MiB on the stack of the thread computing) where its tiles read it again
# and again, read where it lies where they read it once (one tile of rows or of columns) or B's block is at most
# CT_DIRECT_BYTES. On one core of the AMD EPYC above, AVX-512: 250 to 270 GFLOP/s at the MLP's and GPT's shapes, 100
# to 270 at the CNN's convolutions, against OpenBLAS's 125; blocks of 192 to 512 terms and tiles of 12 rows changed
# the large ones by under 5%.
TEMPLATE = r"""#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#define CT_MR @ROWS@
#define CT_KC 256
#define CT_MC 96
#define CT_NC_f32 1024
#define CT_NC_f64 512
#define CT_DIRECT_BYTES (128 << 10)
#define CT_UNROLL _Pragma("GCC unroll @ROWS@")
#define CT_TARGET __attribute__((target("@TARGET@")))
@OPS@
/* a tile's start: the masks of its columns (cols of NR, in vectors of VL lanes) and its accumulators at 0 */
#define CT_TILE_START(S, NR, VL) \
  CT_MASK_##S mask[NR / VL]; \
  for (int v = 0; v < NR / VL; ++v) mask[v] = CT_MASK_OF_##S(cols - v * VL); \
  CT_VEC_##S acc[CT_MR][NR / VL]; \
  CT_UNROLL for (int r = 0; r < CT_MR; ++r) \
    for (int v = 0; v < NR / VL; ++v) acc[r][v] = CT_ZERO_##S();

/* its end: c[:rows, :cols] (rows ldc apart) = the accumulators, added to c's values unless first */
#define CT_TILE_END(T, S, NR, VL) \
  CT_UNROLL for (int r = 0; r < CT_MR; ++r) \
    if (r < rows) \
      for (int v = 0; v < NR / VL; ++v) { \
        T* at = c + r * ldc + v * VL; \
        if (!first) acc[r][v] = CT_ADD_##S(CT_LOAD_MASKED_##S(mask[v], at), acc[r][v]); \
        CT_STORE_MASKED_##S(at, mask[v], acc[r][v]); \
      }

/* a tile of packed a (kc x CT_MR) times packed b (kc x NR): each element's terms one chain of fused multiply-adds */
#define CT_TILE(T, S, NR, VL) \
CT_TARGET static void ct_tile_##S##_##NR(long kc, const T* pa, const T* pb, T* c, long ldc, int first, int rows, \
                                         int cols) { \
  CT_TILE_START(S, NR, VL) \
  for (long p = 0; p < kc; ++p) { \
    CT_VEC_##S b[NR / VL]; \
    for (int v = 0; v < NR / VL; ++v) b[v] = CT_LOAD_##S(pb + v * VL); \
    CT_UNROLL for (int r = 0; r < CT_MR; ++r) { \
      const CT_VEC_##S a = CT_SET1_##S(pa[r]); \
      for (int v = 0; v < NR / VL; ++v) acc[r][v] = CT_FMA_##S(a, b[v], acc[r][v]); \
    } \
    pa += CT_MR; pb += NR; \
  } \
  CT_TILE_END(T, S, NR, VL) \
}

/* the same, a read where it lies (its rows ars apart, its terms acs; rows past the last read as the first and left
   out), b's terms brs apart with their columns adjacent (masked past the last) */
#define CT_TILE_DIRECT(T, S, NR, VL) \
CT_TARGET static void ct_direct_tile_##S##_##NR(long kc, const T* a, long ars, long acs, const T* b, long brs, T* c, \
                                                long ldc, int first, int rows, int cols) { \
  CT_TILE_START(S, NR, VL) \
  const T* row[CT_MR]; \
  for (int r = 0; r < CT_MR; ++r) row[r] = a + (r < rows ? r : 0) * ars; \
  for (long p = 0; p < kc; ++p) { \
    CT_VEC_##S bv[NR / VL]; \
    for (int v = 0; v < NR / VL; ++v) bv[v] = CT_LOAD_MASKED_##S(mask[v], b + p * brs + v * VL); \
    CT_UNROLL for (int r = 0; r < CT_MR; ++r) { \
      const CT_VEC_##S av = CT_SET1_##S(row[r][p * acs]); \
      for (int v = 0; v < NR / VL; ++v) acc[r][v] = CT_FMA_##S(av, bv[v], acc[r][v]); \
    } \
  } \
  CT_TILE_END(T, S, NR, VL) \
}

/* c (m x n, rows ldc apart, columns adjacent) = a (m x k) times b (k x n), any element strides: a's rows packed in
   slivers of CT_MR, b's columns in slivers of NR, each sliver's terms in order, zeros past the edges; the terms in
   blocks of at most CT_KC, the same for every NR and every CPU */
#define CT_GEMM(T, S, NR) \
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
  const long mmax = m < CT_MC ? (m + CT_MR - 1) / CT_MR * CT_MR : CT_MC; \
  const long nmax = n < CT_NC_##S ? (n + NR - 1) / NR * NR : CT_NC_##S; \
  T packed_a[mmax * kmax + 64 / sizeof(T)], packed_b[nmax * kmax + 64 / sizeof(T)]; \
  T* pa = (T*)(((uintptr_t)packed_a + 63) & ~(uintptr_t)63); \
  T* pb = (T*)(((uintptr_t)packed_b + 63) & ~(uintptr_t)63); \
  for (long jc = 0; jc < n; jc += CT_NC_##S) { \
    const long nc = n - jc < CT_NC_##S ? n - jc : CT_NC_##S; \
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

/* the product for type T: tiles one vector of VL lanes wide for results of at most VL columns, two (NR2 = 2 VL)
   otherwise */
#define CT_TYPE(T, S, VL, NR2) \
static void ct_pack_a_##S(const T* a, long rs, long cs, long mc, long kc, T* out) { \
  for (long i0 = 0; i0 < mc; i0 += CT_MR) \
    for (long p = 0; p < kc; ++p) \
      for (long r = 0; r < CT_MR; ++r) *out++ = i0 + r < mc ? a[(i0 + r) * rs + p * cs] : (T)0; \
} \
CT_TILE(T, S, VL, VL) \
CT_TILE(T, S, NR2, VL) \
CT_TILE_DIRECT(T, S, VL, VL) \
CT_TILE_DIRECT(T, S, NR2, VL) \
CT_GEMM(T, S, VL) \
CT_GEMM(T, S, NR2) \
void ct_gemm_##S(long m, long n, long k, const T* a, long ars, long acs, const T* b, long brs, long bcs, T* c, \
                 long ldc) { \
  if (m <= 0 || n <= 0) return; \
  if (k <= 0) { for (long i = 0; i < m; ++i) memset(c + i * ldc, 0, n * sizeof(T)); return; } \
  if (n <= VL) ct_gemm_##S##_##VL(m, n, k, a, ars, acs, b, brs, bcs, c, ldc); \
  else ct_gemm_##S##_##NR2(m, n, k, a, ars, acs, b, brs, bcs, c, ldc); \
}
CT_TYPE(float, f32, @F32@, @F32X2@)
CT_TYPE(double, f64, @F64@, @F64X2@)
"""


def source(isa):
    """The C of the products for ``isa`` (a key of ``ISAS``)."""
    found, text = ISAS[isa], TEMPLATE
    lanes = found["lanes"]
    for key, value in {"ROWS": found["rows"], "TARGET": found["target"], "OPS": found["ops"], "F32": lanes["f32"],
                       "F32X2": 2 * lanes["f32"], "F64": lanes["f64"], "F64X2": 2 * lanes["f64"]}.items():
        text = text.replace(f"@{key}@", str(value))
    return text


@functools.cache
def available():
    """Whether products are this module's: an x86-64 CPU with AVX2 and FMA (or AVX-512), a compiler that builds their
    C, and no ``CORTADO_GEMM=blas``."""
    choice = os.environ.get("CORTADO_GEMM", "own")
    if choice not in ("own", "blas"):
        raise ValueError(f"CORTADO_GEMM={choice!r}: give 'own' (cortado's products where the CPU has AVX2 and FMA) or "
                         "'blas' (NumPy's BLAS)")
    return choice == "own" and isa() is not None and native.toolchain() is not None and _library() is not None


@functools.cache
def isa():
    """The widest of ``ISAS`` this CPU runs (``/proc/cpuinfo``'s flags), or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo") as file:
            flags = next((set(line.split(":", 1)[1].split()) for line in file if line.startswith("flags")), set())
    except OSError:
        return None
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else None


@functools.cache
def _library():
    """The products' library for this CPU, built once (then found in the disk cache) apart from every program's, whose
    products call it through the address of ``ct_gemm_*``; None where it does not build."""
    try:
        return native.load(source(isa()))
    except (OSError, RuntimeError):
        return None


def address(dtype):
    """The address of the product function for ``dtype``: ``void ct_gemm_*(m, n, k, a, a's row step, its term step,
    b, b's term step, its column step, c, c's row step)``, steps in elements."""
    return ctypes.cast(getattr(_library(), f"ct_gemm_{SUFFIX[np.dtype(dtype)]}"), ctypes.c_void_p).value


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
            and out.size > 0 and _matrices(a, b, out) is not None)  # an empty result: NumPy's, nothing to part


def call(a, b, out, function, pointers):
    """The C statement of ``a @ b`` into ``out`` (2-D matrices, each of another place with these shapes and strides) as
    one call of the product function at the C pointer ``function``, the matrices' first elements at the C pointers
    ``pointers``; None where ``usable`` would say no."""
    if not usable(a, b, out):
        return None
    found = _matrices(a, b, out)
    if found[2] is not out:  # a result stored by columns: the transposed product, its operands swapped
        pointers = (pointers[1], pointers[0], pointers[2])
    (a, b, out), c = found, C_TYPE[a.dtype]
    (m, k), n = a.shape, b.shape[1]
    (ars, acs), (brs, bcs), ldc = _strides(a), _strides(b), _strides(out)[0]
    return (f"(({_function_type(c, '')})({function}))({m}L, {n}L, {k}L, (const {c}*)({pointers[0]}), {ars}L, {acs}L, "
            f"(const {c}*)({pointers[1]}), {brs}L, {bcs}L, ({c}*)({pointers[2]}), {ldc}L);\n")


def _function_type(c, name):
    """The C type of a pointer to the product function for C type ``c`` (``address``), declaring ``name``."""
    return f"void (*{name})(long, long, long, const {c}*, long, long, const {c}*, long, long, {c}*, long)"


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
        statement = (f"gemm(stop - start, {n}L, {k}L, a + {place['a']} + start * {ars}L, {ars}L, {acs}L, "
                f"b + {place['b']}, {brs}L, {bcs}L, c + {place['c']} + start * {ldc}L, {ldc}L);")
    else:
        statement = (f"gemm({m}L, stop - start, {k}L, a + {place['a']}, {ars}L, {acs}L, "
                f"b + {place['b']} + start * {bcs}L, {brs}L, {bcs}L, c + {place['c']} + start, {ldc}L);")
    body += f"    {statement}\n  }}\n"
    before = (f"  {_function_type(c, 'gemm')} = p[0];\n"
              f"  const {c}* a = (const {c}*)p[1]; const {c}* b = (const {c}*)p[2]; {c}* c = ({c}*)p[3];\n")
    text = "{\n" + before + body + "}\n"
    if count == 1:
        name = "gemm_own_" + hashlib.sha256(text.encode()).hexdigest()[:16]
        return name, f"void {name}(void* const* p) {{\n  const long part = 0;\n{text}}}\n", pointers
    name, source = csource.in_parts("gemm_own", text, count)
    return name, source, pointers

