"""The end both forms of int8 GEMM kernel share: their parameters, the sums of a split ``K`` added up, the
epilogue as a C++ lambda of a sum and its ``(m, n)``, and a store of two neighbouring sums, which every
accumulator fragment of ``mma.sync`` and ``wgmma`` holds (columns ``n`` and ``n + 1`` of one row): one store
of both where the result's rows are contiguous and aligned, so a warp writes whole 32-byte sectors.

The epilogue is a body of elementwise terms over ``param(0)``, the int32 sum, and the extra operands
``param(1), ...`` (a row of scales, a bias, another matrix), read at ``(m, n)`` through their strides. It is
compiled with ``--fmad=false``: a ``x * s + b`` is rounded twice, as NumPy rounds it, so a requantized result
equals the CPU's bit for bit.

With ``SPLITS > 1`` the ``K`` tiles of an output tile are divided among that many blocks: each writes its
sums to a partial in the workspace, and the last of them to finish (counted by an atomic counter per tile,
which it resets for the next call) adds the others' partials to its own and applies the epilogue. Integer
sums are exact, so the order they are added in changes nothing.
"""

import numpy as np

from ...codegen import Operand, _Dim, _Writer, storage_type

OPTIONS = ("--fmad=false",)
STAGING_PAD = 16  # bytes after each row of a tile staged for its stores
SYNC = "__syncthreads();"  # where the threads holding the sums meet: the whole block, unless a kernel says otherwise


def parameters(product, body, extras):
    """The kernel's parameters: ``A, B, *extras, out, partials, counters``."""
    params = [f"const {storage_type(product.a_dtype)}* __restrict__ qa",
              f"const {storage_type(product.b_dtype)}* __restrict__ qb"]
    params += [f"const {storage_type(o.dtype)}* __restrict__ in{k + 1}" for k, o in enumerate(extras)]
    params += [f"{storage_type(body.dtype)}* __restrict__ out0", "int* __restrict__ partials",
               "unsigned int* __restrict__ counters"]
    return params


def aligned_rows(size, out_strides):
    """Whether rows of results ``size`` bytes each, ``out_strides`` elements apart, are contiguous and start 16 bytes
    apart (at an aligned result)."""
    row, column = out_strides
    return column == 1 and row * size % 16 == 0


def staged(tiling, dtype, out_strides):
    """Whether a tile wholly inside the result is staged in shared memory and stored from there 16 bytes a
    thread: results narrower than 4 bytes, in rows 16-byte aligned, the tile's rows whole chunks of 16 bytes, the
    staged tile no larger than the pipeline's buffers it reuses. A pair of int8 results is 2 bytes, so a warp's
    direct stores wrote 8 bytes into each of 8 sectors: on the H100 storing a 2048x1024x1024 product's sums as int8
    took 1.7 us longer than storing them as int32, four times the bytes. Not in a persistent kernel, whose
    buffers fill with the next tile's operands while it stores."""
    size = np.dtype(dtype).itemsize
    pipeline = tiling.stages * (tiling.bm + tiling.bn) * tiling.bk
    return (not tiling.blocks and size < 4 and aligned_rows(size, out_strides) and tiling.bn * size % 16 == 0
            and tiling.bm * (tiling.bn * size + STAGING_PAD) <= pipeline)


def epilogue_function(body, extras):
    """C++ statements defining ``epilogue(acc, m, n)``, the result's element of sum ``acc`` at ``(m, n)``."""
    m, n = body.shape
    space = (_Dim(m, "m", 1, m), _Dim(n, "n", 1, n))
    writer = _Writer(space, [Operand(body.shape, np.dtype(np.int32), (0, 0)), *extras], "e", loads={0: "acc"})
    value = writer.value(body)
    lines = "\n".join("    " + line for line in writer.lines)
    return f"""  auto epilogue = [&](const int acc, const int m, const int n) {{
{lines}
    return ct_store<{storage_type(body.dtype)}>({value});
  }};
"""


