"""The odd warpgroups of a persistent int8 kernel starting ``lead`` K tiles after the even ones (``Tiling.lead``):
each persistent tiling in whole lines the runner builds, with leads 0 to 3, checked against the exact sums and timed
in three rounds in turns beside cuBLASLt's first algorithm, for int32 sums and for sums requantized to int8.

    python3 probe.py [shape indices: 0 4096^3, 1 8192^3, 2 2048x4096x4096, 3 8192x8192x1024]
"""
import sys
from dataclasses import replace

import cupy
import numpy as np

import cortado as ct
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.calls.int8.source import gemm_source
from cortado.backends.cupy.codegen import Operand
from cortado.backends.cupy.kernels import prepare
from cortado.exprgraph.ops import parameter

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 4096, 4096), (8192, 8192, 1024)]
chosen = [SHAPES[int(i)] for i in sys.argv[1:]] or SHAPES[:1]


def requantized(sums, n):
    """A quantized layer's epilogue, and its operands' stand-ins (a scale and a bias per column)."""
    extras = [Operand((n,), np.dtype(np.float32), (1,))] * 2
    y = ct.relu(ct.cast(sums, "float32") * parameter(1, extras[0]) + parameter(2, extras[1]))
    return ct.cast(ct.minimum(ct.maximum(ct.rint(y * np.float32(20.0)), -128.0), 127.0), "int8"), extras


def led(kernel, lead, body, extras, out_strides):
    """``kernel`` (a ``_Kernel``) again, its odd warpgroups ``lead`` K tiles behind."""
    other = _Kernel.__new__(_Kernel)
    other.__dict__.update(kernel.__dict__)
    other.tiling = replace(kernel.tiling, lead=lead)
    other.source = gemm_source(kernel.product, other.tiling, body, extras, out_strides)
    other.maps = (None, None)
    prepare(other.source)
    return other


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
        runner = Int8Gemm(call)
        scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
        result = cupy.empty((m, n), expected.dtype)
        stream = cupy.cuda.Stream(non_blocking=True)
        pointers = (a.data.ptr, b.data.ptr, arrays, result.data.ptr, scratch.data.ptr)
        bases = [c for c in runner.candidates if isinstance(c, _Kernel) and c.tiling.blocks and c.tiling.lines
                 and c.tiling.bk == 128 and c.tiling.bm // 64 % 2 == 0]
        contestants = []
        for base in bases:
            contestants += [base] + [led(base, lead, body, tuple(extras), (n, 1))
                                     for lead in (1, 2, 3) if lead < base.tiling.stages]
        library = next(c for c in runner.candidates if not isinstance(c, _Kernel))
        contestants.append(library)
        print(f"{m}x{n}x{k} {label}: {len(contestants)} contestants", flush=True)
        with stream:
            for c in contestants:
                result.fill(0)
                c.call(*pointers, stream.ptr)
                stream.synchronize()
                if not bool((result == expected).all()):
                    print(f"  WRONG  {c.describe()}", flush=True)
            rounds = [[_time(c, pointers, stream) for c in contestants] for _ in range(3)]
        print("  three rounds in turns, us:")
        for c, times in sorted(zip(contestants, zip(*rounds)), key=lambda e: min(e[1])):
            print(f"    {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {c.describe()}", flush=True)
