"""The CPU's own products of matrices (``backends.numpy.gemm``, where the CPU has AVX2 and FMA): each element the sum of
its terms in blocks fixed by their number alone, each block one chain of fused multiply-adds, held bit for bit to a
scalar loop of ``fma`` at every shape, operand layout, stack, number of threads and width of vectors; and a step's
products run so."""

import ctypes

import numpy as np
import pytest

import cortado as ct
from cortado.backends.numpy import gemm, native

pytestmark = pytest.mark.skipif(not gemm.available(), reason="the CPU's own products need x86-64 with AVX2 and FMA")

MODEL = r"""#include <math.h>
#define MODEL(T, S, FMA) \
void model_##S(long m, long n, long k, const T* a, long ars, long acs, const T* b, long brs, long bcs, T* c, long ldc) { \
  const long blocks = (k + 255) / 256, length = blocks ? (k + blocks - 1) / blocks : 0; \
  for (long i = 0; i < m; ++i) \
    for (long j = 0; j < n; ++j) { \
      T total = 0; \
      for (long start = 0; start < k; start += length) { \
        T sum = 0; \
        for (long p = start; p < k && p < start + length; ++p) sum = FMA(a[i * ars + p * acs], b[p * brs + j * bcs], sum); \
        total = start ? total + sum : sum; \
      } \
      c[i * ldc + j] = total; \
    } \
}
MODEL(float, f32, fmaf)
MODEL(double, f64, fma)
"""


def _model(a, b):
    """``a @ b`` (2-D) as the scalar loop computes it."""
    out = np.empty((a.shape[0], b.shape[1]), a.dtype)
    function = getattr(native.load(MODEL), f"model_{gemm.SUFFIX[a.dtype]}")
    steps = [s // a.itemsize for s in (*a.strides, *b.strides)]
    function(*(ctypes.c_long(v) for v in (a.shape[0], b.shape[1], a.shape[1])), ctypes.c_void_p(a.ctypes.data),
             *(ctypes.c_long(v) for v in steps[:2]), ctypes.c_void_p(b.ctypes.data),
             *(ctypes.c_long(v) for v in steps[2:]), ctypes.c_void_p(out.ctypes.data), ctypes.c_long(b.shape[1]))
    return out


def _own(*products):
    """Each ``(a, b, out)`` of ``products``: ``a @ b`` into ``out`` by ``gemm.product``'s C, all built in one library
    and called on their own; the last ``out``."""
    made = [gemm.product(*product) for product in products]
    sources = {name: source for name, source, _ in made}  # products of the same shapes and strides: one function
    library = native.load(native.header() + "".join(sources.values()))
    for name, _, pointers in made:
        function = getattr(library, name)
        function.argtypes = [ctypes.c_void_p]
        addresses = [x.ctypes.data if isinstance(x, np.ndarray) else x for x in pointers]
        function((ctypes.c_void_p * len(pointers))(*addresses))
    return products[-1][2]


def _operand(rng, shape, transposed, dtype):
    x = rng.standard_normal(shape[::-1] if transposed else shape).astype(dtype)
    return x.T if transposed else x


@pytest.fixture(params=[1, 3])
def threads(request, monkeypatch):
    monkeypatch.setattr(native, "threads", lambda: request.param)
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 3, 7), (13, 300, 33), (40, 513, 70), (97, 64, 1), (200, 1100, 45),
                                   (1500, 16, 700), (30, 300, 300), (20, 300, 1100)])
