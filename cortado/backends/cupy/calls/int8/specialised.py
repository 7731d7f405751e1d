"""The warp-specialised form of the int8 GEMM kernel, for sm_90: the ``wgmma`` kernel's products, its tiles
brought into shared memory by the tensor memory accelerator (TMA), which one thread of a warp of its own asks for.

The ``wgmma`` kernel's warps both stage their tiles (a ``cp.async`` and its address arithmetic per 16 bytes) and
multiply them: at 4096^3 on the H100 they issued four times the instructions of cuBLASLt's int8 kernel, and their
tensor cores were busy 42% of the time (``benchmarks/results/h100/experiments/int8_profile/``). Here the
consumer warpgroups (one per 64 rows of the block's tile) only wait for a stage, multiply it and hand it back;
the producer warp's one thread asks the TMA for each tile as soon as its stage is free, up to ``STAGES`` tiles
ahead. A tile is one copy per operand (``cp.async.bulk.tensor``), described by a tensor map the host encodes
(``tensor_maps``), written in the hardware's 128-, 64- or 32-byte swizzle that the ``wgmma`` descriptors name,
and rows and ``K`` beyond the operands filled with zeros.

Each stage has two barriers in shared memory: ``full`` (armed by the producer with the stage's bytes, which the
copies count off as they land) and ``empty`` (each consumer warp arrives once its products of the stage are
done). The consumers keep one tile's products running while they issue the next: after issuing tile ``i`` they
wait for tile ``i - 1``'s, then hand its stage back. The epilogue is the other forms' (the consumers alone
synchronise there, on barrier 1: the producer warp has nothing left to do). A constant ``B`` (a quantized layer's
weights) has its first tiles asked for before the kernel before is waited for.

A block works through output tiles ("jobs", numbered along rows) from its own index in steps of the grid: one
job each, or on a persistent grid (``Tiling.blocks``) many, the producer running on into the next job's tiles
while the consumers store the last. In clusters of two (``Tiling.cluster``) the blocks take neighbouring jobs of
a row, whose tile of ``A`` is the same: each block copies half of it into both (TMA multicast), and a stage is
refilled only once both blocks' consumers are done with it, so each warp hands a stage back to both, lane ``c``
to block ``c``, with a plain arrive: a release at cluster scope there, per warp and tile, made the clustered kernel
twice as slow on the H100 (``benchmarks/results/h100/experiments/README.md``).

A block that stores its results thread by thread stops multiplying while it stores, and a ``wgmma`` fragment's
stores are slow ones: eight rows of 32 bytes an instruction. With ``Tiling.lines`` each consumer warp stores its
rows in whole 128-byte lines instead, through shared memory of its own after the stages (``warpgroup.line_stores``).
With ``Tiling.stored`` the consumers write their tile of results into shared memory beside the stages
(``epilogue.tma_store_all``: in boxes a swizzle wide, so the rows a warp writes at once fall in distinct banks), and
one thread asks the TMA to store it from there (a third tensor map, the result's) while they go on to the next tile;
they write the tile again only once the TMA has read it. The result's rows must be whole 16-byte chunks
(``storable_rows``): the TMA stores whole 16-byte chunks, past a row's end to the next boundary (on the H200 a row
of one int32 result had the 12 bytes after it written; triton-lang/triton#11583).
"""

import ctypes
import functools

import numpy as np

from .....errors import BackendError
from ...launch import WAIT_PRIOR_GRIDS, driver
from .epilogue import aligned_rows, split_sums
from .product import LINE_SCRATCH, PRODUCER_THREADS, SWIZZLE_ALIGNMENT
from .warpgroup import STORED, SWIZZLE_MODES, descriptor_function, tile_products

CONSUMER_SYNC = 'asm volatile("bar.sync 1, %0;\\n" :: "n"(THREADS) : "memory");'  # the consumers alone
MAP_PARAMETERS = ("const __grid_constant__ ct_tensor_map a_map", "const __grid_constant__ ct_tensor_map b_map")
OUT_MAP_PARAMETER = "const __grid_constant__ ct_tensor_map out_map"  # where the TMA stores the results
TENSOR_MAP_BYTES = 128
_UINT8, _NO_INTERLEAVE, _NO_PROMOTION, _L2_PROMOTION_256B, _ZERO_FILL = 0, 0, 0, 3, 0
_TENSOR_MAP_SWIZZLE = {128: 3, 64: 2, 32: 1}  # CUtensorMapSwizzle of rows of 128, 64, 32 bytes

_COPY = ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
         " [%0], [%1, {%2, %3}], [%4];\\n")
