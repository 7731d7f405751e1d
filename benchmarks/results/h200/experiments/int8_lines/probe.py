"""The int8 candidates at large shapes: every one the runner times (exactness checked), then the ten fastest of ours
and cuBLASLt's first, three rounds in turns, for the int32 sums and for the sums requantized to int8 (a per-column
scale and bias, relu, rounding, saturation).

    python3 probe.py [shape indices: 0 4096^3, 1 8192^3, 2 8192x8192x1024, 3 2048x4096x4096]
"""
import sys
import time

import cupy
import numpy as np

import cortado as ct
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (2048, 4096, 4096)]
chosen = [SHAPES[int(i)] for i in sys.argv[1:]] or SHAPES[:1]


def requantized(sums, n):
    """A quantized layer's epilogue, and its operands' stand-ins (a scale and a bias per column)."""
    extras = [Operand((n,), np.dtype(np.float32), (1,))] * 2
    y = ct.relu(ct.cast(sums, "float32") * parameter(1, extras[0]) + parameter(2, extras[1]))
    return ct.cast(ct.minimum(ct.maximum(ct.rint(y * np.float32(20.0)), -128.0), 127.0), "int8"), extras


for m, n, k in chosen:
    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.integers(-128, 128, (m, k), dtype=np.int8))
    b = cupy.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8))
    exact = (a.astype(cupy.float64) @ b.T.astype(cupy.float64)).astype(cupy.int32)
    scale = cupy.asarray((rng.random(n) * 1e-3 + 1e-5).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(n).astype(np.float32))
    levels = cupy.rint(cupy.maximum(exact.astype(cupy.float32) * scale + bias, 0) * np.float32(20.0))
    quantized = cupy.clip(levels, -128, 127).astype(cupy.int8)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    for label, (body, extras), expected, arrays in (("int32 sums", (sums, []), exact, ()),
                                                    ("requantized to int8", requantized(sums, n), quantized,
                                                     (scale.data.ptr, bias.data.ptr))):
        call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), body,
                        tuple(extras), (n, 1), constant_b=True)
        started = time.perf_counter()
        runner = Int8Gemm(call)
        scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
        result = cupy.empty((m, n), expected.dtype)
        stream = cupy.cuda.Stream(non_blocking=True)
        pointers = (a.data.ptr, b.data.ptr, arrays, result.data.ptr, scratch.data.ptr)
        with stream:
            runner.tune(pointers, stream)
            print(f"{m}x{n}x{k} {label}: {len(runner.candidates)} candidates built and timed in "
                  f"{time.perf_counter() - started:.1f} s; workspace {runner.workspace_bytes / 2 ** 20:.1f} MiB\n"
                  f"  chosen: {runner.describe()}", flush=True)
            for c, t in sorted(zip(runner.candidates, runner.times), key=lambda e: e[1]):
                result.fill(0)
                c.call(*pointers, stream.ptr)
                stream.synchronize()
                print(f"  {t * 1e3:8.2f} us  {'exact' if bool((result == expected).all()) else 'WRONG'}  {c.describe()}")
            ranked = [c for _, c in sorted(zip(runner.times, runner.candidates), key=lambda e: e[0])]
            contestants = [c for c in ranked if isinstance(c, _Kernel)][:10]
            contestants += [c for c in runner.candidates if not isinstance(c, _Kernel)][:1]
            rounds = [[_time(c, pointers, stream) for c in contestants] for _ in range(3)]
            print("  three rounds in turns, us:")
            for c, times in zip(contestants, zip(*rounds)):
                print(f"    {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {c.describe()}", flush=True)
