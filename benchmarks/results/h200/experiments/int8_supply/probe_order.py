"""Whether the order in which a persistent grid takes its output tiles, or the L2 promotion of its tensor maps,
brings the int8 kernel's operands faster (``probe.py``'s three forms: ``full``, ``no stores``, ``supply``), at
4096^3 with int32 sums, for 256x128 and 128x128 tiles, timed in three rounds in turns beside cuBLASLt's first
algorithm. The orders: along rows of tiles (the kernel's), down columns, and in groups of ``G`` rows of tiles taken a
column at a time (each group's A panels and B panels read by many blocks at once).

    python3 probe_order.py
"""
import dataclasses

import numpy as np

from cortado.backends.cupy.calls.int8 import specialised
from cortado.backends.cupy.calls.int8.product import warpgroup_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.codegen import Operand, kernel_name
from cortado.backends.cupy.kernels import prepare

from probe import BLOCKS, K, M, N, PRODUCT, SUMS, built

ROWS = "const int m0 = job / TILES_N * BM, n0 = job % TILES_N * BN;"
ORDERS = {
    "rows": ROWS,
    "columns": "const int m0 = job % ((M + BM - 1) / BM) * BM, n0 = job / ((M + BM - 1) / BM) * BN;",
    **{f"groups of {g}": (f"const int m0 = (job / ({g} * TILES_N) * {g} + job % {g}) * BM, "
                          f"n0 = job % ({g} * TILES_N) / {g} * BN;") for g in (4, 8, 16)},
}
PROMOTIONS = {"L2 promotion 256 B": 3, "128 B": 2, "none": 0}
FORMS = (("full", True, True), ("supply", False, False))


def ordered(kernel, order):
    """``kernel`` with its jobs taken in ``order`` (a line of C replacing the kernel's, in producer and consumers)."""
    other = _Kernel.__new__(_Kernel)
    other.__dict__.update(kernel.__dict__)
    assert kernel.source.text.count(ROWS) == 2
    text = kernel.source.text.replace(ROWS, ORDERS[order])
    name = kernel_name(text)
    other.source = dataclasses.replace(kernel.source, name=name, text=text.replace(f" {kernel.source.name}(",
                                                                                    f" {name}("))
    return other


def main():
    import cupy

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.integers(-128, 128, (M, K), dtype=np.int8))
    b = cupy.asarray(rng.integers(-128, 128, (N, K), dtype=np.int8))
    exact = (a.astype(cupy.float64) @ b.T.astype(cupy.float64)).astype(cupy.int32)
    call = Int8Call(Operand((M, K), np.dtype(np.int8), (K, 1)), Operand((K, N), np.dtype(np.int8), (1, K)), SUMS, (),
                    (N, 1))
    library = next(c for c in Int8Gemm(call).candidates if not isinstance(c, _Kernel))
    product = dataclasses.replace(PRODUCT, constant_b=False)  # no early copies, which assume the rows' order
    contestants = [(library, "", "")]
    for bm, bn, stages in ((256, 128, 4), (128, 128, 6)):
        tiling = warpgroup_tiling(bm, bn, 128, stages, instruction="tma", blocks=BLOCKS, lines=True)
        for label, products, stores in FORMS:
            base = built(product, tiling, products, stores)
            for order in ORDERS:
                kernel = ordered(base, order) if order != "rows" else base
                prepare(kernel.source)
                contestants.append((kernel, label, order))
    scratch = cupy.zeros(max(max(c.workspace_bytes for c, _, _ in contestants), 1), np.uint8)
    result = cupy.empty((M, N), np.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
    defaults = specialised.tensor_map.__defaults__
    for promotion, value in PROMOTIONS.items():
        specialised.tensor_map.__defaults__ = (value,)
        for c, _, _ in contestants:
            if isinstance(c, _Kernel):
                c.maps = (None, None)  # encoded again with this promotion
        with stream:
            for c, label, order in contestants:
                if label in ("", "full"):
                    result.fill(0)
                    c.call(*pointers, stream.ptr)
                    stream.synchronize()
                    if not bool((result == exact).all()):
                        print(f"WRONG  {order} {c.describe()}", flush=True)
            rounds = [[_time(c, pointers, stream) for c, _, _ in contestants] for _ in range(3)]
        print(f"{M}x{N}x{K}, int32 sums, {promotion}, three rounds in turns, us a call:")
        for (c, label, order), times in zip(contestants, zip(*rounds)):
            print(f"  {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {label:>6}  {order:>12}  {c.describe()}",
                  flush=True)
    specialised.tensor_map.__defaults__ = defaults


if __name__ == "__main__":
    main()