def store_functions(body, extras, out_strides, staging):
    """C++ statements defining ``epilogue(acc, m, n)`` (``epilogue_function``) and ``store_pair(s0, s1, m, n)``,
    which stores the results of sums ``s0`` at ``(m, n)`` and ``s1`` at ``(m, n + 1)`` (``n`` even), those inside
    ``M x N``, and ``store_inside``, the same for a pair known to be inside and ``paired``; with ``staging``
    (``staged``'s answer), ``stage_pair``, the same into the tile staged in shared memory, and ``store_staged()``,
    which stores that tile. Inside a kernel that defines ``M``, ``N``, ``BM``, ``BN``, ``m0``, ``n0``, ``THREADS``
    and ``smem``, the pipeline's buffers, 16-byte aligned."""
    out_type = storage_type(body.dtype)
    row, column = out_strides
    pairs = "true" if column == 1 and row % 2 == 0 else "false"
    # both results in one store where the rows are contiguous and the pointer is aligned for two
    return epilogue_function(body, extras) + f"""\
  const bool paired = {pairs} && (size_t)out0 % sizeof(ct_vec<{out_type}, 2>) == 0;
  auto store_pair = [&](const int s0, const int s1, const int m, const int n) {{
    if (m >= M) return;
    if (paired && n + 1 < N) {{
      *reinterpret_cast<ct_vec<{out_type}, 2>*>(out0 + (size_t)m * {row} + n) =
          ct_vec<{out_type}, 2>{{{{epilogue(s0, m, n), epilogue(s1, m, n + 1)}}}};
      return;
    }}
    if (n < N) out0[(size_t)m * {row} + (size_t)n * {column}] = epilogue(s0, m, n);
    if (n + 1 < N) out0[(size_t)m * {row} + (size_t)(n + 1) * {column}] = epilogue(s1, m, n + 1);
  }};
  auto store_inside = [&](const int s0, const int s1, const int m, const int n) {{  // paired, inside M x N
    *reinterpret_cast<ct_vec<{out_type}, 2>*>(out0 + (size_t)m * {row} + n) =
        ct_vec<{out_type}, 2>{{{{epilogue(s0, m, n), epilogue(s1, m, n + 1)}}}};
  }};
""" + (_staging_functions(out_type, row) if staging else "")


def _staging_functions(out_type, row):
    """``stage_pair`` and ``store_staged``: a row of the staged tile is ``STAGING_PAD`` bytes longer than the
    tile's, so the eight rows a warp's pairs fall in start in distinct banks, and 16-byte chunks stay aligned."""
    return f"""  const bool staged = (size_t)out0 % 16 == 0;
  constexpr int TILE_PITCH = BN * sizeof({out_type}) + {STAGING_PAD}, ROW_CHUNKS = BN * sizeof({out_type}) / 16;
  auto stage_pair = [&](const int s0, const int s1, const int m, const int n) {{
    *reinterpret_cast<ct_vec<{out_type}, 2>*>(smem + (m - m0) * TILE_PITCH + (n - n0) * sizeof({out_type})) =
        ct_vec<{out_type}, 2>{{{{epilogue(s0, m, n), epilogue(s1, m, n + 1)}}}};
  }};
  auto store_staged = [&]() {{
    #pragma unroll
    for (int i = 0; i < (BM * ROW_CHUNKS + THREADS - 1) / THREADS; ++i) {{
      const int c = i * THREADS + threadIdx.x, r = c / ROW_CHUNKS, q = c % ROW_CHUNKS;
      if ((BM * ROW_CHUNKS) % THREADS == 0 || c < BM * ROW_CHUNKS)
        *reinterpret_cast<uint4*>(out0 + (size_t)(m0 + r) * {row} + n0 + q * (16 / sizeof({out_type}))) =
            *reinterpret_cast<const uint4*>(smem + r * TILE_PITCH + q * 16);
    }}
  }};
"""


def store_all(fragments, staging, sync=SYNC, lines=""):
    """C++ statements storing every pair of sums a thread holds: ``fragments`` calls ``store(s0, s1, m, n)`` for
    each. A tile wholly inside the result, stored in pairs, is stored without a bound check: with one per pair,
    each pair was a branch of its own, and every pair waited for its epilogue operands' loads in turn (on the H100
    that made requantizing a 2048x1024x1024 product's sums 5 us slower than storing them); with ``staging``, it
    passes through shared memory, once every warp is done with the pipeline's buffers; with ``lines``
    (``warpgroup.line_stores``'s statements), in whole lines where the result is 16-byte aligned. Inside a kernel
    that defines ``BM``, ``BN``, ``m0`` and ``n0``, after ``store_functions``'s statements."""
    inside = """    store_all(store_inside);"""
    if lines:
        inside = f"""    if ((size_t)out0 % 16 == 0)
{lines}    else
""" + inside
    if staging:
        inside = f"""    if (staged) {{
      {sync}
      store_all(stage_pair);
      {sync}
      store_staged();
    }} else
""" + inside
    return f"""  auto store_all = [&](auto store) {{
{fragments}  }};
  if (paired && m0 + BM <= M && n0 + BN <= N) {{
{inside}
  }} else
    store_all(store_pair);
"""


