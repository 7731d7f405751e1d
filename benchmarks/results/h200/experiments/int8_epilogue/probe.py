"""Where the warp-specialised int8 kernel's time goes at large shapes: each warp-specialised candidate timed as the
runner times it (those whose results the TMA stores among them), then again built with its results folded into one
value a thread instead of stored (the products alone: a kernel whose sums nobody reads loses its products to the
compiler), beside cuBLASLt's int8 GEMM. With --profile, each of those is called once more inside the profiler's range
(``ncu --profile-from-start off``).

    python3 probe.py [--profile] [shape indices: 0 4096^3, 1 8192^3, 2 2048x1024x1024]
"""
import sys
from dataclasses import replace

import cupy
import numpy as np

import cortado  # noqa: F401
from cortado.backends.cupy.calls.int8 import specialised
from cortado.backends.cupy.calls.int8.product import grid, warpgroup_tiling
from cortado.backends.cupy.calls.int8.tilings import stored_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.calls.int8.epilogue import parameters
from cortado.backends.cupy.calls.int8.warpgroup import ARCHITECTURE
from cortado.backends.cupy.calls.int8.epilogue import OPTIONS
from cortado.backends.cupy.codegen import PRELUDE, Operand, Source, kernel_name
from cortado.backends.cupy.kernels import prepare
from cortado.exprgraph.ops import parameter

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 1024, 1024)]
profile = "--profile" in sys.argv
chosen = [SHAPES[int(i)] for i in sys.argv[1:] if i != "--profile"] or SHAPES[:1]


FOLDED = """  int folded = 0;
  auto store_all = [&](auto store) {{
{fragments}  }};
  store_all([&](const int s0, const int s1, const int m, const int n) {{ folded ^= s0 ^ (3 * s1); }});
  if (folded == 0x7eadbeef) out0[threadIdx.x] = folded;  // (not so for these operands)
"""


class Folded(_Kernel):
    """A warp-specialised candidate whose sums are folded into one value a thread, stored where it is one no sums of
    these operands fold to: its products alone."""

    def __init__(self, kernel, body, extras):
        super().__init__(kernel.product, kernel.tiling, body, extras, (kernel.product.n, 1))
        p, t = kernel.product, kernel.tiling
        text = specialised.kernel_text(p, t, parameters(p, body, extras),
                                       lambda fragments, sync="": FOLDED.format(fragments=fragments))
        name = kernel_name(text + "folded")
        self.source = Source(name, PRELUDE + text.replace(" int8_gemm(", f" {name}(", 1), grid(p, t),
                             (t.threads, 1, 1), shared=t.shared_bytes, options=OPTIONS + ARCHITECTURE)
        prepare(self.source)

    def describe(self):
        return super().describe() + ", sums FOLDED, not stored"


EXTRA = [warpgroup_tiling(*shape, 1, "tma", 132, cluster, stored) for shape in ((128, 128, 128, 6), (64, 256, 128, 4))
         for cluster in (1, 2) for stored in (0, 4)]
EXTRA = [stored_tiling(replace(t, stored=0), 4) if t.stored else t for t in EXTRA]

for m, n, k in chosen:
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    a, b = cupy.asarray(a), cupy.asarray(b)
    expected = (a.astype(cupy.float64) @ b.T.astype(cupy.float64)).astype(cupy.int32)
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
        print(f"{m}x{n}x{k}: {runner.describe()}", flush=True)
        for c, t in sorted(zip(runner.candidates, runner.times), key=lambda e: e[1]):
            result.fill(0)
            c.call(*pointers, stream.ptr)
            stream.synchronize()
            print(f"  {t * 1e3:8.2f} us  {'exact' if bool((result == expected).all()) else 'WRONG'}  {c.describe()}")
        persistent = [c for c in runner.candidates if isinstance(c, _Kernel) and c.tiling.blocks]
        # and tiles of fewer results, whose tile of results leaves room for more stages beside it
        others = [_Kernel(runner.candidates[0].product, t, sums, [], (n, 1)) for t in EXTRA]
        for c in others:
            result.fill(0)
            c.call(*pointers, stream.ptr)
            stream.synchronize()
            print(f"  {'exact' if bool((result == expected).all()) else 'WRONG'}  {c.describe()}")
        persistent += others
        library = [c for c in runner.candidates if not isinstance(c, _Kernel)][:1]
        folded = [Folded(c, sums, ()) for c in persistent if not c.tiling.stored]
        contestants = persistent + folded + library
        rounds = [[_time(c, pointers, stream) for c in contestants] for _ in range(3)]
        print("  three rounds in turns, us (the persistent kernels, their products alone, cuBLASLt's):")
        for c, times in zip(contestants, zip(*rounds)):
            print(f"    {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {c.describe()}", flush=True)
        if profile:
            cupy.cuda.profiler.start()
            for c in contestants:
                c.call(*pointers, stream.ptr)
            stream.synchronize()
            cupy.cuda.profiler.stop()
            print("profiled in order:", *(c.describe() for c in contestants), sep="\n  ")
