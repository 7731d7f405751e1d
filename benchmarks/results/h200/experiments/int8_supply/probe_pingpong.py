"""The ping-pong form of the warp-specialised int8 kernel (``Tiling.pingpong``: two warpgroups taking a persistent
block's 128x128 tiles in turns, one storing while the other multiplies) against the cooperative 256x128 kernel and
cuBLASLt's first algorithm, int32 sums, each checked exact, then timed in three rounds in turns; each kernel in the
order along rows of tiles (the kernel's) and in groups of rows of tiles taken a column at a time (``probe_order.py``:
it brought 128x128 tiles' operands in 69-71 us against 80 along rows); and the ping-pong kernel's products alone
(``probe.py``'s ``no stores``).

    python3 probe_pingpong.py [M N K ...]    (at 0118bcd, where the ping-pong form is)
"""
import dataclasses
import sys

import numpy as np

from cortado.backends.cupy.calls.int8.product import Product, warpgroup_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.codegen import Operand, kernel_name
from cortado.backends.cupy.kernels import prepare
from cortado.exprgraph.ops import parameter

import probe

BLOCKS = 132
JOBS = "m0 = job / TILES_N * BM, n0 = job % TILES_N * BN"
ORDERS = {"rows": JOBS, **{f"groups of {g}": (f"m0 = (job / ({g} * TILES_N) * {g} + job % {g}) * BM, "
                                              f"n0 = job % ({g} * TILES_N) / {g} * BN") for g in (4, 8)}}
TILINGS = (
    warpgroup_tiling(256, 128, 128, 4, instruction="tma", blocks=BLOCKS, lines=True),
    dataclasses.replace(warpgroup_tiling(128, 128, 128, 6, instruction="tma", blocks=BLOCKS, lines=True), pingpong=True),
    dataclasses.replace(warpgroup_tiling(128, 128, 64, 12, instruction="tma", blocks=BLOCKS, lines=True), pingpong=True),
)


def ordered(kernel, order):
    """``kernel`` with its jobs taken in ``order``, in its producer and its consumers."""
    if order == "rows":
        return kernel
    other = _Kernel.__new__(_Kernel)
    other.__dict__.update(kernel.__dict__)
    assert kernel.source.text.count(JOBS) == 2
    text = kernel.source.text.replace(JOBS, ORDERS[order])
    name = kernel_name(text)
    other.source = dataclasses.replace(kernel.source, name=name, text=text.replace(f" {kernel.source.name}(", f" {name}("))
    return other


def contestants(m, n, k):
    """Our kernels, each in every order, for an ``m x n x k`` product into int32 sums."""
    product = Product(m, n, k, (k, 1), (1, k), np.dtype(np.int8), np.dtype(np.int8), True, True)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    found = []
    for tiling in TILINGS:
        base = _Kernel(product, tiling, sums, (), (n, 1))
        found += [(ordered(base, order), order) for order in ORDERS]
        if tiling.pingpong and tiling.bk == 128:  # and its products alone, in the order along rows
            found.append((built(product, tiling, True, False, sums), "no stores"))
    return found, sums


def built(product, tiling, products, stores, sums):
    """``probe.built`` for an ``m x n x k`` product of its own."""
    probe.N = product.n
    probe.SUMS = sums
    return probe.built(product, tiling, products, stores)


def main():
    import cupy

    sizes = [int(s) for s in sys.argv[1:]] or [4096, 4096, 4096, 2048, 4096, 4096]
    for m, n, k in zip(sizes[::3], sizes[1::3], sizes[2::3]):
        ours, sums = contestants(m, n, k)
        for kernel, _ in ours:
            prepare(kernel.source)
        call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums,
                        (), (n, 1))
        library = next(c for c in Int8Gemm(call).candidates if not isinstance(c, _Kernel))
        everyone = [(library, "")] + ours
        rng = np.random.default_rng(0)
        a = cupy.asarray(rng.integers(-128, 128, (m, k), dtype=np.int8))
        b = cupy.asarray(rng.integers(-128, 128, (n, k), dtype=np.int8))
        exact = (a.astype(cupy.float64) @ b.T.astype(cupy.float64)).astype(cupy.int32)
        cupy.cuda.Device().synchronize()  # the sums exist before another stream reads them
        scratch = cupy.zeros(max(max(c.workspace_bytes for c, _ in everyone), 1), np.uint8)
        result = cupy.empty((m, n), np.int32)
        stream = cupy.cuda.Stream(non_blocking=True)
        pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
        with stream:
            for c, order in everyone:
                if order == "no stores":
                    continue
                result.fill(7)
                c.call(*pointers, stream.ptr)
                stream.synchronize()
                print(f"{'exact' if bool((result == exact).all()) else 'WRONG'}  {order:>11}  {c.describe()}", flush=True)
            rounds = [[_time(c, pointers, stream) for c, _ in everyone] for _ in range(3)]
        print(f"{m}x{n}x{k}, int32 sums, three rounds in turns, us a call:")
        for (c, order), times in zip(everyone, zip(*rounds)):
            print(f"  {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {order:>11}  {c.describe()}", flush=True)


if __name__ == "__main__":
    main()