def tma_store_all(fragments, out_type, width, sync):
    """C++ statements that write every pair of results a thread holds into the block's tile of results staged in
    shared memory (at ``staging``, generic pointer ``staged_tile``: boxes of ``width`` bytes a row, each ``BM``
    rows, swizzled as the TMA's mode of that width lays them out, so the eight rows a warp writes at once fall in
    distinct banks), then have the first thread ask the TMA to store the tile (``out_map``), which it does while
    the block goes on to its next tile. The tile is written only once the store before has read it. Results beyond
    ``M x N`` are left out (the rows' ``N`` results are whole 16-byte chunks: a pair is all inside or all out); the TMA
    stores nothing beyond the result's bounds. Inside a kernel that defines ``M``,
    ``N``, ``BM``, ``BN``, ``STORED_BYTES`` (bytes a result), ``m0``, ``n0`` and ``out_map_address``, after
    ``epilogue_function``'s statements, its threads ``0 .. THREADS - 1`` meeting at ``sync``."""
    return f"""  {{
    constexpr int SWIZZLE = {width}, BOX = SWIZZLE / STORED_BYTES;
    auto at = [&](const int m, const int n) {{  // the staged place of result (m, n)
      const unsigned offset = (m - m0) * SWIZZLE + (n - n0) % BOX * STORED_BYTES;
      return staged_tile + (n - n0) / BOX * (BM * SWIZZLE) + (offset ^ (((offset >> 7) & (SWIZZLE / 16 - 1)) << 4));
    }};
    auto stage = [&](const int s0, const int s1, const int m, const int n) {{
      if (m >= M || n >= N) return;
      *reinterpret_cast<ct_vec<{out_type}, 2>*>(at(m, n)) =
          ct_vec<{out_type}, 2>{{{{epilogue(s0, m, n), epilogue(s1, m, n + 1)}}}};
    }};
    auto store_all = [&](auto store) {{
{fragments}    }};
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");  // the last store read it
    {sync}
    store_all(stage);
    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // the staged tile, visible to the TMA
    {sync}
    if (threadIdx.x == 0) {{
      #pragma unroll
      for (int b = 0; b < BN / BOX; ++b)
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {{%1, %2}}], [%3];\\n"
                     :: "l"(out_map_address), "r"((n0 + b * BOX) * STORED_BYTES), "r"(m0), "r"(staging + b * BM * SWIZZLE)
                     : "memory");
      asm volatile("cp.async.bulk.commit_group;\\n" ::: "memory");
    }}
  }}
"""


def split_sums(sync=SYNC):
    """C++ statements that, with ``SPLITS > 1``, leave in the last block to finish of each output tile the sums of
    every split in ``acc[REGS]`` (the others return). Inside a kernel that defines ``SPLITS``, ``REGS`` and
    ``THREADS``, whose threads ``0 .. THREADS - 1`` hold the sums and meet at ``sync``."""
    return f"""  if (SPLITS > 1) {{  // the last block of this tile to finish adds every split's sums
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    int* slot = partials + (size_t)tile * SPLITS * REGS * THREADS;
    #pragma unroll
    for (int r = 0; r < REGS; ++r) slot[(blockIdx.z * REGS + r) * THREADS + threadIdx.x] = acc[r];
    __threadfence();
    {sync}
    __shared__ int last;
    if (threadIdx.x == 0) {{
      last = atomicAdd(&counters[tile], 1u) == SPLITS - 1;
      if (last) counters[tile] = 0;
    }}
    {sync}
    if (!last) return;
    __threadfence();
    #pragma unroll
    for (int r = 0; r < REGS; ++r) {{
      int sum = 0;
      for (int s = 0; s < SPLITS; ++s) sum += __ldcg(&slot[(s * REGS + r) * THREADS + threadIdx.x]);
      acc[r] = sum;
    }}
  }}
"""