# a stage armed with the bytes its copies will count off as they land
_ARM = 'asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" :: "r"(full), "r"(STAGE_BYTES) : "memory");'
# the consumers' tile of results, staged for the TMA's stores after the pipeline's stages
_STAGING = """    const unsigned staging = smem_base + STAGES * STAGE_BYTES;
    unsigned char* const staged_tile = smem + (staging - (unsigned)__cvta_generic_to_shared(smem));
    const unsigned long long out_map_address = (unsigned long long)&out_map;
"""
# a consumer warp's own shared memory for storing whole lines, after the stages
_LINE_SCRATCH = f"""    unsigned char* const line_scratch =
        smem + (smem_base + STAGES * STAGE_BYTES + (threadIdx.x >> 5) * {LINE_SCRATCH} - __cvta_generic_to_shared(smem));
"""
_MULTICAST = ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
              " [%0], [%1, {%2, %3}], [%4], %5;\\n")  # into the same place of every block of the mask


def kernel_text(product, tiling, params, stores):
    """The warp-specialised kernel of ``product`` cut by ``tiling`` (``instruction == "tma"``); its parameters are
    ``params``, the operands' two tensor maps and, where the TMA stores its results, the result's. ``THREADS`` in it
    counts the consumers, which alone run the epilogue."""
    p, t = product, tiling
    # a split's last block returns from its job: never on a persistent grid; clustered blocks come in pairs of a row
    if not (p.vector_a and p.vector_b) or p.k == 0 or t.bm % 64 or t.bm > 256 or t.bn > 256 \
            or t.bk not in SWIZZLE_MODES or t.stages < 2 or (t.blocks and t.splits > 1) or t.cluster not in (1, 2) \
            or (t.cluster > 1 and (t.splits > 1 or -(-p.n // t.bn) % 2 or t.blocks % 2)) \
            or (t.stored and (t.splits > 1 or t.lines or not _stages_hold_boxes(p, t))):
        raise ValueError(f"a warp-specialised kernel cannot take {p} cut as {t}")
    consumers, cluster = t.bm // 64 * 128, t.cluster
    signature = params + list(MAP_PARAMETERS) + ([OUT_MAP_PARAMETER] if t.stored else [])
    dims = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    rank = 'unsigned rank;\n  asm("mov.u32 %0, %%cluster_ctarank;\\n" : "=r"(rank));' if cluster > 1 else ""
    # the blocks meet: the whole cluster (at the end without .aligned: the producer warp's lanes may arrive apart)
    together = ("barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n" if cluster > 1
                else "bar.sync 0;\\n")
    apart = "barrier.cluster.arrive.release;\\nbarrier.cluster.wait.acquire;\\n"
    early, later = _early_copies(p.constant_b)
    a_copy = (f'asm volatile("{_MULTICAST}" :: "r"(a_dst + rank * (BM / CLUSTER) * BK), "l"(a_map_address), "r"(k0), '
              f'"r"(m0 + (int)rank * (BM / CLUSTER)), "r"(full), "h"((unsigned short)((1 << CLUSTER) - 1)) : "memory");'
              if cluster > 1 else
              f'asm volatile("{_COPY}" :: "r"(a_dst), "l"(a_map_address), "r"(k0), "r"(m0), "r"(full) : "memory");')
    return f"""
#define THREADS {consumers}
struct alignas(64) ct_tensor_map {{ unsigned long long words[16]; }};
{descriptor_function(t)}
__device__ __forceinline__ void ct_wait_phase(unsigned barrier, unsigned parity) {{
  unsigned done = 0;
  do {{
    asm volatile("{{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}}\\n"
                 : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
  }} while (!done);
}}
{_release_function(cluster)}
extern "C" __global__ void {dims}__launch_bounds__(THREADS + {PRODUCER_THREADS}, 1) int8_gemm({", ".join(signature)}) {{
  constexpr int M = {p.m}, N = {p.n}, K = {p.k}, BM = {t.bm}, BN = {t.bn}, BK = {t.bk}, STAGES = {t.stages};
  constexpr int KTILES = (K + BK - 1) / BK, STAGE_BYTES = (BM + BN) * BK, WARPS = THREADS / 32, CLUSTER = {cluster};
  constexpr int SPLITS = {t.splits}, PER_SPLIT = (KTILES + SPLITS - 1) / SPLITS, REGS = BN / 2, STORED_BYTES = {t.stored};
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) unsigned long long barriers[2 * STAGES];  // each stage's full, then each one's empty
  const unsigned smem_base = ((unsigned)__cvta_generic_to_shared(smem) + {SWIZZLE_ALIGNMENT - 1}u) & ~{SWIZZLE_ALIGNMENT - 1}u;
  const unsigned full0 = (unsigned)__cvta_generic_to_shared(barriers), empty0 = full0 + 8 * STAGES;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, group = threadIdx.x >> 7;
  // output tiles (jobs) in rows of TILES_N; a block takes every gridDim.x-th, starting at its own (the blocks of a
  // cluster take neighbours in a row, whose A tile is the same: each copies its share of it to all)
  constexpr int TILES_N = (N + BN - 1) / BN, JOBS = TILES_N * ((M + BM - 1) / BM);
  const int kt0 = blockIdx.z * PER_SPLIT, tiles = min(KTILES, kt0 + PER_SPLIT) - kt0;
  {rank}
  if (threadIdx.x == 0) {{
    for (int s = 0; s < STAGES; ++s) {{
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n" :: "r"(full0 + 8 * s) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\\n" :: "r"(empty0 + 8 * s), "r"(WARPS * CLUSTER) : "memory");
    }}
    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
  }}
  asm volatile("{together}" ::: "memory");  // the barriers exist before any copy or arrival reaches them
  if (threadIdx.x >= THREADS) {{  // the producer warp
    if (threadIdx.x == THREADS) {{
      const unsigned long long a_map_address = (unsigned long long)&a_map, b_map_address = (unsigned long long)&b_map;
{early}      {WAIT_PRIOR_GRIDS}
      int it = 0;  // K tiles asked for so far, over every job
      for (int job = blockIdx.x; job < JOBS; job += gridDim.x) {{
        const int m0 = job / TILES_N * BM, n0 = job % TILES_N * BN;
        for (int i = 0; i < tiles; ++i, ++it) {{
          const int s = it % STAGES, k0 = (kt0 + i) * BK;
          if (it >= STAGES) ct_wait_phase(empty0 + 8 * s, ((it / STAGES) - 1) & 1);  // its last tile's products are done
          const unsigned full = full0 + 8 * s, a_dst = smem_base + s * STAGE_BYTES, b_dst = a_dst + BM * BK;
          {later}{_ARM}
          {a_copy}
          {later}asm volatile("{_COPY}" :: "r"(b_dst), "l"(b_map_address), "r"(k0), "r"(n0), "r"(full) : "memory");
        }}
      }}
    }}
  }} else {{
    {WAIT_PRIOR_GRIDS}
{_STAGING if t.stored else _LINE_SCRATCH if t.lines else ""}    int it = 0;  // K tiles multiplied so far, over every job
    for (int job = blockIdx.x; job < JOBS; job += gridDim.x) {{
      const int m0 = job / TILES_N * BM, n0 = job % TILES_N * BN;
      int acc[REGS];
      #pragma unroll
      for (int r = 0; r < REGS; ++r) acc[r] = 0;
      for (int i = 0; i < tiles; ++i, ++it) {{
        const int s = it % STAGES;
        ct_wait_phase(full0 + 8 * s, (it / STAGES) & 1);
        const unsigned stage = smem_base + s * STAGE_BYTES;
        const unsigned a_tile = stage + group * 64 * BK, b_tile = stage + BM * BK;
{_indented(_indented(tile_products(p, t)))}
        if (i > 0) ct_release(empty0 + 8 * ((it - 1) % STAGES));  // the tile before's products are done
      }}
      asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
      #pragma unroll
      for (int r = 0; r < REGS; ++r) asm volatile("" : "+r"(acc[r]) :: "memory");
      ct_release(empty0 + 8 * ((it - 1) % STAGES));  // and the last one's: on to the next job
{_indented(_indented(split_sums(CONSUMER_SYNC) + stores(STORED, CONSUMER_SYNC)))}
    }}
    if (STORED_BYTES && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");  // stored, all
  }}
  {f'asm volatile("{apart}" ::: "memory");  // no arrival or copy is still on its way to a block of the cluster'
   if cluster > 1 else ""}
}}
"""


def _early_copies(constant_b):
    """``(statements, condition)``: a constant ``B``'s (a quantized layer's weights) first tiles asked for before the
    kernel before is waited for (by the producer's thread, its block's first job), and the condition under which
    the producer's loop still arms a stage and copies ``B``'s tile into it; nothing for a ``B`` some kernel writes."""
    if not constant_b:
        return "", ""
    return (f"""      // a constant B's first tiles are asked for before the kernel before is waited for
      const int early = blockIdx.x < JOBS ? min(STAGES, tiles) : 0;
      for (int s = 0; s < early; ++s) {{
        const unsigned full = full0 + 8 * s, b_dst = smem_base + s * STAGE_BYTES + BM * BK;
        {_ARM}
        asm volatile("{_COPY}" :: "r"(b_dst), "l"(b_map_address), "r"((kt0 + s) * BK), "r"(blockIdx.x % TILES_N * BN),
                     "r"(full) : "memory");
      }}
""", "if (it >= early) ")


def _release_function(cluster):
    """``ct_release(empty)``: a stage of this block's is free; each block of the cluster hears it, since each one's
    copies land in the stage too."""
    if cluster == 1:
        return """__device__ __forceinline__ void ct_release(unsigned empty) {  // by a warp's first lane
  if ((threadIdx.x & 31) == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: "r"(empty) : "memory");
}"""
    return f"""__device__ __forceinline__ void ct_release(unsigned empty) {{  // lane c tells block c
  const unsigned lane = threadIdx.x & 31;
  if (lane < {cluster}) {{
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\\n" : "=r"(remote) : "r"(empty), "r"(lane));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\\n" :: "r"(remote) : "memory");
  }}
}}"""


def _stages_hold_boxes(product, tiling):
    """Whether the TMA can store ``tiling``'s results of ``product`` through shared memory: rows of whole swizzles
    (``Tiling.store_width``) staged after the stages, on a boundary of the swizzle's repeat (eight rows), and rows of
    the result it can store (``storable_rows``; packed here: ``tensor_maps`` checks the result's own strides)."""
    t, width = tiling, tiling.store_width
    return (bool(width) and t.stages * (t.bm + t.bn) * t.bk % (8 * width) == 0
            and storable_rows(t.stored, (product.n, 1), product.n))


def storable_rows(size, out_strides, n):
    """Whether the TMA can store rows of ``n`` results of ``size`` bytes each, ``out_strides`` elements apart: rows
    contiguous, their results and the distance between them whole numbers of 16 bytes."""
    return aligned_rows(size, out_strides) and n * size % 16 == 0


def _indented(text):
    return "\n".join("  " + line if line else line for line in text.split("\n"))


@functools.cache
def _encoder():
    """The driver's ``cuTensorMapEncodeTiled``, typed, or None where the driver has none."""
    library = driver()
    encode = getattr(library, "cuTensorMapEncodeTiled", None) if library is not None else None
    if encode is None:
        return None
    u32s, u64s = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64s, u64s, u32s, u32s,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return encode


def available():
    """Whether tensor maps can be encoded here (the driver's ``cuTensorMapEncodeTiled``)."""
    return _encoder() is not None


def tensor_map(pointer, rows, k, row_stride, box_rows, bk, promotion=_L2_PROMOTION_256B):
    """The 128 bytes of a ``CUtensorMap`` describing rows of bytes: ``rows`` rows of ``k`` (``row_stride`` bytes
    apart) at device address ``pointer``, copied in boxes of ``box_rows x bk``, swizzled as rows of ``bk`` bytes are
    (as the ``wgmma`` descriptors of an int8 operand read them)."""
    encode = _encoder()
    if encode is None:
        raise BackendError("the warp-specialised int8 kernel needs the CUDA driver's cuTensorMapEncodeTiled")
    storage = ctypes.create_string_buffer(2 * TENSOR_MAP_BYTES)
    address = -(-ctypes.addressof(storage) // TENSOR_MAP_BYTES) * TENSOR_MAP_BYTES  # the driver wants it aligned
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    result = encode(ctypes.c_void_p(address), _UINT8, 2, ctypes.c_void_p(pointer), (u64 * 2)(k, rows),
                    (u64 * 1)(row_stride), (u32 * 2)(bk, box_rows), (u32 * 2)(1, 1), _NO_INTERLEAVE,
                    _TENSOR_MAP_SWIZZLE[bk], promotion, _ZERO_FILL)
    if result:
        raise BackendError(f"cuTensorMapEncodeTiled refused {rows} rows of {k} bytes ({row_stride} bytes apart) at "
                           f"{pointer:#x} in boxes of {box_rows}x{bk}: error {result}")
    return ctypes.string_at(address, TENSOR_MAP_BYTES)


def tensor_maps(product, tiling, a, b, out, out_strides):
    """The tensor maps the kernel is given after its other parameters: ``A``'s (at ``a``) and ``B``'s (at ``b``, read
    as ``n x k``), then, where the TMA stores its results (``tiling.stored``), the result's (at ``out``, rows
    ``out_strides[0]`` results apart)."""
    p, t = product, tiling
    itemsize = np.dtype(p.a_dtype).itemsize
    maps = (tensor_map(a, p.m, p.k, p.a_strides[0] * itemsize, t.bm // t.cluster, t.bk),
            tensor_map(b, p.n, p.k, p.b_strides[1] * itemsize, t.bn, t.bk))
    if not t.stored:
        return maps
    if not storable_rows(t.stored, out_strides, p.n):
        raise ValueError(f"the TMA cannot store results in rows {out_strides} elements apart")
    return maps + (tensor_map(out, p.m, p.n * t.stored, out_strides[0] * t.stored, t.bm, t.store_width,
                              _NO_PROMOTION),)
