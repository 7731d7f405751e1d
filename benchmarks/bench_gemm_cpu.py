"""The CPU's own products of matrices (backends/numpy/gemm.py) against NumPy's BLAS, one core each.

    python benchmarks/bench_gemm_cpu.py [--isa avx2] [--repeats 5] [--out benchmarks/results/gemm_cpu.json]

float32 products at the shapes the CPU benchmarks' steps make (the MLP's layers, the GPT example's, the CNN
example's convolutions an image at a time), each called from a C loop as a step calls it: ours through the address
of its C function, NumPy's BLAS through the ``cblas_sgemm`` NumPy's matmul calls, with OpenBLAS held to one thread.
Each time is the median of ``repeats`` loops of calls of about 4 ms each. ``--isa`` times the tiles of another of
the CPU's vector extensions than the widest (``avx2`` on a CPU with AVX-512). On a CPU without AVX2 and FMA there are
no own products to time, and the benchmark says so.
"""

import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cortado.backends.numpy import blas, gemm, native  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, measured_rows, write_results  # noqa: E402

SHAPES = {  # name: (m, k, n), a (m x k) times (k x n)
    "MLP mid forward": (128, 784, 256), "MLP mid weight gradient": (784, 128, 256),
    "MLP mid input gradient": (128, 256, 784), "MLP large forward": (256, 1024, 1024),
    "GPT projection": (1024, 64, 256), "GPT weight gradient": (64, 1024, 256), "GPT input gradient": (1024, 256, 64),
    "CNN conv 3x3, 8 -> 8 channels": (8, 72, 256), "CNN conv 3x3, 16 -> 16": (16, 144, 64),
    "CNN weight gradient": (8, 16384, 9), "square 1024": (1024, 1024, 1024),
}


LOOPS = r"""
typedef void (*own_t)(long, long, long, const float*, long, long, const float*, long, long, float*, long);
void own_loop(void* f, long times, long m, long n, long k, const float* a, const float* b, float* c) {
  for (long t = 0; t < times; ++t) ((own_t)f)(m, n, k, a, k, 1, b, n, 1, c, n);
}
typedef void (*blas_t)(int, int, int, INTEGER, INTEGER, INTEGER, float, const float*, INTEGER, const float*, INTEGER,
                       float, float*, INTEGER);
void blas_loop(void* f, long times, long m, long n, long k, const float* a, const float* b, float* c) {
  for (long t = 0; t < times; ++t) ((blas_t)f)(101, 111, 111, m, n, k, 1, a, k, b, n, 0, c, n);
}
"""


def _loops():
    """The C loops calling either product ``times`` times."""
    _, wide = blas.gemm(np.float32)
    library = native.load(f"#define INTEGER {'long long' if wide else 'int'}\n" + LOOPS)
    for name in ("own_loop", "blas_loop"):
        getattr(library, name).argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p] * 3
    return library


def _median_seconds(loop, function, arrays, m, k, n, repeats):
    """Seconds a call of ``function`` takes in C ``loop``: the median of ``repeats`` loops of about 4 ms each."""
    call = lambda times: loop(function, times, m, n, k, *(x.ctypes.data for x in arrays))  # noqa: E731
    start = time.perf_counter()
    call(3)
    times = max(3, int(0.004 / max((time.perf_counter() - start) / 3, 1e-9)))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(times)
        seconds.append((time.perf_counter() - start) / times)
    return statistics.median(seconds)


def measure(name, loops, own, repeats):
    m, k, n = SHAPES[name]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    ours, numpys = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    own = _median_seconds(loops.own_loop, own, (a, b, ours), m, k, n, repeats)
    with blas.one_thread():
        numpy = _median_seconds(loops.blas_loop, blas.gemm(np.float32)[0], (a, b, numpys), m, k, n, repeats)
    np.testing.assert_allclose(ours, a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(k))
    np.testing.assert_allclose(numpys, a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(k))
    flops = 2.0 * m * k * n
    return {"shape": name, "mkn": f"{m}x{k}x{n}", "cortado_us": own * 1e6, "numpy_us": numpy * 1e6,
            "cortado_gflops": flops / own / 1e9, "numpy_gflops": flops / numpy / 1e9, "speedup": numpy / own}


def openblas_core():
    """The kernels OpenBLAS chose for this CPU (``openblas_get_corename``), or None."""
    for path in blas._loaded_libraries():
        library = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename"):
            if hasattr(library, name):
                getattr(library, name).restype = ctypes.c_char_p
                return getattr(library, name)().decode()
    return None


def main():
    if "--isa" in sys.argv:  # reporting's command line takes --repeats and --out
        at = sys.argv.index("--isa")
        isa = sys.argv[at + 1]
        del sys.argv[at:at + 2]
    else:
        isa = gemm.isa()
    args = command_line(__doc__, "gemm_cpu.json", repeats=5)
    core = openblas_core()
    print(f"OpenBLAS's kernels here: {core}; ours: {isa}")
    if not gemm.available():
        print("this CPU has no AVX2 and FMA (or no C compiler): products are NumPy's BLAS, nothing of ours to time")
        write_results({"benchmark": "gemm_cpu", "machine": describe(), "openblas_core": core, "rows": []}, args.out)
        return
    loops = _loops()
    own = ctypes.cast(native.load(gemm.source(isa)).ct_gemm_f32, ctypes.c_void_p).value
    rows = measured_rows(list(SHAPES), lambda name: measure(name, loops, own, args.repeats), [
        ("shape", "shape", "30s"), ("m x k x n", "mkn", "16s"), ("cortado us", "cortado_us", "11.1f"),
        ("numpy us", "numpy_us", "9.1f"), ("cortado GFLOP/s", "cortado_gflops", "16.0f"),
        ("numpy GFLOP/s", "numpy_gflops", "14.0f"), ("speedup", "speedup", "8.2f")])
    write_results({"benchmark": "gemm_cpu", "machine": describe(), "openblas_core": core, "isa": isa, "rows": rows},
                  args.out)


if __name__ == "__main__":
    main()
