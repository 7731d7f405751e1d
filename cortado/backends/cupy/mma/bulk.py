"""The ``tma`` form of the int8 GEMM kernel, for sm_90: the ``wgmma`` kernel's products, its tiles brought into
shared memory by the tensor memory accelerator instead of by every thread's ``cp.async``, and ``B``'s tile shared
by a cluster of blocks down ``M``.

A large product is bound by what its blocks read from L2 (``B``'s tile once per block down ``M``). Here the
blocks of a cluster (``CLUSTER``, 1 or 2, with consecutive tiles down ``M`` and the same ``n0``) each copy a
``BN / CLUSTER``-row share of ``B``'s tile and multicast it into every block of the cluster: ``B`` is read from
L2 ``CLUSTER`` times less often. One thread of each block issues the copies (``cp.async.bulk.tensor``, described
by tensor maps the host encodes, ``tensor_map``): ``A``'s tile into its own block, its share of ``B``'s into
all. The copies write the hardware's 128-, 64- or 32-byte swizzle, the layout the ``wgmma`` descriptors name,
and fill rows and ``K`` beyond the operands with zeros.

Each stage has two barriers in shared memory: ``full`` (armed by the issuing thread with the stage's bytes; the
copies, the other blocks' too, count their bytes off it) and ``empty`` (every warp of every block of the cluster
arrives once it has read the stage). A stage is refilled once its ``empty`` barrier completes: a block never
overwrites a share the others are still reading. The blocks of a cluster start (barriers initialised) and end
(no arrival still on its way to a block that left) together.
"""

import ctypes

import numpy as np

from ....errors import BackendError
from ..launch import WAIT_PRIOR_GRIDS, driver
from .epilogue import split_sums
from .product import SWIZZLE_ALIGNMENT
from .warpgroup import SWIZZLE_MODES, STORE_LOOP, all_products_done, descriptor_function, tile_products

TENSOR_MAP_BYTES = 128
MAP_PARAMETERS = ("const __grid_constant__ ct_tensor_map a_map", "const __grid_constant__ ct_tensor_map b_map")
_UINT8, _NO_INTERLEAVE, _L2_PROMOTION_256B, _ZERO_FILL = 0, 0, 3, 0
_TENSOR_MAP_SWIZZLE = {128: 3, 64: 2, 32: 1}  # CUtensorMapSwizzle of rows of 128, 64, 32 bytes


