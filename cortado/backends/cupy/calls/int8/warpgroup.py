"""The ``wgmma`` form of the int8 GEMM kernel, for sm_90: each warpgroup (four warps) multiplies a 64-row slab
of the block's tile by all of its ``BN`` columns, one ``wgmma.mma_async`` per 32 of ``K``, reading both operands
straight from shared memory (no ``ldmatrix``, no fragments in registers) at twice ``mma.sync``'s rate.

``wgmma`` reads int8 only ``K``-major, as the tiles are staged: a row of ``BK`` bytes (128, 64 or 32) per row of
``A`` and of ``B`` (``B`` as ``n x k``), its 16-byte chunks swizzled (chunk ``q`` of row ``r`` stored at
``q ^ (r * BK / 128 mod BK / 16)``, the hardware's 128-, 64- or 32-byte swizzle) so that the eight rows a
tensor core reads at once lie in distinct banks. A shared-memory descriptor names a tile: its address, the
stride between groups of eight rows (``8 * BK`` bytes) and the swizzle; the ``K`` steps inside a row are
the same descriptor 32 bytes further on. The tiles arrive by ``cp.async`` through ``STAGES`` buffers, as in the
``mma.sync`` kernel; since ``wgmma`` reads shared memory through the async proxy, each thread fences its copies
to it (``fence.proxy.async``) before the barrier that hands a stage to the tensor cores. The products of one
tile still run while the next tile's are issued (a warpgroup waits for all but its last batch), so a stage is
refilled two tiles after it was read, ``STAGES - 2`` tiles ahead: at least 3 stages. Rows and ``K`` beyond
the product are zero-filled. Both operands must be vector-readable (``K`` contiguous, rows 16-byte aligned).
A ``K`` split among blocks is added up as in the ``mma.sync`` kernel.

The accumulators of a ``m64nBNk32`` product lie as ``mma.sync``'s do, warp ``w`` of the group holding rows
``16 w .. 16 w + 15``: ``BN / 2`` int32 a thread, which the epilogue then stores two at a time.
"""

from .epilogue import aligned_rows, split_sums
from .product import SWIZZLE_ALIGNMENT, ptx_type
from .staging import load_function, prologue

# wgmma is in sm_90a's instruction set, not sm_90's; NVRTC builds for sm_90a though CuPy names sm_90 after it
ARCHITECTURE = ("-arch=sm_90a",)
SWIZZLE_MODES = {128: 1, 64: 2, 32: 3}  # a descriptor's bits 62-63: 128-, 64-, 32-byte swizzle
# chunk kc / 16 of row r at chunk (kc / 16) ^ (r * BK / 128 mod CHUNKS): B's rows start 1024-aligned, after A's
SWIZZLED_CHUNK = "dst + r * BK + (((kc >> 4) ^ ((r * BK >> 7) & (CHUNKS - 1))) << 4)"


def _wgmma(product, bn):
    """The inline-PTX statement of one ``m64n{bn}k32`` product accumulating into ``acc`` from descriptors
    ``da`` and ``db``."""
    registers = bn // 2
    outputs = ", ".join(f"%{r}" for r in range(registers))
    instruction = f"wgmma.mma_async.sync.aligned.m64n{bn}k32.s32.{ptx_type(product.a_dtype)}.{ptx_type(product.b_dtype)}"
    bindings = ", ".join(f'"+r"(acc[{r}])' for r in range(registers))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{registers + 2}, 0;\\n'
            f'{instruction} {{{outputs}}}, %{registers}, %{registers + 1}, p;\\n}}\\n"\n'
            f'                   : {bindings}\n                   : "l"(da), "l"(db), "r"(1));')


# every pair of sums a thread holds, to ``store(s0, s1, m, n)``
STORED = """    #pragma unroll
    for (int j = 0; j < BN / 8; ++j)
      #pragma unroll
      for (int h = 0; h < 2; ++h)
        store(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], m0 + group * 64 + warp * 16 + (lane >> 2) + h * 8,
              n0 + j * 8 + (lane & 3) * 2);
"""


def line_storable(size, out_strides, bn):
    """Whether ``line_stores`` can store a tile ``bn`` results of ``size`` bytes wide into rows ``out_strides``
    elements apart: rows contiguous and 16-byte aligned, the tile's rows whole 128-byte lines."""
    return aligned_rows(size, out_strides) and bn * size % 128 == 0


