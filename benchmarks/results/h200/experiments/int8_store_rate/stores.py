"""How fast an SM stores a 128 x 256 tile of int32 results (128 KB), alone and with every other SM storing too.

Each block (one per SM: 200 KB of dynamic shared memory each) stores ``TILES`` tiles of a 4096-column int32
matrix, in one of three ways:

- ``lines``: each warp instruction stores 512 contiguous bytes (four whole 128-byte lines), as
  ``warpgroup.line_stores`` does;
- ``fragments``: each warp instruction stores 8 rows of 32 bytes, as a ``wgmma`` fragment's stores do;
- ``bulk``: each warp asks for its 16 rows (1 KB each) as bulk copies out of shared memory (``cp.async.bulk``),
  as the TMA would store them.

For each, the kernel's time over a graph of launches, and inside each block the cycles (``clock64``) until its
stores were issued and until they were done (``fence.acq_rel.gpu`` after them).

    python3 stores.py
"""
import cupy
import numpy as np

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256, 1) stores(int* out, int tiles, int mode, long long* cycles) {
  extern __shared__ __align__(128) unsigned char scratch[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long t0 = clock64();
  for (int j = 0; j < tiles; ++j) {
    const int tile = blockIdx.x + j * gridDim.x, tr = tile / 16, tc = tile % 16;
    int* const base = out + (size_t)tr * 128 * 4096 + tc * 256 + (size_t)warp * 16 * 4096;
    const int4 v = make_int4(tile, j, threadIdx.x, 7);
    if (mode == 0) {  // lines: 512 contiguous bytes an instruction
      #pragma unroll
      for (int r = 0; r < 16; ++r)
        #pragma unroll
        for (int h = 0; h < 2; ++h) *(int4*)(base + (size_t)r * 4096 + h * 128 + lane * 4) = v;
    } else if (mode == 1) {  // fragments: 8 rows of 32 bytes an instruction
      #pragma unroll
      for (int c = 0; c < 32; ++c)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
          *(int2*)(base + (size_t)((lane >> 2) + 8 * h) * 4096 + c * 8 + (lane & 3) * 2) = make_int2(v.x, v.y);
    } else {  // bulk copies of the warp's rows out of shared memory
      int4* const row = (int4*)(scratch + warp * 1024);
      for (int i = lane; i < 64; i += 32) row[i] = v;
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncwarp();
      if (lane < 16) {
        const unsigned src = (unsigned)__cvta_generic_to_shared(row);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 1024;\n"
                     :: "l"(base + (size_t)lane * 4096), "r"(src) : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
      }
      __syncwarp();
    }
  }
  const long long issued = clock64();
  if (mode == 2 && lane < 16) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  __syncthreads();
  const long long done = clock64();
  if (threadIdx.x == 0) { cycles[2 * blockIdx.x] = issued - t0; cycles[2 * blockIdx.x + 1] = done - t0; }
}
"""
MODES = ("lines", "fragments", "bulk")
SHARED = 200 * 1024


def main():
    kernel = cupy.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90a")).get_function("stores")
    kernel.max_dynamic_shared_size_bytes = SHARED
    out = cupy.zeros((128 * 34, 4096), np.int32)  # room for 132 blocks' 4 tiles
    cycles = cupy.zeros(2 * 132, np.int64)
    stream = cupy.cuda.Stream(non_blocking=True)
    clock_hz = cupy.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1e3
    print(f"the SM clock the device reports: {clock_hz / 1e9:.2f} GHz (cycles below are SM cycles)")
    print(f"{'mode':10} {'blocks':>6} {'tiles':>5} {'us a launch':>11} {'GB/s':>7} "
          f"{'issued, kcycles (median / max)':>31} {'done, kcycles':>15}")
    for mode, name in enumerate(MODES):
        for blocks in (1, 8, 33, 66, 132):
            for tiles in (1, 4):
                args = (out, np.int32(tiles), np.int32(mode), cycles)
                with stream:
                    def launch(blocks=blocks, args=args):
                        kernel((blocks,), (256,), args, shared_mem=SHARED, stream=stream)
                    launch()
                    stream.synchronize()
                    stream.begin_capture()
                    for _ in range(50):
                        launch()
                    graph = stream.end_capture()
                    graph.launch(stream)
                    start = stream.record()
                    graph.launch(stream)
                    end = stream.record()
                    end.synchronize()
                    us = cupy.cuda.get_elapsed_time(start, end) * 1e3 / 50
                    launch()
                    stream.synchronize()
                c = cycles[:2 * blocks].get().reshape(blocks, 2) / 1e3
                gbs = blocks * tiles * 128 * 1024 / (us * 1e-6) / 1e9
                print(f"{name:10} {blocks:6d} {tiles:5d} {us:11.2f} {gbs:7.0f} "
                      f"{np.median(c[:, 0]):14.2f} / {c[:, 0].max():7.2f}       "
                      f"{np.median(c[:, 1]):7.2f} / {c[:, 1].max():7.2f}", flush=True)
    ok = bool((out[:128, :256] == 0).all())
    print("written" if not ok else "NOT WRITTEN")


if __name__ == "__main__":
    main()
