"""How fast the TMA brings a persistent int8 kernel its operands, apart from its products and its stores: each
warp-specialised tiling at 4096^3 (int32 sums, whole-line stores) built three ways and timed in three rounds in turns
beside cuBLASLt's first algorithm:

- ``full``: the kernel the runner builds;
- ``no stores``: its products, no stores (the consumers' epilogue left out);
- ``supply``: neither: the consumers wait for each stage and hand it back, so the time is the operands' supply alone.

A 128x128 tile needs 64 bytes a cycle into an SM's shared memory at the tensor cores' int8 rate, a 256x128 or
128x256 one 48: where ``supply`` at 128x128 is slower than the products alone take, a ping-pong kernel of
128x128 tiles (two warpgroups, one storing while the other multiplies) cannot keep up.

    python3 probe.py
"""
import numpy as np

from cortado.backends.cupy.calls.int8 import specialised
from cortado.backends.cupy.calls.int8.product import Product, warpgroup_tiling
from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm, _Kernel, _time
from cortado.backends.cupy.codegen import Operand
from cortado.backends.cupy.kernels import prepare
from cortado.exprgraph.ops import parameter

M = N = K = 4096
BLOCKS = 132
REAL_TEXT, REAL_PRODUCTS = specialised.kernel_text, specialised.tile_products


# instead of the stores: the sums folded, so the products are kept, and stored only where they never are
KEPT = """      int folded = 0;
      #pragma unroll
      for (int r = 0; r < REGS; ++r) folded ^= acc[r];
      if (folded == 0x7fffffff) out0[threadIdx.x] = folded;
"""


def built(product, tiling, products, stores):
    """The kernel of ``tiling`` for ``product`` (int32 sums), with or without its products and its stores."""
    specialised.tile_products = REAL_PRODUCTS if products else (lambda p, t: "")
    specialised.kernel_text = (REAL_TEXT if stores else
                               lambda p, t, params, _: REAL_TEXT(p, t, params, lambda *a, **k: KEPT))
    try:
        return _Kernel(product, tiling, SUMS, (), (N, 1))
    finally:
        specialised.tile_products, specialised.kernel_text = REAL_PRODUCTS, REAL_TEXT


def tilings():
    """The persistent tilings compared, alone and in clusters of two."""
    return [warpgroup_tiling(bm, bn, 128, stages, instruction="tma", blocks=BLOCKS, cluster=cluster, lines=True)
            for bm, bn, stages in ((256, 128, 4), (128, 256, 4), (128, 128, 6)) for cluster in (1, 2)]


PRODUCT = Product(M, N, K, (K, 1), (1, K), np.dtype(np.int8), np.dtype(np.int8), True, True, False, True)
SUMS = parameter(0, Operand((M, N), np.dtype(np.int32), (N, 1)))


def main():
    import cupy

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.integers(-128, 128, (M, K), dtype=np.int8))
    b = cupy.asarray(rng.integers(-128, 128, (N, K), dtype=np.int8))
    exact = (a.astype(cupy.float64) @ b.T.astype(cupy.float64)).astype(cupy.int32)
    call = Int8Call(Operand((M, K), np.dtype(np.int8), (K, 1)), Operand((K, N), np.dtype(np.int8), (1, K)), SUMS, (),
                    (N, 1), constant_b=True)
    library = next(c for c in Int8Gemm(call).candidates if not isinstance(c, _Kernel))
    contestants = [library]
    for tiling in tilings():
        if tiling.shared_bytes > 227 << 10:
            print(f"skipped {tiling}: {tiling.shared_bytes} bytes of shared memory")
            continue
        for label, products, stores in (("full", True, True), ("no stores", True, False), ("supply", False, False)):
            kernel = built(PRODUCT, tiling, products, stores)
            prepare(kernel.source)
            kernel.label = label
            contestants.append(kernel)
    scratch = cupy.zeros(max(max(c.workspace_bytes for c in contestants), 1), np.uint8)
    result = cupy.empty((M, N), np.int32)
    stream = cupy.cuda.Stream(non_blocking=True)
    pointers = (a.data.ptr, b.data.ptr, (), result.data.ptr, scratch.data.ptr)
    with stream:
        for c in contestants:
            if getattr(c, "label", "full") != "full":
                continue
            result.fill(0)
            c.call(*pointers, stream.ptr)
            stream.synchronize()
            print(f"{'exact' if bool((result == exact).all()) else 'WRONG'}  {c.describe()}", flush=True)
        rounds = [[_time(c, pointers, stream) for c in contestants] for _ in range(3)]
    print(f"{M}x{N}x{K}, int32 sums, three rounds in turns, us a call:")
    for c, times in zip(contestants, zip(*rounds)):
        label = getattr(c, "label", "")
        print(f"  {' / '.join(f'{t * 1e3:7.2f}' for t in times)}  {label:>9}  {c.describe()}", flush=True)


if __name__ == "__main__":
    main()