def test_a_product_is_the_scalar_chains_bits_at_every_shape_and_layout(m, k, n, dtype, threads):
    """Edges of the tiles (8 rows by 32 or 16 columns) and of the blocks of 256 terms, sums of one to five blocks,
    either operand transposed, operands read where they lie and packed (B's block past 128 KiB, or its columns apart),
    B packed in more than one stretch of columns, results in parts of rows or of columns on three threads."""
    rng = np.random.default_rng(m * k + n)
    products = []
    for a_transposed, b_transposed in ((False, False), (True, False), (False, True), (True, True)):
        a, b = _operand(rng, (m, k), a_transposed, dtype), _operand(rng, (k, n), b_transposed, dtype)
        products.append((a, b, np.full((m, n), np.nan, dtype)))
    _own(*products)
    for a, b, out in products:
        expected = _model(a, b)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_allclose(expected, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


def test_a_result_stored_by_columns_and_strided_operands_keep_the_bits(threads):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((90, 2 * 130)).astype(np.float32)[:, ::2]  # columns two elements apart
    b = rng.standard_normal((130, 50)).astype(np.float32)
    out = np.empty((50, 90), np.float32).T  # columns adjacent
    np.testing.assert_array_equal(_own((a, b, out)), _model(a, b))


def test_stacks_broadcast_their_matrices_and_keep_each_ones_bits(threads):
    """A convolution's product: one weight matrix a group, against each image's columns."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((2, 8, 27)).astype(np.float32)
    columns = rng.standard_normal((5, 2, 27, 300)).astype(np.float32)
    out = np.empty((5, 2, 8, 300), np.float32)
    _own((w, columns, out))
    for i in range(5):
        for g in range(2):
            np.testing.assert_array_equal(out[i, g], _model(w[g], columns[i, g]))


def test_no_terms_give_zeros_and_non_finite_terms_stay_in_their_rows_and_columns():
    a, b = np.empty((4, 0), np.float32), np.empty((0, 6), np.float32)
    np.testing.assert_array_equal(_own((a, b, np.full((4, 6), np.nan, np.float32))), np.zeros((4, 6), np.float32))
    a, b = np.ones((14, 20), np.float32), np.ones((20, 33), np.float32)
    a[3, 5], b[7, 32] = np.inf, np.nan
    out = _own((a, b, np.empty((14, 33), np.float32)))
    np.testing.assert_array_equal(out, _model(a, b))
    assert np.isinf(out[3, :32]).all() and np.isnan(out[:, 32]).all() and (np.delete(out[:, :32], 3, 0) == 20).all()


def test_a_steps_products_are_the_cpus_own_with_the_scalar_chains_bits():
    """Forward and backward products of a layer: the weights' gradient sums over the batch, the input's over the
    outputs."""
    x, w = ct.var("x", (64, 300)), ct.var("w", (300, 40))
    h = x @ w
    outputs = [h, *ct.grad(ct.sum(h * h), [x, w])]
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((64, 300)).astype(np.float32),
             "w": rng.standard_normal((300, 40)).astype(np.float32)}
    program = ct.compile(outputs, inputs=[x, w])
    assert sum(name.startswith("gemm_own") for name in program._executor.native.names) == 3
    ours, dx, dw = program(**feeds)
    np.testing.assert_array_equal(ours, _model(feeds["x"], feeds["w"]))
    dh = (2 * ours).astype(np.float32)
    np.testing.assert_array_equal(dx, _model(dh, feeds["w"].T))
    np.testing.assert_array_equal(dw, _model(feeds["x"].T, dh))


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_cpus_products_give_the_same_bits(isa, dtype):
    """AVX2's tiles (6 rows, vectors of 8 floats) and AVX-512's (8 rows, 16 floats): the same chains of fused
    multiply-adds, so the same bits, packed or read in place, one vector wide or two."""
    if isa == "avx512" and gemm.isa() != "avx512":
        pytest.skip("this CPU has no AVX-512")
    function = getattr(native.load(gemm.source(isa)), f"ct_gemm_{gemm.SUFFIX[np.dtype(dtype)]}")
    rng = np.random.default_rng(4)
    for m, k, n in [(13, 300, 33), (7, 40, 5), (30, 300, 300), (3, 600, 70)]:
        for transposed in (False, True):
            a, b = _operand(rng, (m, k), False, dtype), _operand(rng, (k, n), transposed, dtype)
            out = np.full((m, n), np.nan, dtype)
            steps = [x // a.itemsize for x in (*a.strides, *b.strides)]
            function(*(ctypes.c_long(v) for v in (m, n, k)), ctypes.c_void_p(a.ctypes.data),
                     *(ctypes.c_long(v) for v in steps[:2]), ctypes.c_void_p(b.ctypes.data),
                     *(ctypes.c_long(v) for v in steps[2:]), ctypes.c_void_p(out.ctypes.data), ctypes.c_long(n))
            np.testing.assert_array_equal(out, _model(a, b))


def test_cortado_gemm_chooses_and_is_checked(monkeypatch):
    monkeypatch.setenv("CORTADO_GEMM", "blas")
    gemm.available.cache_clear()
    try:
        assert not gemm.available()
        monkeypatch.setenv("CORTADO_GEMM", "mine")
        gemm.available.cache_clear()
        with pytest.raises(ValueError, match="CORTADO_GEMM='mine'"):
            gemm.available()
    finally:
        monkeypatch.delenv("CORTADO_GEMM")
        gemm.available.cache_clear()
