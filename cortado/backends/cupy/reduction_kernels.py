"""CUDA C for a fused reduction: a region whose body reduces some axes of one shape (its prologue computed for
each element as it is read, its epilogue once per output).

Each output takes a warp (short reductions) or a block, or, when the reduced axes are not the innermost, a column
of a tile (columns too long for the tiles to fill the GPU are split into parts, added in order by a second
kernel). Several reductions of one shape over the same axes (sibling column sums, ``rules.fusion``) are summed
beside each other in one pass.
"""

import math
from dataclasses import dataclass

import numpy as np

from ...errors import BackendError
from ...exprgraph.graph import post_order
from ...exprgraph.ops import MEAN, PAD
from .codegen import (
    REDUCTIONS, STORAGE, THREADS, _accumulator, _combine, _identity, _index_type, _reduction_space, _space, _Writer,
    compute_type, finished_source, offset, storage_type,
)

ROW_WARP_LIMIT = 64  # reductions this long or shorter take a warp per output, longer ones a block
# ... and those of at most this many vectors a row, where there are this many rows or more: a float8 amax's row
# maxima of 8192 rows of 768 bfloat16 took 16 us with a block a row and an element a thread (11 with a warp)
ROW_WARP_VECTORS, ROW_WARP_ROWS = 1024, 4096
COLUMN_TILE = (32, 8)  # threads across a block, threads down each reduced column
COLUMN_VECTORS = 2  # the columns each thread of a column reduction sums, a warp's width apart
# ... or, where its operands' rows are whole 16-byte loads, the threads across a block, each loading 16 bytes of
# adjacent columns of a row (a warp reads two rows' segments of 256 bytes; 8 and 32 across were slower overall:
# benchmarks/results/h100/experiments/column_vectors_ab.txt)
COLUMN_VECTOR_ACROSS = 16
COLUMN_ROW_UNROLL = 4  # rows a column reduction's thread loads before it adds them
# a column reduction of fewer tiles than this splits its columns into parts, summed by a second kernel in order
# (so the result does not depend on timing): a column sum is latency-bound, the more loads in flight the faster.
# Measured on an H200 (16 sums of x * y in one graph, 8192 x 768 bfloat16): 264 blocks of one column a thread and
# no unrolling, 18-22 us a sum; 1056 blocks of two columns a thread, four rows unrolled, 15.5 us (8192 x 3072: 55
# against 46 us). Four columns a thread or 2112 blocks were slower
COLUMN_BLOCKS_WANTED = 1056  # eight blocks per multiprocessor of an H100
SPLIT_ROWS_MIN = 128  # rows each part of a split column sums at least
TOTAL_DOWN = 32  # threads down each output's parts in the kernel adding a split column reduction's parts
ACCUMULATOR_BYTES = {c: np.dtype(name).itemsize for name, c in STORAGE.items()}  # a C type's bytes


def _reductions_of(body):
    """The reductions of a fused reduction's body: one, or several of values of one shape over the same axes into
    one accumulator type (sibling column sums, ``rules.fusion``), each summed beside the others in one pass."""
    found = [t for t in post_order(body) if t.op in REDUCTIONS]
    if not found:
        raise BackendError("a fused reduction needs a reduction in its body, found none")
    first = found[0]
    if any(t.args[0].shape != first.args[0].shape or t.attr("axes") != first.attr("axes")
           or _accumulator(t) != _accumulator(first) for t in found[1:]):
        raise BackendError("the reductions of one fused reduction must reduce the same axes of values of one shape "
                           "into one accumulator type")
    return found


@dataclass(frozen=True)
class _Reduction:
    """What every form of a fused reduction's kernel shares: its prologue (per element read), the element each
    reduction folds (``acc0``, ``acc1``, ... in the epilogue), and the lines that apply the epilogue and store each
    output."""

    reds: tuple
    outputs_n: int
    k_total: int
    acc: str
    index: str
    prologue: object
    elements: tuple
    finish: list

    def identity(self, j=0):
        return _identity(self.reds[j], self.acc)

    def combine(self, j, a, b):
        return _combine(self.reds[j], self.acc, a, b)

    def fold(self, j, acc, element=None):
        """The line adding reduction ``j``'s element (the prologue's, unless ``element`` names another) to ``acc``."""
        return f"{acc} = {self.combine(j, acc, f'(({self.acc}){element or self.elements[j]})')};"


