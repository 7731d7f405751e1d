"""Each int8 candidate's time (the runner's tuning, two rounds, fastest) at a few shapes, each checked exact; with
--profile, each candidate then called once more inside the profiler's range (``ncu --profile-from-start off``).

    python3 int8_times.py [--profile] [shape indices: 0 4096^3, 1 2048x1024x1024, 2 512x1024x784, 3 8192^3]
"""
import sys

import cupy
import numpy as np

import cortado  # noqa: F401  (bfloat16 and the other dtypes NumPy lacks)
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

SHAPES = [(4096, 4096, 4096), (2048, 1024, 1024), (512, 1024, 784), (8192, 8192, 8192)]
profile = "--profile" in sys.argv
chosen = [SHAPES[int(i)] for i in sys.argv[1:] if i != "--profile"] or SHAPES
for m, n, k in chosen:
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    expected = cupy.asarray(a.astype(np.float64) @ b.T.astype(np.float64)).astype(np.int32)
    a, b = cupy.asarray(a), cupy.asarray(b)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums,
                    (), (n, 1), constant_b=True)
    runner = Int8Gemm(call)
    scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
    result = cupy.empty((m, n), np.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
    with stream:
        runner.tune(pointers, stream)
        print(f"{m}x{n}x{k}: {runner.describe()}")
        for c, t in sorted(zip(runner.candidates, runner.times), key=lambda e: e[1]):
            result.fill(0)
            c.call(*pointers, stream.ptr)
            stream.synchronize()
            ok = bool((result == expected).all())
            print(f"  {t * 1e3:8.2f} us  {'exact' if ok else 'WRONG'}  {c.describe()}")
        if profile:  # in the runner's order, once each
            cupy.cuda.profiler.start()
            for c in runner.candidates:
                c.call(*pointers, stream.ptr)
            stream.synchronize()
            cupy.cuda.profiler.stop()
            print("profiled in order:", *(c.describe() for c in runner.candidates), sep="\n  ")
