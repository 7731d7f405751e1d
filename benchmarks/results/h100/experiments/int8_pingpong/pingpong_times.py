"""The ping-pong int8 kernel's variants (6 or 7 stages, alone or in clusters of two, K steps of one slab before the
other's) timed beside cuBLASLt's algorithms and the runner's persistent 256x128 / 128x256 kernels, two rounds, each
result checked exact. Runs on the branch int8-pingpong (the kernel form is not on main):

    python3 pingpong_times.py [number of shapes: 1 for 4096^3, 2 for 8192^3 too]
"""
import sys
import cupy
import numpy as np
import cortado  # noqa: F401
from cortado.backends.cupy.calls.int8 import runner as runner_module
from cortado.backends.cupy.calls.int8 import specialised, warpgroup
from cortado.backends.cupy.calls.int8.product import warpgroup_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel
from cortado.backends.cupy.codegen import Operand
from cortado.exprgraph.ops import parameter

ORIGINAL = warpgroup.tile_products


def slices_outer(product, tiling, slices=1):
    loops = "".join(f"""    #pragma unroll
    for (int kk = 0; kk < BK; kk += 32) {{
      const unsigned long long db = ct_descriptor(b_tile + kk), da = ct_descriptor(a_tile + {64 * s} * BK + kk);
      {warpgroup._wgmma(product, tiling.bn, s * tiling.bn // 2)}
    }}
""" for s in range(slices))
    return f"""    #pragma unroll
    for (int r = 0; r < REGS; ++r) asm volatile("" : "+r"(acc[r]) :: "memory");
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
{loops}    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
    #pragma unroll
    for (int r = 0; r < REGS; ++r) asm volatile("" : "+r"(acc[r]) :: "memory");"""


for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192)][: int(sys.argv[1]) if len(sys.argv) > 1 else 2]:
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    expected = cupy.asarray(a.astype(np.float64) @ b.T.astype(np.float64)).astype(np.int32)
    a, b = cupy.asarray(a), cupy.asarray(b)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums,
                    (), (n, 1), constant_b=True)
    runner = Int8Gemm(call)
    keep = [c for c in runner.candidates if "cuBLASLt" in c.describe()
            or all(word in c.describe() for word in ("tma", "x128 tiles", "persistent"))]
    product = runner.candidates[0].product
    variants = []
    for stages in (6, 7):
        for cluster in (1, 2):
            variants.append((warpgroup_tiling(128, 128, 128, stages, 1, "tma", 132, cluster, True), ""))
    variants.append((warpgroup_tiling(128, 128, 128, 7, 1, "tma", 132, 2, True), "slices outer"))
    made = []
    for t, how in variants:
        if how:
            specialised.tile_products = slices_outer
        kernel = _Kernel(product, t, sums, [], (n, 1))
        specialised.tile_products = ORIGINAL
        kernel.how = how
        made.append(kernel)
    runner.candidates = keep + made
    runner.key = ("scratch", m)
    scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
    result = cupy.empty((m, n), np.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
    with stream:
        for rnd in range(2):
            runner_module._tuned.clear()
            runner.tune(pointers, stream)
            print(f"{m}x{n}x{k} round {rnd}")
            for c, t in sorted(zip(runner.candidates, runner.times), key=lambda e: e[1]):
                result.fill(0)
                c.call(*pointers, stream.ptr)
                stream.synchronize()
                ok = bool((result == expected).all())
                print(f"  {t * 1e3:8.2f} us  {'exact' if ok else 'WRONG'}  {c.describe()} {getattr(c, 'how', '')}")
