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

from ..codegen import Operand, _Dim, _Writer, storage_type

OPTIONS = ("--fmad=false",)


def parameters(product, body, extras):
    """The kernel's parameters: ``A, B, *extras, out, partials, counters``."""
    params = [f"const {storage_type(product.a_dtype)}* __restrict__ qa",
              f"const {storage_type(product.b_dtype)}* __restrict__ qb"]
    params += [f"const {storage_type(o.dtype)}* __restrict__ in{k + 1}" for k, o in enumerate(extras)]
    params += [f"{storage_type(body.dtype)}* __restrict__ out0", "int* __restrict__ partials",
               "unsigned int* __restrict__ counters"]
    return params


def store_functions(body, extras, out_strides):
    """C++ statements defining ``epilogue(acc, m, n)``, the result's element of sum ``acc`` at ``(m, n)``, and
    ``store_pair(s0, s1, m, n)``, which stores the results of sums ``s0`` at ``(m, n)`` and ``s1`` at ``(m, n + 1)``
    (``n`` even), those inside ``M x N``, and ``store_inside``, the same for a pair known to be inside and
    ``paired``. Inside a kernel that defines ``M`` and ``N``."""
    m, n = body.shape
    space = (_Dim(m, "m", 1, m), _Dim(n, "n", 1, n))
    writer = _Writer(space, [Operand(body.shape, np.dtype(np.int32), (0, 0)), *extras], "e", loads={0: "acc"})
    value = writer.value(body)
    out_type = storage_type(body.dtype)
    row, column = out_strides
    pairs = "true" if column == 1 and row % 2 == 0 else "false"
    lines = "\n".join("    " + line for line in writer.lines)
    return f"""  auto epilogue = [&](const int acc, const int m, const int n) {{
{lines}
    return ct_store<{out_type}>({value});
  }};
  // both results in one store where the rows are contiguous and the pointer is aligned for two
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
"""


def store_all(fragments):
    """C++ statements storing every pair of sums a thread holds: ``fragments`` calls ``store(s0, s1, m, n)`` for
    each. A tile wholly inside the result, stored in pairs, is stored without a bound check: with one per pair,
    each pair was a branch of its own, and every pair waited for its epilogue operands' loads in turn (on the H100
    that made requantizing a 2048x1024x1024 product's sums 5 us slower than storing them). Inside a kernel that
    defines ``BM``, ``BN``, ``m0`` and ``n0``, after ``store_functions``'s statements."""
    return f"""  auto store_all = [&](auto store) {{
{fragments}  }};
  if (paired && m0 + BM <= M && n0 + BN <= N)
    store_all(store_inside);
  else
    store_all(store_pair);
"""


def split_sums():
    """C++ statements that, with ``SPLITS > 1``, leave in the last block to finish of each output tile the sums of
    every split in ``acc[REGS]`` (the others return). Inside a kernel that defines ``SPLITS``, ``REGS`` and
    ``THREADS``."""
    return """  if (SPLITS > 1) {  // the last block of this tile to finish adds every split's sums
    const int tile = blockIdx.y * gridDim.x + blockIdx.x;
    int* slot = partials + (size_t)tile * SPLITS * REGS * THREADS;
    #pragma unroll
    for (int r = 0; r < REGS; ++r) slot[(blockIdx.z * REGS + r) * THREADS + threadIdx.x] = acc[r];
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
      last = atomicAdd(&counters[tile], 1u) == SPLITS - 1;
      if (last) counters[tile] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    #pragma unroll
    for (int r = 0; r < REGS; ++r) {
      int sum = 0;
      for (int s = 0; s < SPLITS; ++s) sum += __ldcg(&slot[(s * REGS + r) * THREADS + threadIdx.x]);
      acc[r] = sum;
    }
  }
"""
