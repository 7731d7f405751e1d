"""CUDA C of an int8 GEMM on the tensor cores, with its epilogue, every size and stride a constant: the
``mma.sync`` form (sm_80 on) here, the ``wgmma`` form (sm_90) in ``warpgroup``, its warp-specialised form fed by
the tensor memory accelerator in ``specialised``; ``gemm_source`` picks by the tiling.

``D[m, n] = epilogue(sum over k of A[m, k] * B[k, n])``, the sum exact in int32. A block computes a
``BM x BN`` tile of ``D``; its warps (``WARPS_M x WARPS_N``) each a ``BM/WARPS_M x BN/WARPS_N`` part
of it, as ``mma.sync.m16n8k32`` products of int8 (or uint8) fragments loaded from shared memory by
``ldmatrix``. The tiles of ``A`` (``BM x BK``) and of ``B`` (``BN x BK``, stored ``K``-fastest as the
instruction reads both) pass through ``STAGES`` buffers in shared memory: while the warps multiply one,
the next ones load, by ``cp.async`` 16 bytes at a time where the operand's ``K`` stride is 1 and its
rows start on 16-byte boundaries (``vector``), else element by element through registers. A row of
shared memory is ``BK + 16`` bytes, so the eight rows an ``ldmatrix`` reads fall in distinct banks.
Out-of-range rows and the ``K`` tail are filled with zeros, so no shape needs to be a multiple of a tile.

With ``SPLITS > 1`` the ``K`` tiles are divided among that many blocks per output tile (a skinny
product has too few tiles to fill the GPU otherwise), which ``epilogue.split_sums`` adds up.
"""

from ...codegen import PRELUDE, Source, kernel_name, storage_type
from . import specialised, warpgroup
from .epilogue import (OPTIONS, SYNC, epilogue_function, parameters, split_sums, staged, store_all, store_functions,
                       tma_store_all)
from .product import PAD, grid, ptx_type
from .staging import load_function, prologue


def gemm_source(product, tiling, body, extras, out_strides):
    """The kernel computing ``body`` (the epilogue, a term over ``param(0)``, the int32 sum of shape ``(m, n)``, and
    ``param(k)`` the ``k``-th operand of ``extras``, ``codegen.Operand`` s of shape ``(m, n)`` with their strides) at
    every ``(m, n)``, stored at element ``out_strides``. Its parameters: ``A, B, *extras, out, partials, counters``,
and for the warp-specialised form the operands' tensor maps (``specialised.tensor_maps``), then, where its results
are stored by the TMA (``tiling.stored``), the result's."""
    generate, options = {"wgmma": (warpgroup.kernel_text, OPTIONS + warpgroup.ARCHITECTURE),
                         "tma": (specialised.kernel_text, OPTIONS + warpgroup.ARCHITECTURE)}.get(
                             tiling.instruction, (_kernel_text, OPTIONS))
    staging = staged(tiling, body.dtype, out_strides) and not tiling.lines

    def stores(fragments, sync=SYNC):
        if tiling.stored:  # through shared memory, by the TMA
            return epilogue_function(body, extras) + tma_store_all(fragments, storage_type(body.dtype),
                                                                   tiling.store_width, sync)
        lines = warpgroup.line_stores(storage_type(body.dtype), out_strides[0]) if tiling.lines else ""
        return store_functions(body, extras, out_strides, staging) + store_all(fragments, staging, sync, lines)

    if tiling.lines and (tiling.instruction != "tma"
                         or not warpgroup.line_storable(body.dtype.itemsize, out_strides, tiling.bn)):
        raise ValueError(f"{tiling} cannot store {body.dtype} results in rows {out_strides} apart in whole lines")

    text = generate(product, tiling, parameters(product, body, extras), stores)
    name = kernel_name(text)
    return Source(name, PRELUDE + text.replace(" int8_gemm(", f" {name}(", 1), grid(product, tiling),
                  (tiling.threads, 1, 1), shared=tiling.shared_bytes, options=options)


# every pair of sums a thread holds, to ``store(s0, s1, m, n)``
_STORED = """    #pragma unroll
    for (int i = 0; i < MT; ++i)
      #pragma unroll
      for (int j = 0; j < NT; ++j)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
          store(acc[4 * (i * NT + j) + 2 * h], acc[4 * (i * NT + j) + 2 * h + 1],
                m0 + warp_m * WTM + i * 16 + (lane >> 2) + h * 8, n0 + warp_n * WTN + j * 8 + (lane & 3) * 2);
"""