def line_stores(out_type, row):
    """C++ statements storing a warp's 16 rows of results (``epilogue`` of its sums) in whole 128-byte lines: for each
    128 bytes of columns, the warp writes its results into its ``LINE_SCRATCH`` bytes of shared memory at
    ``line_scratch``, then reads them back 16 bytes a thread, eight threads a row, and stores four whole lines an
    instruction. A fragment's own stores span 8 rows an instruction, eight lines (for int32 sums, 32 bytes of each):
    on the H200 a 128 KB tile of int32 sums took a block about 4.5 us to store so. A row's 16-byte chunks are
    swizzled by its index bit-reversed, so that neither a fragment's pairs (the two chunks of a pair of int32 sums
    land in a swizzle's pair of places) nor a row's 16-byte reads share a bank. For a tile wholly inside the result,
    in rows ``row`` results apart (``line_storable``), at an ``out0`` 16-byte aligned."""
    return f"""    {{
      constexpr int LINE = 128 / sizeof({out_type});  // results in a line
      const int rows = m0 + group * 64 + warp * 16;  // the warp's first row
      auto place = [&](const int r, const int chunk) {{  // of a row's chunk in the warp's shared memory
        return line_scratch + r * 128 + ((chunk ^ (((r & 1) << 2) | (r & 2) | ((r >> 2) & 1))) << 4);
      }};
      #pragma unroll
      for (int c = 0; c < BN / LINE; ++c) {{
        #pragma unroll
        for (int jj = 0; jj < LINE / 8; ++jj)  // a fixed count, so the sums stay in registers
          #pragma unroll
          for (int h = 0; h < 2; ++h) {{
            const int j = c * LINE / 8 + jj, r = (lane >> 2) + h * 8, n = n0 + j * 8 + (lane & 3) * 2;
            const int byte = (jj * 8 + (lane & 3) * 2) * (int)sizeof({out_type});
            const int s0 = acc[4 * j + 2 * h], s1 = acc[4 * j + 2 * h + 1];
            *reinterpret_cast<ct_vec<{out_type}, 2>*>(place(r, byte >> 4) + (byte & 15)) =
                ct_vec<{out_type}, 2>{{{{epilogue(s0, rows + r, n), epilogue(s1, rows + r, n + 1)}}}};
          }}
        __syncwarp();
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
          const int r = i * 4 + (lane >> 3), q = lane & 7;
          *reinterpret_cast<uint4*>(out0 + (size_t)(rows + r) * {row} + n0 + c * LINE + q * (16 / sizeof({out_type}))) =
              *reinterpret_cast<const uint4*>(place(r, q));
        }}
        __syncwarp();
      }}
    }}
"""


def kernel_text(product, tiling, params, stores):
    """The ``wgmma`` kernel of ``product`` cut by ``tiling`` (``instruction == "wgmma"``)."""
    p, t = product, tiling
    if not (p.vector_a and p.vector_b) or t.bm % 64 or t.bk not in SWIZZLE_MODES or t.stages < 3:
        raise ValueError(f"a wgmma kernel cannot take {p} cut as {t}")
    return f"""
#define THREADS {t.threads}
{descriptor_function(t)}
extern "C" __global__ void __launch_bounds__(THREADS, 1) int8_gemm({", ".join(params)}) {{
  constexpr int M = {p.m}, N = {p.n}, K = {p.k}, BM = {t.bm}, BN = {t.bn}, BK = {t.bk}, STAGES = {t.stages};
  constexpr int KTILES = (K + BK - 1) / BK, CHUNKS = BK / 16, PITCH = BK, STAGE_BYTES = (BM + BN) * BK;
  constexpr int SPLITS = {t.splits}, PER_SPLIT = (KTILES + SPLITS - 1) / SPLITS, REGS = BN / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned smem_base = ((unsigned)__cvta_generic_to_shared(smem) + {SWIZZLE_ALIGNMENT - 1}u) & ~{SWIZZLE_ALIGNMENT - 1}u;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, group = threadIdx.x >> 7;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int kt0 = blockIdx.z * PER_SPLIT, tiles = min(KTILES, kt0 + PER_SPLIT) - kt0;
  int acc[REGS];
  #pragma unroll
  for (int r = 0; r < REGS; ++r) acc[r] = 0;

{load_function(p, t, SWIZZLED_CHUNK)}
{prologue(p, "STAGES - 2")}  for (int i = 0; i < tiles; ++i) {{
    asm volatile("cp.async.wait_group %0;\\n" :: "n"(STAGES - 3));
    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
    __syncthreads();  // tile i is in place; every warpgroup's products of tile i - 2 are done
    if (i + STAGES - 2 < tiles) load((i + STAGES - 2) % STAGES, kt0 + i + STAGES - 2);
    asm volatile("cp.async.commit_group;\\n" ::);
    const unsigned stage = smem_base + (i % STAGES) * STAGE_BYTES;
    const unsigned a_tile = stage + group * 64 * BK, b_tile = stage + BM * BK;
{tile_products(p, t)}
  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
  #pragma unroll
  for (int r = 0; r < REGS; ++r) asm volatile("" : "+r"(acc[r]) :: "memory");
  asm volatile("cp.async.wait_group 0;\\n" ::);
{split_sums()}{stores(STORED)}}}
"""


def descriptor_function(tiling):
    """``ct_descriptor(address)``: the shared-memory descriptor of a tile staged ``K``-major at ``address``, swizzled
    as rows of ``tiling.bk`` bytes are."""
    t = tiling
    return f"""__device__ __forceinline__ unsigned long long ct_descriptor(unsigned address) {{
  return (unsigned long long)((address & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)({8 * t.bk} >> 4) << 32)
         | ((unsigned long long){SWIZZLE_MODES[t.bk]} << 62);
}}"""


def tile_products(product, tiling):
    """The statements issuing one staged tile's products (``a_tile``, ``b_tile``: its shared addresses) into ``acc``,
    then waiting for all but these: the previous tile's products are done after them, this tile's run on."""
    return f"""    #pragma unroll
    for (int r = 0; r < REGS; ++r) asm volatile("" : "+r"(acc[r]) :: "memory");
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 32) {{
      const unsigned long long da = ct_descriptor(a_tile + kk), db = ct_descriptor(b_tile + kk);
      {_wgmma(product, tiling.bn)}
    }}
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
    #pragma unroll
    for (int r = 0; r < REGS; ++r) asm volatile("" : "+r"(acc[r]) :: "memory");"""
