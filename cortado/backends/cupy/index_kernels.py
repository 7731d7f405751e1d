"""CUDA C for the ops that gather by index terms, ``take`` and ``take_along_axis``, and for ``add_at``, which adds
rows back where a ``take`` took them. A gather is one thread per output element (``window_kernels.gather``), which
reads its index and then the element it names. A signed index counts from the end when negative, as NumPy's, an
unsigned one never does (a uint64 past 2**63 is past the end), and one outside its axis is clamped into it, so a
kernel never reads or writes out of bounds (on the CPU such an index is an error: ``exprgraph.gathering``).

A ``take`` of whole rows (an embedding's lookup: the elements after ``axis`` contiguous, a whole number of 16-byte
vectors each, every row starting on one) moves a 16-byte vector a thread instead: on an H200 the GPT's lookup of
8192 rows of 768 bfloat16 values took 20 us an element a thread.
"""

import math

from ...exprgraph.gathering import ADD_AT_CHUNK as CHUNK  # the indices one block of add_at's sort orders
from .codegen import VECTOR_BYTES, Operand, compute_type, contiguous_strides, finished_source, storage_type
from .window_kernels import gather, offset

WORKSPACE = "unsigned char* __restrict__ ws"  # add_at's kernels' last parameter


def _place(index, size, dtype):
    """Statements setting ``p``, the place along an axis of ``size`` that ``index`` (an expression of ``dtype``)
    names; an unsigned index is compared as one (a uint64 past 2**63 is past the end, not negative)."""
    if dtype.kind == "u":
        return [f"    const unsigned long long u = (unsigned long long)({index});",
                f"    const long long p = u > {size - 1}ull ? {size - 1} : (long long)u;"]
    return [f"    long long p = (long long)({index});",
            f"    p = p < 0 ? p + {size} : p;",
            f"    p = p < 0 ? 0 : (p > {size - 1} ? {size - 1} : p);"]


