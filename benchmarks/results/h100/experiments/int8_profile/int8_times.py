"""Each int8 candidate's time (the runner's tuning, two rounds, fastest) at a few shapes, and each checked exact."""
import cupy
import numpy as np

import cortado  # noqa: F401
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

import sys

SHAPES = [(4096, 4096, 4096), (2048, 1024, 1024), (512, 1024, 784), (8192, 8192, 8192)]
for m, n, k in [SHAPES[int(i)] for i in sys.argv[1:]] or SHAPES:
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
