"""How both int8 GEMM kernels bring a ``K`` tile of ``A`` and of ``B`` into a stage of shared memory: ``A``'s
``BM`` rows, then ``B``'s ``BN`` (``B`` as ``n x k``), each row ``PITCH`` bytes apart and ``K`` across it. An
operand read 16 bytes at a time (``K`` contiguous, rows 16-byte aligned) arrives by ``cp.async``, the rows and
``K`` beyond the product zero-filled; others element by element through registers, consecutive threads along
whichever axis is contiguous in memory. Where a 16-byte chunk lands in its row is the kernel's to say (after
``PAD`` bytes of padding for ``ldmatrix``, swizzled for ``wgmma``).
"""

from ...codegen import storage_type
from ...launch import WAIT_PRIOR_GRIDS

PLAIN_CHUNK = "dst + r * PITCH + kc"  # chunk kc (a byte offset) of row r, in place


def load_function(product, tiling, chunk=PLAIN_CHUNK):
    """C++ statements defining ``load(stage, kt)``, which stages ``K`` tile ``kt``: ``chunk`` is the shared
    address of the 16 bytes at offset ``kc`` of row ``r`` of a tile starting at ``dst``. Inside a kernel that
    defines ``BM``, ``BK``, ``PITCH``, ``STAGE_BYTES``, ``THREADS``, ``K``, ``smem``, ``smem_base``, ``m0``, ``n0``."""
    p, t = product, tiling
    b_rows_strides = (p.b_strides[1], p.b_strides[0])  # B staged as (n, k)
    a_load = _rows("qa", p.m, p.a_dtype, p.a_strides, p.vector_a, t.bm, chunk)
    b_load = _rows("qb", p.n, p.b_dtype, b_rows_strides, p.vector_b, t.bn, chunk)
    return f"""  auto load_a = [&](int stage, int kt) {{
    const int k0 = kt * BK;
    const unsigned dst = smem_base + stage * STAGE_BYTES;
    const int row0 = m0;
{a_load}  }};
  auto load_b = [&](int stage, int kt) {{
    const int k0 = kt * BK;
    const unsigned dst = smem_base + stage * STAGE_BYTES + BM * PITCH;
    const int row0 = n0;
{b_load}  }};
  auto load = [&](int stage, int kt) {{ load_a(stage, kt); load_b(stage, kt); }};
"""


def prologue(product, ahead):
    """C++ statements that wait for the kernel before (``ct_wait_prior_grids``) and start the pipeline: the first
    ``ahead`` tiles staged, one ``cp.async`` group each. A constant operand's tiles are asked for before the wait,
    so they arrive while the kernel before ends and its writes are flushed: on the H100 that took 3136x128x64 and
    784x256x128 products with constant weights from 2.05 to 1.92 us and from 2.17 to 2.00. Only constants: a
    value some kernel writes may be the kernel before's result, not yet visible. Inside a kernel that defines
    ``load_a``, ``load_b`` (``load_function``), ``tiles`` and ``kt0``."""
    operands = (("a", product.constant_a), ("b", product.constant_b))
    early = " ".join(f"load_{name}(s, kt0 + s);" for name, constant in operands if constant)
    late = " ".join(f"load_{name}(s, kt0 + s);" for name, constant in operands if not constant)
    before = (f"""  #pragma unroll
  for (int s = 0; s < {ahead}; ++s)
    if (s < tiles) {{ {early} }}
""" if early else "")
    return before + f"""  {WAIT_PRIOR_GRIDS}
  #pragma unroll
  for (int s = 0; s < {ahead}; ++s) {{
    if (s < tiles) {{ {late} }}
    asm volatile("cp.async.commit_group;\\n" ::);
  }}
"""


def _rows(operand, rows, dtype, strides, vector, tile_rows, chunk):
    """The statements staging a ``tile_rows x BK`` tile of ``operand`` (``rows`` long, ``K`` across) at ``dst``
    from ``row0`` and ``k0``."""
    row_stride, k_stride = strides
    if vector:
        return f"""    for (int c = threadIdx.x; c < {tile_rows} * (BK / 16); c += THREADS) {{
      const int r = c / (BK / 16), kc = (c % (BK / 16)) * 16;
      const int gr = row0 + r, gk = k0 + kc;
      const int bytes = gr < {rows} ? max(0, min(16, K - gk)) : 0;
      const {storage_type(dtype)}* src = bytes > 0 ? {operand} + (size_t)gr * {row_stride} + gk : {operand};
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"({chunk}), "l"(src), "r"(bytes));
    }}
"""
    if chunk != PLAIN_CHUNK:
        raise ValueError("only rows in place can be staged element by element")
    along_k = k_stride == 1 or (row_stride != 1 and abs(k_stride) <= abs(row_stride))
    r, kk = ("e / BK", "e % BK") if along_k else (f"e % {tile_rows}", f"e / {tile_rows}")
    return f"""    for (int e = threadIdx.x; e < {tile_rows} * BK; e += THREADS) {{
      const int r = {r}, kk = {kk};
      const int gr = row0 + r, gk = k0 + kk;
      const {storage_type(dtype)} v =
          (gr < {rows} && gk < K) ? {operand}[(size_t)gr * {row_stride} + (size_t)gk * {k_stride}] : 0;
      smem[(dst - smem_base) + r * PITCH + kk] = (unsigned char)v;
    }}
"""