def kernel_text(product, tiling, params, stores):
    """The ``tma`` kernel of ``product`` cut by ``tiling``; its parameters are ``params`` and the two tensor maps."""
    p, t = product, tiling
    share = t.bn // t.cluster
    if (not (p.vector_a and p.vector_b) or t.bm % 64 or t.bk not in SWIZZLE_MODES or t.stages < 2
            or t.cluster not in (1, 2) or share % 8 or t.bm > 256 or share > 256):
        raise ValueError(f"a tma kernel cannot take {p} cut as {t}")
    multicast = ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;")
    single = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
    b_copy = (f'asm volatile("{multicast}" :: "r"(b_dst), "l"(b_map_address), "r"(k0), "r"(n0 + (int)rank * SHARE), '
              f'"r"(full), "h"((unsigned short)((1 << CLUSTER) - 1)) : "memory");' if t.cluster > 1 else
              f'asm volatile("{single}" :: "r"(b_dst), "l"(b_map_address), "r"(k0), "r"(n0), "r"(full) : "memory");')
    signature = ", ".join(params + list(MAP_PARAMETERS))
    return f"""
#define THREADS {t.threads}
struct alignas(128) ct_tensor_map {{ unsigned long long words[16]; }};
{descriptor_function(t)}
__device__ __forceinline__ void ct_wait_phase(unsigned barrier, unsigned parity) {{
  unsigned done = 0;
  do {{
    asm volatile("{{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}}\\n"
                 : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
  }} while (!done);
}}
__device__ __forceinline__ void ct_cluster_sync() {{
  asm volatile("barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n" ::: "memory");
}}
extern "C" __global__ void __cluster_dims__(1, {t.cluster}, 1) __launch_bounds__(THREADS, 1) int8_gemm({signature}) {{
  {WAIT_PRIOR_GRIDS}
  constexpr int M = {p.m}, N = {p.n}, K = {p.k}, BM = {t.bm}, BN = {t.bn}, BK = {t.bk}, STAGES = {t.stages};
  constexpr int CLUSTER = {t.cluster}, SHARE = BN / CLUSTER, WARPS = THREADS / 32;
  constexpr int KTILES = (K + BK - 1) / BK, STAGE_BYTES = (BM + BN) * BK;
  constexpr int SPLITS = {t.splits}, PER_SPLIT = (KTILES + SPLITS - 1) / SPLITS, REGS = BN / 2;
  extern __shared__ unsigned char smem[];
  __shared__ __align__(8) unsigned long long barriers[2 * STAGES];  // each stage's full, then each one's empty
  const unsigned smem_base = ((unsigned)__cvta_generic_to_shared(smem) + {SWIZZLE_ALIGNMENT - 1}u) & ~{SWIZZLE_ALIGNMENT - 1}u;
  const unsigned full0 = (unsigned)__cvta_generic_to_shared(barriers), empty0 = full0 + 8 * STAGES;
  const unsigned long long a_map_address = (unsigned long long)&a_map, b_map_address = (unsigned long long)&b_map;
  unsigned rank;
  asm("mov.u32 %0, %%cluster_ctarank;\\n" : "=r"(rank));
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, group = threadIdx.x >> 7;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int kt0 = blockIdx.z * PER_SPLIT, tiles = min(KTILES, kt0 + PER_SPLIT) - kt0;
  int acc[REGS];
  #pragma unroll
  for (int r = 0; r < REGS; ++r) acc[r] = 0;
  if (threadIdx.x == 0) {{
    for (int s = 0; s < STAGES; ++s) {{
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n" :: "r"(full0 + 8 * s) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\\n" :: "r"(empty0 + 8 * s), "r"(CLUSTER * WARPS) : "memory");
    }}
    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
  }}
  ct_cluster_sync();  // every block's barriers exist before any copy or arrival reaches them

  auto load = [&](int stage, int kt) {{  // (one thread) K tile kt into stage: A's tile, and B's share to the cluster
    const unsigned full = full0 + 8 * stage, a_dst = smem_base + stage * STAGE_BYTES;
    const unsigned b_dst = a_dst + BM * BK + rank * SHARE * BK;
    const int k0 = kt * BK;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" :: "r"(full), "r"(STAGE_BYTES) : "memory");
    asm volatile("{single}" :: "r"(a_dst), "l"(a_map_address), "r"(k0), "r"(m0), "r"(full) : "memory");
    {b_copy}
  }};
  if (threadIdx.x == 0)
    for (int s = 0; s < STAGES && s < tiles; ++s) load(s, kt0 + s);
  for (int i = 0; i < tiles; ++i) {{
    const int s = i % STAGES;
    ct_wait_phase(full0 + 8 * s, (i / STAGES) & 1);
    const unsigned stage = smem_base + s * STAGE_BYTES;
    const unsigned a_tile = stage + group * 64 * BK, b_tile = stage + BM * BK;
{tile_products(p, t)}
    if (i > 0) {{  // tile i - 1's products are done: its stage is free here, and once all blocks say so, refilled
      const int freed = (i - 1) % STAGES;
      if (lane == 0)
        for (int c = 0; c < CLUSTER; ++c) {{
          unsigned remote;
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\\n" : "=r"(remote) : "r"(empty0 + 8 * freed), "r"(c));
          asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\\n" :: "r"(remote) : "memory");
        }}
      if (threadIdx.x == 0 && i - 1 + STAGES < tiles) {{
        ct_wait_phase(empty0 + 8 * freed, ((i - 1) / STAGES) & 1);
        load(freed, kt0 + i - 1 + STAGES);
      }}
    }}
  }}
{all_products_done()}
  ct_cluster_sync();  // no other block's arrival is still on its way here
{split_sums()}{stores}{STORE_LOOP}}}
"""


def tensor_map(pointer, rows, k, row_stride, box_rows, bk):
    """The 128 bytes of a ``CUtensorMap`` describing an int8 operand of ``rows`` rows of ``k`` (``row_stride`` bytes
    apart, ``K`` contiguous) at device address ``pointer``, copied in boxes of ``box_rows x bk``, swizzled as the
    ``wgmma`` descriptors of rows of ``bk`` bytes read them."""
    library = driver()
    if library is None:
        raise BackendError("the tma int8 kernel needs the CUDA driver's cuTensorMapEncodeTiled")
    storage = ctypes.create_string_buffer(2 * TENSOR_MAP_BYTES)
    address = -(-ctypes.addressof(storage) // TENSOR_MAP_BYTES) * TENSOR_MAP_BYTES  # the driver wants it aligned
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    result = library.cuTensorMapEncodeTiled(
        ctypes.c_void_p(address), _UINT8, 2, ctypes.c_void_p(pointer), (u64 * 2)(k, rows), (u64 * 1)(row_stride),
        (u32 * 2)(bk, box_rows), (u32 * 2)(1, 1), _NO_INTERLEAVE, _TENSOR_MAP_SWIZZLE[bk], _L2_PROMOTION_256B,
        _ZERO_FILL)
    if result:
        raise BackendError(f"cuTensorMapEncodeTiled refused an int8 operand of {rows}x{k} (rows {row_stride} bytes "
                           f"apart) at {pointer:#x} in boxes of {box_rows}x{bk}: error {result}")
    return ctypes.string_at(address, TENSOR_MAP_BYTES)


def tensor_maps(product, tiling, a, b):
    """The tensor maps of ``A`` (at ``a``) and ``B`` (at ``b``, read as ``n x k``) the ``tma`` kernel is given."""
    p, t = product, tiling
    itemsize = np.dtype(p.a_dtype).itemsize
    return (tensor_map(a, p.m, p.k, p.a_strides[0] * itemsize, t.bm, t.bk),
            tensor_map(b, p.n, p.k, p.b_strides[1] * itemsize, t.bn // t.cluster, t.bk))