def reduction_parts(body, operands, first_output=0):
    """The ``_Reduction`` of ``body``, whose outputs are ``out{first_output}``, ``out{first_output + 1}``, ..."""
    reds = _reductions_of(body)
    source_shape, axes = reds[0].args[0].shape, reds[0].attr("axes")
    k_total = math.prod(source_shape[a] for a in axes)
    acc = _accumulator(reds[0])
    prologue = _Writer(_reduction_space(source_shape, axes), operands, "p")
    elements = tuple(prologue.value(red.args[0]) for red in reds)
    epilogue = _Writer(_space(body[0].shape, "o"), operands, "e")
    for j, red in enumerate(reds):
        total = f"acc{j}" if red.op is not MEAN else f"(acc{j} / ({acc}){k_total})"
        epilogue.bind(red, f"(({compute_type(red.dtype)}){total})")
    results = [epilogue.value(t) for t in body]
    finish = epilogue.lines + [f"out{k}[o] = ct_store<{storage_type(t.dtype)}>({v});"
                               for k, (t, v) in enumerate(zip(body, results), start=first_output)]
    return _Reduction(tuple(reds), math.prod(reds[0].shape), k_total, acc, _index_type(body, operands), prologue,
                      elements, finish)


def _columns(body, operands):
    """Whether ``body``'s reduction sums columns: it has more than one output, and its innermost axis is kept, or
    its full-size ``operands`` (``codegen.Operand``) hold the last kept axis innermost as they are stored (an
    image stored channels last, summed over all but its channels: a block an output, each reading elements a
    channel's width apart, took 45 us for 8 MB on an H100)."""
    red = _reductions_of(body)[0]
    source, axes = red.args[0].shape, red.attr("axes")
    if math.prod(red.shape) <= 1:
        return False
    if len(source) - 1 not in axes:
        return True
    kept_last = max(a for a in range(len(source)) if a not in axes)
    full = [o for o in operands if o.shape == source]
    return bool(full) and all(o.strides[kept_last] == 1 for o in full)


