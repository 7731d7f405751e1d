"""One call each of cuBLASLt's first int8 algorithm (lib), the ping-pong kernel in clusters of two (pp) and the
persistent clustered 256x128 kernel (coop) at 4096^3, inside the profiler's range (branch int8-pingpong):

    ncu --clock-control none --profile-from-start off --section ... python3 pingpong_profile.py [lib] [pp] [coop]
"""
import sys

import cupy
import numpy as np
import cortado  # noqa: F401
from cortado.backends.cupy.calls.int8.product import warpgroup_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

m = n = k = 4096
rng = np.random.default_rng(0)
a = cupy.asarray(rng.integers(-128, 128, (m, k), dtype=np.int8))
b = cupy.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8))
sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums,
                (), (n, 1), constant_b=True)
runner = Int8Gemm(call)
library = [c for c in runner.candidates if "cuBLASLt" in c.describe()][:1]
product = runner.candidates[0].product
ours = [_Kernel(product, t, sums, [], (n, 1)) for t in (
    warpgroup_tiling(128, 128, 128, 6, 1, "tma", 132, 2, True),
    warpgroup_tiling(256, 128, 128, 4, 1, "tma", 132, 2))]
scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
result = cupy.empty((m, n), np.int32)
stream = cupy.cuda.Stream(non_blocking=True)
pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
chosen = {"lib": library, "pp": ours[:1], "coop": ours[1:]}
picked = [c for name in (sys.argv[1:] or ["lib", "pp", "coop"]) for c in chosen[name]]
library, ours = [], picked
with stream:
    for c in library + ours:  # warm: compile, encode maps
        for _ in range(20):
            c.call(*pointers, stream.ptr)
    stream.synchronize()
    cupy.cuda.profiler.start()
    for c in library + ours:
        c.call(*pointers, stream.ptr)
    stream.synchronize()
    cupy.cuda.profiler.stop()
print(*(c.describe() for c in library + ours), sep="\n")
