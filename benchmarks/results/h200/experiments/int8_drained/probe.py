"""Whether a drainer warp storing each warpgroup's slab of results while the others multiply the next tile closes the
gap to cuBLASLt's int8 GEMM with int32 sums at 4096^3 (``Tiling.drained``): each persistent tiling in whole lines
(each warp storing its own rows, the block's products waiting) and drained, alone and in clusters of two, checked
against the exact product and timed in three rounds in turns beside cuBLASLt's first algorithm; then the kernel the
runner itself chooses from all of its candidates.

    python3 probe.py [shapes: 0 = 4096^3, 1 = 2048x4096x4096]
"""
import sys

import numpy as np

from cortado.backends.cupy.calls.int8.product import Product, warpgroup_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.codegen import Operand
from cortado.backends.cupy.kernels import prepare
from cortado.exprgraph.ops import parameter

SHAPES = ((4096, 4096, 4096), (2048, 4096, 4096))
BLOCKS = 132


def tilings():
    """(bm, bn, bk, stages) in lines and drained, alone and in clusters of two."""
    forms = []
    for bm, bn, bk, line_stages, drained_stages in ((256, 128, 128, 4, 4), (128, 256, 128, 4, 3),
                                                    (256, 128, 64, 8, 8), (128, 256, 64, 8, 6)):
        for cluster in (1, 2):
            forms.append(warpgroup_tiling(bm, bn, bk, line_stages, instruction="tma", blocks=BLOCKS, cluster=cluster,
                                          lines=True))
            forms.append(warpgroup_tiling(bm, bn, bk, drained_stages, instruction="tma", blocks=BLOCKS,
                                          cluster=cluster, drained=4))
    return forms


def probe(m, n, k):
    import cupy

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.integers(-128, 128, (m, k), dtype=np.int8))
    b = cupy.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8))
    exact = (a.astype(cupy.float64) @ b.T.astype(cupy.float64)).astype(cupy.int32)
    cupy.cuda.Device().synchronize()
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    product = Product(m, n, k, (k, 1), (1, k), np.dtype(np.int8), np.dtype(np.int8), True, True, False, True)
    call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums, (),
                    (n, 1), constant_b=True)
    runner = Int8Gemm(call)
    library = next(c for c in runner.candidates if not isinstance(c, _Kernel))
    contestants = [library] + [_Kernel(product, t, sums, (), (n, 1)) for t in tilings()]
    for c in contestants[1:]:
        prepare(c.source)
    scratch = cupy.zeros(max(max(c.workspace_bytes for c in contestants + runner.candidates), 1), np.uint8)
    result = cupy.empty((m, n), np.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
    with stream:
        for c in contestants:
            result.fill(0)
            c.call(*pointers, stream.ptr)
            stream.synchronize()
            print(f"{'exact' if bool((result == exact).all()) else 'WRONG'}  {c.describe()}", flush=True)
        rounds = [[_time(c, pointers, stream) for c in contestants] for _ in range(3)]
        print(f"{m}x{n}x{k}, int32 sums, three rounds in turns, us a call:")
        for c, times in zip(contestants, zip(*rounds)):
            print(f"  {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {c.describe()}", flush=True)
        runner.tune(pointers, stream)
        result.fill(0)
        runner.call(*pointers, stream.ptr)
        stream.synchronize()
        print(f"the runner's choice ({'exact' if bool((result == exact).all()) else 'WRONG'}): {runner.describe()}")
        for t, c in sorted(zip(runner.times, runner.candidates), key=lambda pair: pair[0])[:8]:
            print(f"  {t * 1e3:7.2f}  {c.describe()}")


if __name__ == "__main__":
    for index in (sys.argv[1:] or ["0", "1"]):
        probe(*SHAPES[int(index)])
