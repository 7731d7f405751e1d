"""The int8 candidates of a large product whose epilogue requantizes its sums to int8 (a per-column scale and bias, a
relu, rounding, saturation: a quantized layer's), as a program times them, each checked against NumPy's float32
formula bit for bit; then the persistent ones and cuBLASLt's (its int32 sums, then an epilogue kernel) three rounds
in turns.

    python3 probe_requantized.py [M N K]    (4096 4096 4096 unless given)
"""
import sys

import cupy
import numpy as np

import cortado as ct
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (4096, 4096, 4096)
rng = np.random.default_rng(0)
a = rng.integers(-128, 128, (m, k), dtype=np.int8)
b = rng.integers(-128, 128, (n, k), dtype=np.int8)
scale = (rng.random(n) * 1e-4 + 1e-6).astype(np.float32)
bias = rng.standard_normal(n).astype(np.float32)
exact = (cupy.asarray(a).astype(cupy.float64) @ cupy.asarray(b).T.astype(cupy.float64)).astype(cupy.int32)
levels = cupy.rint(cupy.maximum(exact.astype(cupy.float32) * cupy.asarray(scale) + cupy.asarray(bias),
                                np.float32(0)) * np.float32(1 / 0.05))
expected = cupy.clip(levels - np.float32(7), -128, 127).astype(cupy.int8)

sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
extras = (Operand((n,), np.dtype(np.float32), (1,)),) * 2
y = ct.relu(ct.cast(sums, "float32") * parameter(1, extras[0]) + parameter(2, extras[1]))
body = ct.cast(ct.minimum(ct.maximum(ct.rint(y * np.float32(1 / 0.05)) - 7.0, -128.0), 127.0), "int8")
call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), body,
                extras, (n, 1), constant_b=True)
runner = Int8Gemm(call)
a, b, scale, bias = (cupy.asarray(x) for x in (a, b, scale, bias))
scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
result = cupy.empty((m, n), np.int8)
stream = cupy.cuda.Stream(non_blocking=True)
pointers = (a.data.ptr, b.data.ptr, (scale.data.ptr, bias.data.ptr), result.data.ptr, scratch.data.ptr)
with stream:
    runner.tune(pointers, stream)
    print(f"{m}x{n}x{k}, requantized to int8: {runner.describe()}", flush=True)
    for c, t in sorted(zip(runner.candidates, runner.times), key=lambda e: e[1]):
        result.fill(0)
        c.call(*pointers, stream.ptr)
        stream.synchronize()
        print(f"  {t * 1e3:8.2f} us  {'exact' if bool((result == expected).all()) else 'WRONG'}  {c.describe()}")
    contestants = [c for c in runner.candidates if isinstance(c, _Kernel) and c.tiling.blocks]
    contestants += [c for c in runner.candidates if not isinstance(c, _Kernel)][:1]
    rounds = [[_time(c, pointers, stream) for c in contestants] for _ in range(3)]
    print("  three rounds in turns, us:")
    for c, times in zip(contestants, zip(*rounds)):
        print(f"    {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {c.describe()}", flush=True)
