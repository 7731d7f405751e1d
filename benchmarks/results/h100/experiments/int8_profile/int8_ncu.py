"""Profile the int8 4096^3 candidates (ours and cuBLASLt's) once each under ncu's profiler range."""
import sys

import cupy
import numpy as np

import cortado  # noqa: F401  (registers bfloat16)
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

m = n = k = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
rng = np.random.default_rng(0)
a = cupy.asarray(rng.integers(-128, 128, (m, k), dtype=np.int8))
b_stored = cupy.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8))
sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums,
                (), (n, 1), constant_b=True)
runner = Int8Gemm(call)
scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
result = cupy.empty((m, n), np.int32)
stream = cupy.cuda.Stream(non_blocking=True)
pointers = (a.data.ptr, b_stored.data.ptr, (), result.data.ptr, scratch.data.ptr)
with stream:
    runner.tune(pointers, stream)
    for c in runner.candidates:
        for _ in range(3):
            c.call(*pointers, stream.ptr)
    stream.synchronize()
    names = []
    cupy.cuda.profiler.start()
    for c in runner.candidates:
        c.call(*pointers, stream.ptr)
        names.append(c.describe())
    stream.synchronize()
    cupy.cuda.profiler.stop()
print("candidates in order:", *names, sep="\n  ")
print("chosen:", runner.describe())