def column_splits(body, operands):
    """How many parts the reduced columns of ``body`` over ``operands`` are split into (1: none): enough for
    ``COLUMN_BLOCKS_WANTED`` blocks, each part ``SPLIT_ROWS_MIN`` rows at least."""
    if not _columns(body, operands):
        return 1
    r = reduction_parts(body, operands)
    tiles = -(-r.outputs_n // _column_tile(r).columns)
    return max(1, min(-(-COLUMN_BLOCKS_WANTED // tiles), r.k_total // SPLIT_ROWS_MIN))


def partials_bytes(body, operands):
    """The bytes of the parts a split column reduction of ``body`` over ``operands`` keeps between its two kernels
    (0: not split): each reduction's parts, laid out as ``reduction_sources`` writes them, in the accumulator's
    type."""
    splits = column_splits(body, operands)
    if splits == 1:
        return 0
    reds = _reductions_of(body)
    return splits * len(reds) * math.prod(reds[0].shape) * ACCUMULATOR_BYTES[_accumulator(reds[0])]


def _vector_loads(r, stored_at, length):
    """``(elements a load, the operands loaded so)``: each operand the prologue reads whole at element offset
    ``stored_at`` (a C expression of ``o`` and ``r``, as ``codegen.offset`` writes it) is loaded 16 bytes of the
    narrowest such type at a time (8 elements at most) where ``length`` (a row's elements) is whole loads of them;
    ``(1, ())`` otherwise."""
    space, operands = r.prologue.space, r.prologue.operands
    loaded = sorted(k for k in r.prologue.read if len(operands[k].shape) == len(space)
                    and offset(space, operands[k]) == stored_at)
    if not loaded or any(t.op is PAD for red in r.reds for t in post_order([red.args[0]])):
        return 1, ()  # a pad reads its operand at shifted places
    per = min(8, 16 // min(operands[k].dtype.itemsize for k in loaded))
    return (per, tuple(loaded)) if length % per == 0 else (1, ())


def _row_vectors(r):
    """The vector loads of a reduction along rows: each operand read whole and in row order."""
    return _vector_loads(r, "r" if r.outputs_n == 1 else f"o * {r.k_total} + r", r.k_total)


def one_value_lines(body, operands, block_index):
    """``(statements, blocks)`` of a fused reduction whose every output is one value, as its kernel computes it
    alone, with the block's index ``block_index`` (a part of kernels side by side: ``horizontal_kernels``)."""
    r = reduction_parts(body, operands)
    if r.outputs_n != 1:
        raise BackendError(f"a reduction side by side computes one value, not {r.outputs_n}: {body}")
    lines, blocks, _ = _row_lines(r, block_index)
    return lines, blocks


def _row_lines(r, block_index="blockIdx.x"):
    """Each output a warp (short reductions, or rows of few vectors where there are many) or a block, its threads
    striding along the row (a vector of elements at a time, ``_row_vectors``), each reduction of the body beside
    the others."""
    per, loaded = _row_vectors(r)
    many = r.k_total // per <= ROW_WARP_VECTORS and r.outputs_n >= ROW_WARP_ROWS
    width = 32 if r.k_total <= ROW_WARP_LIMIT or many else THREADS
    per_block = THREADS // width
    index, acc, count = r.index, r.acc, len(r.reds)
    lines = [f"  const {index} o = ({index}){block_index} * {per_block} + threadIdx.x / {width};",
             f"  const unsigned lane = threadIdx.x % {width};"]
    lines += [f"  {acc} acc{j} = {r.identity(j)};" for j in range(count)]
    lines += [f"  if (o < {r.outputs_n}) {{"]
    if per == 1:
        lines += [f"    for ({index} r = lane; r < {r.k_total}; r += {width}) {{"]
        lines += ["      " + s for s in r.prologue.lines] + ["      " + r.fold(j, f"acc{j}") for j in range(count)]
    else:
        operands = r.prologue.operands
        vector = {k: f"ct_vec<{storage_type(operands[k].dtype)}, {per}>" for k in loaded}
        writer = _Writer(r.prologue.space, operands, "p", {k: f"a{k}.v[u]" for k in loaded})
        elements = [writer.value(red.args[0]) for red in r.reds]
        lines += [f"    for ({index} v = lane; v < {r.k_total // per}; v += {width}) {{"]
        lines += [f"      const {vector[k]} a{k} = reinterpret_cast<const {vector[k]}*>(in{k})"
                  f"[{'' if r.outputs_n == 1 else f'o * {r.k_total // per} + '}v];" for k in loaded]
        lines += ["      #pragma unroll", f"      for (int u = 0; u < {per}; ++u) {{",
                  f"        const {index} r = v * {per} + u;"]
        lines += ["        " + s for s in writer.lines]
        lines += ["        " + r.fold(j, f"acc{j}", e) for j, e in enumerate(elements)]
        lines += ["      }"]
    lines += ["    }", "  }"]

    def shuffle():
        return ["  #pragma unroll", "  for (int s = 16; s > 0; s >>= 1) {"] + [
            f"    acc{j} = {r.combine(j, f'acc{j}', f'__shfl_down_sync(0xffffffffu, acc{j}, s)')};"
            for j in range(count)] + ["  }"]
    lines += shuffle()
    if width > 32:
        lines += [f"  __shared__ {acc} partial[{count}][{THREADS // 32}];"]
        lines += ["  if (threadIdx.x % 32 == 0) {"] + [f"    partial[{j}][threadIdx.x / 32] = acc{j};"
                                                      for j in range(count)] + ["  }", "  __syncthreads();",
                                                                                 "  if (threadIdx.x >= 32) return;"]
        lines += [f"  acc{j} = threadIdx.x < {THREADS // 32} ? partial[{j}][threadIdx.x] : {r.identity(j)};"
                  for j in range(count)]
        lines += shuffle()
    lines += [f"  if (lane != 0 || o >= {r.outputs_n}) return;"] + ["  " + s for s in r.finish]
    return lines, -(-r.outputs_n // per_block), (THREADS, 1, 1)


@dataclass(frozen=True)
class _ColumnTile:
    """How a block of a column reduction covers its columns: ``across`` threads side by side, each summing
    ``groups`` runs of ``per`` adjacent columns (a run ``across * per`` columns after the one before), ``down``
    threads down every column. A run of more than one column is loaded as one vector of each operand in
    ``loaded``."""

    per: int
    loaded: tuple
    across: int
    down: int
    groups: int

    @property
    def columns(self):
        return self.across * self.per * self.groups


def _column_tile(r):
    """Vectors of adjacent columns where an operand read whole is stored row after row and its rows are whole
    vectors (16 bytes of the narrowest type's elements, 8 at most; on an H100, the sums of 8192 rows of 2304
    bfloat16 columns took 17.0 us so, 20.3 an element a thread): each such operand is loaded a vector at a time,
    any other one (a broadcast row, a value per row, an operand stored transposed) an element at a time in the same
    loop; otherwise an element at a time, ``COLUMN_VECTORS`` columns a thread a warp's width apart. The two forms
    add a column's rows in different orders, each the same every run."""
    n = r.outputs_n
    per, loaded = _vector_loads(r, f"r * {n} + o", n)
    if loaded:
        return _ColumnTile(per, loaded, COLUMN_VECTOR_ACROSS, THREADS // COLUMN_VECTOR_ACROSS, 1)
    across, down = COLUMN_TILE
    return _ColumnTile(1, (), across, down, max(1, min(COLUMN_VECTORS, -(-n // across))))


def _column_lines(r, first="0", last=None, store=None):
    """A tile of columns a block (``_column_tile``) over the rows from ``first`` to ``last``, each reduction of the
    body beside the others; the block's sums (``acc0``, ``acc1``, ...) go to ``store`` (lines) or, by default,
    through the epilogue. A thread's loads of one row are independent, so they are in flight together; then the
    tile's columns are each added down by one thread, in order."""
    tile = _column_tile(r)
    index, acc, n, count = r.index, r.acc, r.outputs_n, len(r.reds)
    per, across, down, width = tile.per, tile.across, tile.down, tile.per * tile.groups
    operands = r.prologue.operands
    writer = _Writer(r.prologue.space, operands, "p", {k: f"a{k}.v[u]" for k in tile.loaded})
    elements = [writer.value(red.args[0]) for red in r.reds]
    vector = {k: f"ct_vec<{storage_type(operands[k].dtype)}, {per}>" for k in tile.loaded}
    lines = [f"  const {index} first_column = ({index})blockIdx.x * {tile.columns} + threadIdx.x * {per};",
             f"  {acc} sums[{count}][{width}];",
             "  #pragma unroll", f"  for (int u = 0; u < {width}; ++u) {{"]
    lines += [f"    sums[{j}][u] = {r.identity(j)};" for j in range(count)] + ["  }"]
    lines += [f"  #pragma unroll {COLUMN_ROW_UNROLL}",
              f"  for ({index} r = {first} + threadIdx.y; r < {last or r.k_total}; r += {down}) {{",
              "    #pragma unroll", f"    for (int g = 0; g < {tile.groups}; ++g) {{",
              f"      const {index} column = first_column + g * {across * per};",
              f"      if (column < {n}) {{"]
    lines += [f"        const {vector[k]} a{k} = reinterpret_cast<const {vector[k]}*>(in{k})"
              f"[r * {n // per} + column / {per}];" for k in tile.loaded]
    lines += ["        #pragma unroll", f"        for (int u = 0; u < {per}; ++u) {{",
              f"          const {index} o = column + u;"]
    lines += ["          " + s for s in writer.lines]
    lines += ["          " + r.fold(j, f"sums[{j}][g * {per} + u]", e) for j, e in enumerate(elements)]
    lines += ["        }", "      }", "    }", "  }"]
    lines += [f"  __shared__ {acc} partial[{count}][{down}][{tile.columns}];",
              "  #pragma unroll", f"  for (int g = 0; g < {tile.groups}; ++g) {{",
              "    #pragma unroll", f"    for (int u = 0; u < {per}; ++u) {{"]
    lines += [f"      partial[{j}][threadIdx.y][g * {across * per} + threadIdx.x * {per} + u] = sums[{j}][g * {per} + u];"
              for j in range(count)]
    lines += ["    }", "  }", "  __syncthreads();",
              f"  const unsigned t = threadIdx.y * {across} + threadIdx.x;",
              f"  if (t >= {tile.columns}) return;",
              f"  const {index} o = ({index})blockIdx.x * {tile.columns} + t;",
              f"  if (o >= {n}) return;"]
    for j in range(count):
        lines += [f"  {acc} acc{j} = partial[{j}][0][t];",
                  f"  for (int y = 1; y < {down}; ++y) acc{j} = {r.combine(j, f'acc{j}', f'partial[{j}][y][t]')};"]
    return lines + ["  " + s for s in (store or r.finish)], -(-n // tile.columns), (across, down, 1)


def reduction_sources(body, operands, aliased=()):
    """A fused reduction: the prologue for each element read, the reduction, the epilogue per output. One kernel,
    or, for columns split into parts (``column_splits``), two: the parts' sums into a scratch array (the kernels'
    last parameter: each reduction's parts, then the next's), then each output's parts added up and the epilogue.
    The second adds a column of parts as the first adds a column of rows: ``TOTAL_DOWN`` threads down it, each
    adding every ``TOTAL_DOWN``-th part in order, then the first of them adding the others' sums in order; a thread
    adding all 1024 parts of an output alone took 15 us of a 22 us channel sum on an H100."""
    r = reduction_parts(body, operands)
    splits = column_splits(body, operands)
    if splits == 1:
        lines, blocks, block = (_column_lines if _columns(body, operands) else _row_lines)(r)
        return [finished_source("reduction", "\n".join(lines) + "\n", body, operands, aliased, max(blocks, 1), block)]
    rows, n, index = -(-r.k_total // splits), r.outputs_n, r.index
    stores = [f"partials[({index})({j * splits} + blockIdx.y) * {n} + o] = acc{j};" for j in range(len(r.reds))]
    lines, tiles, block = _column_lines(r, f"({index})blockIdx.y * {rows}",
                                        f"min(({index})(blockIdx.y + 1) * {rows}, ({index}){r.k_total})", stores)
    parts = finished_source("reduction_parts", "\n".join(lines) + "\n", body, operands, aliased, (tiles, splits, 1),
                            block, f"{r.acc}* __restrict__ partials")
    return [parts, parts_total(r, splits, body, operands, aliased)]


def parts_total(r, splits, body, operands, aliased):
    """The kernel adding each output's ``splits`` parts (``partials``: each reduction's parts, then the next's, a part
    an output's row) and running ``r``'s epilogue (``reduction_sources``' second kernel; also the second of a
    transposed kernel that sums its tiles' columns, ``transposed_kernels``)."""
    n, index = r.outputs_n, r.index
    across, down = COLUMN_TILE[0], min(TOTAL_DOWN, splits)
    lines = [f"  const {index} o = ({index})blockIdx.x * {across} + threadIdx.x;"]
    for j in range(len(r.reds)):
        lines += [f"  {r.acc} acc{j} = {r.identity(j)};",
                  f"  if (o < {n}) for (int s = threadIdx.y; s < {splits}; s += {down}) "
                  f"acc{j} = {r.combine(j, f'acc{j}', f'partials[({j * splits} + s) * {n} + o]')};"]
    lines += [f"  __shared__ {r.acc} partial[{len(r.reds)}][{down}][{across}];"]
    lines += [f"  partial[{j}][threadIdx.y][threadIdx.x] = acc{j};" for j in range(len(r.reds))]
    lines += ["  __syncthreads();", f"  if (threadIdx.y != 0 || o >= {n}) return;"]
    for j in range(len(r.reds)):
        lines += [f"  for (int y = 1; y < {down}; ++y) "
                  f"acc{j} = {r.combine(j, f'acc{j}', f'partial[{j}][y][threadIdx.x]')};"]
    lines += ["  " + s for s in r.finish]
    return finished_source("reduction_total", "\n".join(lines) + "\n", body, operands, aliased,
                           -(-n // across), (across, down, 1), f"const {r.acc}* __restrict__ partials")