def take_source(operand, indices, out, axis):
    """``out`` = ``operand``'s elements at ``indices`` along ``axis``: output coordinates ``axis ..`` are the indices'
    own, the rest the operand's; whole rows of vectors a vector a thread (``_row_vector``)."""
    count = len(indices.shape)
    index = f"in1[{offset(indices.strides, lambda a: f'c{axis + a}')}]"
    vec = _row_vector(operand, axis)
    if vec > 1:  # the elements after axis as one axis of vectors; out written in C order
        row = math.prod(operand.shape[axis + 1:]) // vec
        operand = Operand(operand.shape[:axis + 1] + (row,), operand.dtype,
                          tuple(s // vec for s in operand.strides[:axis + 1]) + (1,))
        out = Operand(out.shape[:axis + count] + (row,), out.dtype, contiguous_strides(out.shape[:axis + count] + (row,)))
        load = "reinterpret_cast<uint4*>(out0)[i] = reinterpret_cast<const uint4*>(in0)"
    else:
        load = "out0[i] = in0"

    def source(a):
        return "p" if a == axis else f"c{a}" if a < axis else f"c{a + count - 1}"

    return gather("take", [operand, indices], out, _place(index, operand.shape[axis], indices.dtype) +
                  [f"    {load}[{offset(operand.strides, source)}];"])


def _row_vector(operand, axis):
    """The elements of a ``VECTOR_BYTES`` vector where the elements of ``operand`` after ``axis`` lie contiguous, a
    whole number of vectors that each start on one (the arena's buffers and their views start on ``ALIGNMENT``
    bytes); else 1."""
    vec = VECTOR_BYTES // operand.dtype.itemsize
    row = operand.shape[axis + 1:]
    if vec <= 1 or not row or math.prod(row) % vec or tuple(operand.strides[axis + 1:]) != contiguous_strides(row):
        return 1
    return vec if all(s % vec == 0 for s in operand.strides[:axis + 1]) else 1


def take_along_axis_source(operand, indices, out, axis):
    """``out`` = ``operand``'s elements along ``axis`` at the places ``indices`` hold, the two broadcast against each
    other off ``axis`` (an axis of size 1 is read at 0)."""

    def at(shape):
        return lambda a: "0" if shape[a] == 1 else f"c{a}"

    index = f"in1[{offset(indices.strides, at(indices.shape))}]"
    here = at(operand.shape)
    return gather("take_along_axis", [operand, indices], out, _place(index, operand.shape[axis], indices.dtype) +
                  [f"    out0[i] = in0[{offset(operand.strides, lambda a: 'p' if a == axis else here(a))}];"])


# -- add_at: deterministic sums, with no atomics ----------------------------------------------------------------
#
# ``add_at`` sums, for each place of the result's axis, the values' rows whose index names it, in the order that
# ``exprgraph.gathering.add_at_into`` takes them: each chunk of ``CHUNK`` indices' rows in order, then the chunks'
# sums in order. So the GPU's result is the CPU's, bit for bit, on every run. Four kernels, over a workspace laid
# out by ``AddAtPlan``:
#   1. ``ends`` zeroed;
#   2. each block sorts a chunk of indices in shared memory by (place, position), stores the chunk's positions in
#      that order (``order``) with their places (``places``), and, for each place the chunk holds, where its run of
#      positions starts and ends (``starts``, ``ends``, at ``place * chunks + chunk``);
#   3. a thread for each run's first position (and vector of elements) adds the run's rows (``partials``);
#   4. a block for each place (and tile of vectors) lists the chunks that hold it, in order, then adds their sums.
# A run's rows and a place's chunks are what a thread adds one after another, so no thread waits on a long chain
# of loads: 16384 indices into 63 places are 16 rows a thread and 16 chunks, not 260 rows.

SUM_THREADS = 128  # a block of the fourth kernel: its tile of vectors, and the chunks it lists at a time


class AddAtPlan:
    """The shape of one ``add_at`` (``lead`` rows of ``count`` indices into ``size`` places, ``width`` elements after
    them, ``vec`` at a time) and where its workspace keeps its arrays."""

    def __init__(self, lead, count, size, width, vec, acc_bytes):
        self.lead, self.count, self.size, self.width, self.vec = lead, count, size, width, vec
        self.chunks = -(-count // CHUNK)
        self.runs = size * self.chunks  # (place, chunk) pairs
        self.places = 4 * count  # byte offsets of the arrays after ``order``, which is at 0
        self.starts = 2 * self.places
        self.ends = self.starts + 2 * self.runs
        self.partials = -(-(self.ends + 2 * self.runs) // 16) * 16
        # a run's sum is kept at its (place, chunk) pair where there are fewer of those than indices (few places),
        # else at its first position
        self.by_run = self.runs <= count
        self.rows = min(self.runs, count)
        self.nbytes = self.partials + lead * self.rows * width * acc_bytes


def add_at_plan(values, indices, out, axis):
    """The ``AddAtPlan`` of ``out`` = ``values`` added at ``indices`` along ``axis``: a vector of up to 16 bytes of
    the narrower of the values and their sums, as wide as divides the row."""
    width = math.prod(out.shape[axis + 1:])
    vec = VECTOR_BYTES // out.dtype.itemsize
    while vec > 1 and width % vec:
        vec //= 2
    acc_bytes = 4 if compute_type(out.dtype) == "float" else out.dtype.itemsize
    return AddAtPlan(math.prod(out.shape[:axis]), math.prod(indices.shape), out.shape[axis], width, vec, acc_bytes)


def add_at_sources(values, indices, out, axis):
    """The kernels of ``out`` = zeros of ``out.shape`` with ``values``' rows added at ``indices`` along ``axis``
    (``out`` written in C order), in order; each takes the values, the indices, ``out`` and the workspace."""
    plan = add_at_plan(values, indices, out, axis)
    if math.prod(out.shape) == 0:
        return []
    kernels = [_zeroed, _sorted, _run_sums, _place_sums] if plan.count else [_place_sums]
    return [kernel(values, indices, out, axis, plan) for kernel in kernels]


def _kernel(kind, lines, values, indices, out, blocks, threads):
    return finished_source(kind, "\n".join(lines) + "\n", [out], [values, indices], (), blocks, (threads, 1, 1),
                           WORKSPACE)


def _zeroed(values, indices, out, axis, plan):
    lines = [f"  unsigned short* ends = (unsigned short*)(ws + {plan.ends});",
             f"  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < {plan.runs}; "
             "r += (long long)gridDim.x * blockDim.x) ends[r] = 0;"]
    return _kernel("add_at_zero", lines, values, indices, out, max(1, min(-(-plan.runs // 256), 4096)), 256)


def _flat_offset(shape, strides, position):
    """The offset, at ``strides``, of the element at C-order ``position`` (an expression) of ``shape``."""
    return offset(strides, lambda a: f"(({position}) / {math.prod(shape[a + 1:])} % {shape[a]})")


def _sorted(values, indices, out, axis, plan):
    """Each block's chunk of indices sorted (a bitonic sort of 64-bit keys: place above, position within the chunk
    below, so equal places keep their order), then its runs of equal places recorded."""
    lines = [f"  __shared__ unsigned long long keys[{CHUNK}];",
             "  const unsigned int t = threadIdx.x;",
             f"  const long long n = (long long)blockIdx.x * {CHUNK} + t;",
             "  unsigned long long key = ~0ull;  // past the chunk's end: sorted last",
             f"  if (n < {plan.count}) {{",
             *["  " + line for line in _place(f"in1[{_flat_offset(indices.shape, indices.strides, 'n')}]", plan.size,
                                                  indices.dtype)],
             "    key = ((unsigned long long)p << 32) | t;",
             "  }",
             "  keys[t] = key;",
             "  __syncthreads();",
             f"  for (unsigned int k = 2; k <= {CHUNK}; k <<= 1) {{",
             "    for (unsigned int j = k >> 1; j > 0; j >>= 1) {",
             "      const unsigned int partner = t ^ j;",
             "      if (partner > t) {",
             "        const unsigned long long a = keys[t], b = keys[partner];",
             "        if ((a > b) == ((t & k) == 0)) { keys[t] = b; keys[partner] = a; }",
             "      }",
             "      __syncthreads();",
             "    }",
             "  }",
             "  key = keys[t];",
             "  if (key == ~0ull) return;",
             "  const unsigned int place = (unsigned int)(key >> 32);",
             f"  const long long at = (long long)blockIdx.x * {CHUNK} + t;",
             f"  ((int*)ws)[at] = (int)((long long)blockIdx.x * {CHUNK} + (key & 0xffffffffull));",
             f"  ((int*)(ws + {plan.places}))[at] = (int)place;",
             f"  const long long run = (long long)place * {plan.chunks} + blockIdx.x;",
             f"  if (t == 0 || (unsigned int)(keys[t - 1] >> 32) != place) "
             f"((unsigned short*)(ws + {plan.starts}))[run] = t;",
             f"  if (t == {CHUNK - 1} || (unsigned int)(keys[t + 1] >> 32) != place) "
             f"((unsigned short*)(ws + {plan.ends}))[run] = t + 1;"]
    return _kernel("add_at_sort", lines, values, indices, out, plan.chunks, CHUNK)


def _grid_stride(count):
    return ["  #pragma unroll 1",
            f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {count}; "
            "i += (long long)gridDim.x * blockDim.x) {"]


def _run_sums(values, indices, out, axis, plan):
    """A thread for each (lead row, sorted position, vector): where the position starts a run of its place within its
    chunk, the run's rows added in order into ``partials`` at the position's row."""
    rank, vectors, acc = len(indices.shape), plan.width // plan.vec, compute_type(out.dtype)
    token = _flat_offset(indices.shape, values.strides[axis:axis + rank], "n")
    element = _flat_offset(out.shape[axis + 1:], values.strides[axis + rank:], f"v * {plan.vec} + e")
    lead = _flat_offset(out.shape[:axis], values.strides[:axis], "r")
    total = plan.lead * plan.count * vectors
    if plan.vec > 1 and _row_vector(values, axis + rank - 1) > 1:  # a row's vectors lie whole and aligned: one load
        vector = f"ct_vec<{storage_type(values.dtype)}, {plan.vec}>"
        load = [f"      const {vector} loaded = reinterpret_cast<const {vector}*>(in0 + base + {token})[v];",
                f"      #pragma unroll\n      for (int e = 0; e < {plan.vec}; ++e) sum[e] += ({acc})ct_load(loaded.v[e]);"]
    else:
        load = ["      #pragma unroll",
                f"      for (int e = 0; e < {plan.vec}; ++e) sum[e] += ({acc})ct_load(in0[base + {token} + {element}]);"]
    lines = [f"  const int* order = (const int*)ws; const int* places = (const int*)(ws + {plan.places});",
             f"  const unsigned short* ends = (const unsigned short*)(ws + {plan.ends});",
             f"  {acc}* partials = ({acc}*)(ws + {plan.partials});",
             *_grid_stride(total),
             f"    const long long v = i % {vectors}, j = i / {vectors} % {plan.count}, r = i / {vectors * plan.count};",
             "    const int place = places[j];",
             f"    if (j % {CHUNK} && places[j - 1] == place) continue;  // not the first of its run",
             f"    const long long end = j - j % {CHUNK} + ends[(long long)place * {plan.chunks} + j / {CHUNK}];",
             f"    {acc} sum[{plan.vec}];",
             f"    #pragma unroll\n    for (int e = 0; e < {plan.vec}; ++e) sum[e] = ({acc})0;",
             f"    const long long base = {lead};",
             "    #pragma unroll 4",
             "    for (long long k = j; k < end; ++k) {",
             "      const long long n = order[k];",
             *load,
             "    }",
             f"    const long long at = {f'(long long)place * {plan.chunks} + j / {CHUNK}' if plan.by_run else 'j'};",
             f"    {acc}* row = partials + (r * {plan.rows} + at) * {plan.width} + v * {plan.vec};",
             f"    #pragma unroll\n    for (int e = 0; e < {plan.vec}; ++e) row[e] = sum[e];",
             "  }"]
    blocks = max(1, min(-(-total // 256), 1 << 20))
    return _kernel("add_at_runs", lines, values, indices, out, blocks, 256)


def _place_sums(values, indices, out, axis, plan):
    """A block for each (lead row, place, tile of vectors): the chunks holding the place listed in order, a tile of
    ``SUM_THREADS`` chunks at a time (a ballot and a count before each warp's), then each thread's vector of their
    run sums added in that order, rounded once into ``out``."""
    vectors, acc, store = plan.width // plan.vec, compute_type(out.dtype), storage_type(out.dtype)
    tiles = -(-vectors // SUM_THREADS)
    blocks = plan.lead * plan.size * tiles
    warps = SUM_THREADS // 32
    row = f"place * {plan.chunks} + b" if plan.by_run else f"b * {CHUNK} + starts[place * {plan.chunks} + b]"
    lines = [f"  __shared__ int rows[{SUM_THREADS}]; __shared__ int counts[{warps}];",
             *([] if plan.by_run else [f"  const unsigned short* starts = (const unsigned short*)(ws + {plan.starts});"]),
             f"  const unsigned short* ends = (const unsigned short*)(ws + {plan.ends});",
             f"  const {acc}* partials = (const {acc}*)(ws + {plan.partials});",
             "  const unsigned int t = threadIdx.x, lane = t & 31, warp = t >> 5;",
             "  #pragma unroll 1",
             f"  for (long long block = blockIdx.x; block < {blocks}; block += gridDim.x) {{",
             f"    const long long v = block % {tiles} * {SUM_THREADS} + t, place = block / {tiles} % {plan.size}, "
             f"r = block / {tiles * plan.size};",
             f"    {acc} sum[{plan.vec}];",
             f"    #pragma unroll\n    for (int e = 0; e < {plan.vec}; ++e) sum[e] = ({acc})0;",
             "    #pragma unroll 1",
             f"    for (long long first = 0; first < {plan.chunks}; first += {SUM_THREADS}) {{",
             "      const long long b = first + t;",
             f"      const bool held = b < {plan.chunks} && ends[place * {plan.chunks} + b] != 0;",
             "      const unsigned int ballot = __ballot_sync(0xffffffffu, held);",
             "      if (lane == 0) counts[warp] = __popc(ballot);",
             "      __syncthreads();",
             "      int before = 0, listed = 0;",
             f"      for (int w = 0; w < {warps}; ++w) {{ before += w < (int)warp ? counts[w] : 0; listed += counts[w]; }}",
             f"      if (held) rows[before + __popc(ballot & ((1u << lane) - 1u))] = (int)({row});",
             "      __syncthreads();",
             f"      if (v < {vectors}) {{",
             "        #pragma unroll 4",
             "        for (int k = 0; k < listed; ++k) {",
             f"          const {acc}* row = partials + (r * {plan.rows} + rows[k]) * {plan.width} + v * {plan.vec};",
             f"          #pragma unroll\n          for (int e = 0; e < {plan.vec}; ++e) sum[e] += row[e];",
             "        }",
             "      }",
             "      __syncthreads();",
             "    }",
             f"    if (v < {vectors}) {{",
             f"      ct_vec<{store}, {plan.vec}> result;",
             f"      #pragma unroll\n      for (int e = 0; e < {plan.vec}; ++e) result.v[e] = ct_store<{store}>(sum[e]);",
             f"      reinterpret_cast<ct_vec<{store}, {plan.vec}>*>(out0)[(r * {plan.size} + place) * {vectors} + v] = "
             "result;",
             "    }",
             "  }"]
    return _kernel("add_at_sum", lines, values, indices, out, max(1, min(blocks, 1 << 20)), SUM_THREADS)