def _kernel_text(product, tiling, params, stores):
    """The ``mma.sync`` kernel."""
    p, t = product, tiling
    mma = f"mma.sync.aligned.m16n8k32.row.col.s32.{ptx_type(p.a_dtype)}.{ptx_type(p.b_dtype)}.s32"
    wtm, wtn = t.bm // t.warps_m, t.bn // t.warps_n
    return f"""
#define THREADS {t.threads}
extern "C" __global__ void __launch_bounds__({t.threads}) int8_gemm({", ".join(params)}) {{
  constexpr int M = {p.m}, N = {p.n}, K = {p.k}, BM = {t.bm}, BN = {t.bn}, BK = {t.bk}, PITCH = BK + {PAD};
  constexpr int STAGES = {t.stages}, SPLITS = {t.splits}, WTM = {wtm}, WTN = {wtn}, MT = WTM / 16, NT = WTN / 8;
  constexpr int KTILES = (K + BK - 1) / BK, PER_SPLIT = (KTILES + SPLITS - 1) / SPLITS;
  constexpr int STAGE_BYTES = (BM + BN) * PITCH;
  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned smem_base = (unsigned)__cvta_generic_to_shared(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp % {t.warps_m}, warp_n = warp / {t.warps_m};
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int kt0 = blockIdx.z * PER_SPLIT, tiles = min(KTILES, kt0 + PER_SPLIT) - kt0;
  constexpr int REGS = MT * NT * 4;  // fragment (i, j) of the warp's part in acc[4 (i NT + j) ..]
  int acc[REGS];
  #pragma unroll
  for (int r = 0; r < REGS; ++r) acc[r] = 0;

{load_function(p, t)}
{prologue(p, "STAGES - 1")}  for (int i = 0; i < tiles; ++i) {{
    asm volatile("cp.async.wait_group %0;\\n" :: "n"(STAGES - 2));
    __syncthreads();
    if (i + STAGES - 1 < tiles) load((i + STAGES - 1) % STAGES, kt0 + i + STAGES - 1);
    asm volatile("cp.async.commit_group;\\n" ::);
    const unsigned a_tile = smem_base + (i % STAGES) * STAGE_BYTES, b_tile = a_tile + BM * PITCH;
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 32) {{
      unsigned af[MT][4], bf[NT][2];
      #pragma unroll
      for (int i2 = 0; i2 < MT; ++i2) {{
        const unsigned at = a_tile + (warp_m * WTM + i2 * 16 + (lane & 15)) * PITCH + kk + (lane >> 4) * 16;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];\\n"
                     : "=r"(af[i2][0]), "=r"(af[i2][1]), "=r"(af[i2][2]), "=r"(af[i2][3]) : "r"(at));
      }}
      #pragma unroll
      for (int j = 0; j + 1 < NT; j += 2) {{
        const unsigned at = b_tile + (warp_n * WTN + j * 8 + (lane & 7) + ((lane >> 4) & 1) * 8) * PITCH + kk
                            + ((lane >> 3) & 1) * 16;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];\\n"
                     : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1]) : "r"(at));
      }}
      if (NT % 2) {{
        const unsigned at = b_tile + (warp_n * WTN + (NT - 1) * 8 + (lane & 7)) * PITCH + kk + ((lane >> 3) & 1) * 16;
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{%0, %1}}, [%2];\\n"
                     : "=r"(bf[NT - 1][0]), "=r"(bf[NT - 1][1]) : "r"(at));
      }}
      #pragma unroll
      for (int i2 = 0; i2 < MT; ++i2)
        #pragma unroll
        for (int j = 0; j < NT; ++j)
          asm volatile("{mma} {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};\\n"
                       : "+r"(acc[4 * (i2 * NT + j)]), "+r"(acc[4 * (i2 * NT + j) + 1]),
                         "+r"(acc[4 * (i2 * NT + j) + 2]), "+r"(acc[4 * (i2 * NT + j) + 3])
                       : "r"(af[i2][0]), "r"(af[i2][1]), "r"(af[i2][2]), "r"(af[i2][3]), "r"(bf[j][0]), "r"(bf[j][1]));
    }}
  }}
  asm volatile("cp.async.wait_group 0;\\n" ::);

{split_sums()}{stores(_STORED)}}}
"""
