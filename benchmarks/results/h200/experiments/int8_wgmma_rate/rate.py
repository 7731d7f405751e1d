"""Whether one warpgroup's ``wgmma`` keeps an SM's tensor cores busy alone, and whether another warpgroup's stores
slow it: a block of two warpgroups (one per SM: 200 KB of dynamic shared memory), warpgroup 0 multiplying a 64 x 256
tile by 128-byte K tiles from shared memory in the int8 kernel's pattern (four ``m64n256k32`` a tile, one tile's
products in flight while the next is issued) ``ITERATIONS`` times, and warpgroup 1 either idle, multiplying too, or
storing 64 KB of int32 results in whole lines again and again until warpgroup 0 is done.

    python3 rate.py
"""
import numpy as np

from cortado.backends.cupy.calls.int8.product import Product, warpgroup_tiling
from cortado.backends.cupy.calls.int8.warpgroup import descriptor_function, tile_products

ITERATIONS = 2000
SHARED = 200 * 1024


def source():
    product = Product(64, 256, 128, (128, 1), (1, 128), np.dtype(np.int8), np.dtype(np.int8), True, True)
    tiling = warpgroup_tiling(64, 256, 128, 2, instruction="tma")
    return f"""
{descriptor_function(tiling)}
extern "C" __global__ void __launch_bounds__(256, 1) rate(int mode, int iterations, int* out, long long* cycles) {{
  constexpr int BN = 256, BK = 128, REGS = BN / 2;
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ volatile int done;
  const unsigned base = ((unsigned)__cvta_generic_to_shared(smem) + 1023u) & ~1023u;
  const int group = threadIdx.x >> 7, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  int* const tiles = (int*)(smem + (base - (unsigned)__cvta_generic_to_shared(smem)));
  for (int i = threadIdx.x; i < (2 * 64 + BN) * BK / 4; i += blockDim.x) tiles[i] = i * 2654435761u;
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
  __syncthreads();
  const long long t0 = clock64();
  if (group == 0 || mode == 1) {{
    int acc[REGS];
    #pragma unroll
    for (int r = 0; r < REGS; ++r) acc[r] = 0;
    const unsigned a_tile = base + group * 64 * BK, b_tile = base + 2 * 64 * BK;
    for (int it = 0; it < iterations; ++it) {{
{tile_products(product, tiling)}
    }}
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
    int folded = 0;
    #pragma unroll
    for (int r = 0; r < REGS; ++r) folded ^= acc[r];
    if (folded == 0x7fffffff) out[threadIdx.x] = folded;  // keeps the products
    if (group == 0) done = 1;
  }} else if (mode == 2) {{  // warpgroup 1 stores whole lines of a 64 x 256 int32 tile until warpgroup 0 is done
    int stored = 0;
    while (!done) {{
      int* const rows = out + 1024 + (size_t)(blockIdx.x % 64) * 64 * 4096 + (stored & 15) * 256 + warp * 16 * 4096;
      #pragma unroll
      for (int r = 0; r < 16; ++r)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
          *(int4*)(rows + (size_t)r * 4096 + h * 128 + lane * 4) = make_int4(stored, r, h, lane);
      ++stored;
    }}
    if (threadIdx.x == 128) cycles[2 * blockIdx.x + 1] = stored;
  }}
  if (threadIdx.x == 0) cycles[2 * blockIdx.x] = clock64() - t0;
}}
"""


def main():
    import cupy

    kernel = cupy.RawModule(code=source(), options=("-std=c++17", "-arch=sm_90a")).get_function("rate")
    kernel.max_dynamic_shared_size_bytes = SHARED
    out = cupy.zeros(1024 + 64 * 64 * 4096, np.int32)
    cycles = cupy.zeros(2 * 132, np.int64)
    macs = ITERATIONS * 64 * 256 * 128
    print(f"warpgroup 0: {ITERATIONS} K tiles of 64x256x128; an SM's int8 rate is 4096 multiply-adds a cycle")
    print(f"{'warpgroup 1':>22} {'blocks':>6} {'kcycles (median)':>17} {'MACs a cycle, wg 0':>19} "
          f"{'tiles stored by wg 1':>21}")
    for mode, name in enumerate(("idle", "multiplying too", "storing lines")):
        for blocks in (1, 132):
            for _ in range(2):  # the second is reported: the first warms the clocks
                cycles.fill(0)
                kernel((blocks,), (256,), (np.int32(mode), np.int32(ITERATIONS), out, cycles), shared_mem=SHARED)
                cupy.cuda.runtime.deviceSynchronize()
            c = cycles.get().reshape(132, 2)[:blocks]
            median = float(np.median(c[:, 0]))
            print(f"{name:>22} {blocks:6d} {median / 1e3:17.1f} {macs / median:19.0f} "
                  f"{float(np.median(c[:, 1])) if mode == 2 else 0:21.0f}", flush=True)


if __name__ == "__main__":
    main()
