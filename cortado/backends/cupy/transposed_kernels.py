"""Kernels that write matrices transposed, by tiles through shared memory: the copy of a matrix stored column by
column into rows (``sources.copy_source``), and elementwise work that writes some of its results transposed as well
as, or instead of, in order (a float8 cast whose result a float8 product also reads transposed,
``lowering/float8_transposes.py``).

A block takes a tile of ``TILE`` x ``TILE`` words with ``TILE x TILE_ROWS`` threads, each thread a block of
``per x per`` elements at a time (``per``: the elements of a 4-byte word, four of float8, or one where wider): it
reads or computes them, turns them in registers into ``per`` words of ``per`` consecutive elements of the transposed
matrix, and keeps those in shared memory, from which whole words are written a row of the transposed matrix at a
time. A word's place in its tile row is turned by the row's block, so that neither the writes nor the reads of a
warp meet in one bank.
"""

import math

from ...errors import BackendError
from ...exprgraph.graph import post_order
from ...exprgraph.ops import PARAM
from ...rules.fusion import transposed_outputs, untransposed
from .codegen import (
    REDUCTIONS, Operand, _accumulator, _index_type, _space, _Writer, contiguous_strides, finished_source, offset,
    shifted_operands, storage_type,
)
from .reduction_kernels import ACCUMULATOR_BYTES, parts_total, reduction_parts

TILE = 32  # a tile side in words (of 4 bytes, or one element where wider)
TILE_ROWS = 16  # threads across a tile: TILE x TILE_ROWS
PER = 4  # the float8 elements of a word: a transposed output's elements a thread writes at once
SIDE = TILE * PER  # a transposed output's tile side, in elements
COPY_BLOCKS = 512  # a transposing copy's tiles, at least, where smaller tiles allow: a few blocks a multiprocessor


def stored_transposed(operand):
    """Whether ``operand`` is a matrix stored column by column, large enough for tiles (and few enough of them for
    a grid's second axis)."""
    if len(operand.shape) != 2:
        return False
    rows, cols = operand.shape
    side = TILE * _per_word(operand)
    return operand.strides == (1, rows) and min(rows, cols) >= side and -(-cols // side) < 1 << 16


def _per_word(operand):
    """Elements a thread moves at once: a 4-byte word of them where both sides of the matrix are whole words (a
    float8 tile moved a byte a thread ran at a quarter of the memory's speed), else one."""
    count = max(1, 4 // operand.dtype.itemsize)
    return count if all(side % count == 0 for side in operand.shape) else 1


def transposing_copy(element, operand):
    """``operand`` (rows x cols, stored column by column) written row by row, a tile at a time: each thread reads its
    block of elements as ``per`` words of a column each (a byte at a time through shared memory, a float8 copy ran
    at about half the memory's speed). Tiles are smaller where the matrix has few (``_copy_tile``)."""
    rows, cols = operand.shape
    per = _per_word(operand)
    tile = _copy_tile(rows, cols, per)
    side = tile * per
    word = f"ct_vec<{storage_type(operand.dtype)}, {per}>"
    text = (f"  __shared__ {word} tile[{side}][{tile}];\n"
            f"  const unsigned int r0 = blockIdx.x * {side}u, c0 = blockIdx.y * {side}u, x = threadIdx.x;\n"
            f"  for (unsigned int i = threadIdx.y; i < {tile}u; i += {TILE_ROWS}u) {{\n"
            f"    const unsigned int r = r0 + x * {per}u, c = c0 + i * {per}u;\n"
            f"    if (r < {rows}u && c < {cols}u) {{\n"
            f"      {word} w[{per}], t[{per}];\n"
            f"#pragma unroll\n"
            f"      for (int k = 0; k < {per}; ++k)\n"
            f"        w[k] = *reinterpret_cast<const {word}*>(in0 + (size_t)(c + k) * {rows}u + r);\n"
            f"#pragma unroll\n"
            f"      for (int u = 0; u < {per}; ++u)\n"
            f"#pragma unroll\n"
            f"        for (int k = 0; k < {per}; ++k) t[u].v[k] = w[k].v[u];\n"
            f"#pragma unroll\n"
            f"      for (int u = 0; u < {per}; ++u) tile[x * {per}u + u][(i + x) % {tile}u] = t[u];\n"
            f"    }}\n"
            f"  }}\n"
            f"  __syncthreads();\n"
            f"  for (unsigned int k = threadIdx.y; k < {side}u; k += {TILE_ROWS}u) {{\n"
            f"    const unsigned int r = r0 + k, c = c0 + x * {per}u;\n"
            f"    if (r < {rows}u && c < {cols}u)\n"
            f"      *reinterpret_cast<{word}*>(out0 + (size_t)r * {cols}u + c) = tile[k][(x + k / {per}u) % {tile}u];\n"
            f"  }}\n")
    grid = (-(-rows // side), -(-cols // side), 1)
    return finished_source("transpose", text, (element,), [operand], (), grid, (tile, TILE_ROWS, 1))


def _copy_tile(rows, cols, per):
    """A transposing copy's tile side in words: ``TILE``, halved (down to ``TILE_ROWS``) while the matrix has fewer
    tiles than ``COPY_BLOCKS``. A float8 weight of 3072 x 768 is 144 tiles of 128 x 128, barely one block a
    multiprocessor, each with 16 KiB to move in turn: its copy took 19 us in the float8 GPT step."""
    tile = TILE
    while tile > TILE_ROWS and -(-rows // (tile * per)) * -(-cols // (tile * per)) < COPY_BLOCKS:
        tile //= 2
    return tile


def writes_transposed(rows, cols, dtype):
    """Whether a kernel can write a ``rows x cols`` matrix of ``dtype`` transposed: float8, whole words on both
    sides, and few enough tiles down the rows for a grid's second axis."""
    return dtype.itemsize == 1 and rows % PER == 0 and cols % PER == 0 and -(-rows // SIDE) < 1 << 16


def transposed_source(body, operands, aliased=()):
    """The kernel of an elementwise ``body`` some of whose outputs are ``transposed_outputs``: each thread computes
    ``PER`` consecutive elements of ``PER`` rows of the matrix the body walks (its outputs' shape, leading axes as
    rows), reading an operand stored in that order ``PER`` elements at once, writes the outputs in order a word of
    ``PER`` elements a row, and hands the transposed ones' words to shared memory, from which the block writes them
    transposed."""
    lines, grid = _tile_lines(body, operands)
    return finished_source("transposed", "\n".join(lines) + "\n", body, operands, aliased, grid, (TILE, TILE_ROWS, 1))


def transposed_sum_sources(body, operands, aliased=()):
    """The two kernels of a transposed kernel whose ``body`` also sums columns of what it reads (a float8 gradient's
    cast and its bias gradient, ``lowering/transposed_sums.py``): the outputs without a reduction come first, then
    the sums'. The first kernel is ``transposed_source``'s, each block also adding each column of its tile's rows
    (a thread its rows in order, then the block's threads down the column in order) into the workspace, a part a
    tile row; the second adds each output's parts in order and runs the sums' epilogue (``parts_total``)."""
    tiles = _tiles_of(body)
    r = reduction_parts(body[len(tiles):], operands, first_output=len(tiles))
    lines, grid = _tile_lines(tiles, operands, r)
    first = finished_source("transposed_sums", "\n".join(lines) + "\n", body, operands, aliased, grid,
                            (TILE, TILE_ROWS, 1), f"{r.acc}* __restrict__ partials")
    return [first, parts_total(r, grid[1], body, operands, aliased)]


def _tiles_of(body):
    """The outputs of a transposed kernel's ``body`` that sum nothing: its first ones."""
    return tuple(o for o in body if not any(t.op in REDUCTIONS for t in post_order([o])))


def keeps_in_shared(transposed, reductions=()):
    """Whether a transposed kernel's block keeps the tiles of ``transposed`` results and its column sums of
    ``reductions`` within 48 KiB of shared memory."""
    sums = sum(TILE_ROWS * SIDE * ACCUMULATOR_BYTES[_accumulator(red)] for red in reductions)
    return transposed * SIDE * TILE * PER + sums <= 48 << 10


def sum_parts(rows):
    """How many parts a transposed kernel over ``rows`` rows adds each column sum in: one a tile row."""
    return -(-rows // SIDE)


def sum_partials_bytes(body):
    """The bytes of the parts ``transposed_sum_sources``' kernels of ``body`` keep between them: each reduction's
    parts of every column, in its accumulator's type."""
    reductions = [t for t in post_order(body[len(_tiles_of(body)):]) if t.op in REDUCTIONS]
    rows, cols = math.prod(reductions[0].args[0].shape[:-1]), reductions[0].args[0].shape[-1]
    return sum_parts(rows) * len(reductions) * cols * ACCUMULATOR_BYTES[_accumulator(reductions[0])]


def _tile_lines(body, operands, sums=None):
    """``(lines, grid)`` of ``transposed_source``'s kernel over ``body``; with ``sums`` (a ``reduction_parts`` whose
    reductions sum the columns of values of the body's shape), each block's column sums of its tile's rows stored
    into ``partials``, a part a tile row."""
    transposed = transposed_outputs(body)
    values = [untransposed(o) if o in transposed else o for o in body]
    shape = values[0].shape
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if any(v.shape != shape for v in values) or not all(writes_transposed(rows, cols, o.dtype) for o in transposed):
        raise BackendError(f"a transposed kernel writes float8 matrices of whole words, not {body}")
    reds = sums.reds if sums is not None else ()
    if any(red.args[0].shape != shape for red in reds) or (sums is not None and sums.outputs_n != cols):
        raise BackendError(f"a transposed kernel sums the columns of values of its own shape {shape}, not {reds}")
    if not keeps_in_shared(len(transposed), reds):
        raise BackendError(f"a transposed kernel keeps at most 48 KiB of tiles and sums, not those of {body}")
    space = _space(shape[:-1], "r") + _space(shape[-1:], "c")
    in_order = offset(space, Operand(shape, None, contiguous_strides(shape)))
    shifted = shifted_operands(body)
    read = sorted({t.attr("index") for t in post_order(values + [red.args[0] for red in reds]) if t.op is PARAM})
    rowwise = [k for k in read if k not in shifted and offset(space, operands[k]) == in_order]  # a word a row
    writer = _Writer(space, operands, "v", {k: f"a{k}.v[u]" for k in rowwise})
    names = [writer.value(v) for v in values]
    elements = [writer.value(red.args[0]) for red in reds]
    index = _index_type(body, operands)
    plain = [k for k, o in enumerate(body) if o not in transposed]
    turned = [k for k, o in enumerate(body) if o in transposed]

    def word(k):
        return f"ct_vec<{storage_type(body[k].dtype)}, {PER}>"

    lines = [f"  __shared__ {word(k)} tile{k}[{SIDE}][{TILE}];" for k in turned]
    lines += [f"  {sums.acc} s{j}[{PER}] = {{{', '.join([sums.identity(j)] * PER)}}};" for j in range(len(reds))]
    lines += [f"  const {index} r0 = ({index})blockIdx.y * {SIDE}u, c0 = ({index})blockIdx.x * {SIDE}u;",
              "  const unsigned int x = threadIdx.x;",
              f"  for (unsigned int i = threadIdx.y; i < {TILE}u; i += {TILE_ROWS}u) {{",
              f"    const {index} rb = r0 + i * {PER}u, cb = c0 + x * {PER}u;",
              f"    if (rb < {rows}u && cb < {cols}u) {{"]
    lines += [f"      {word(k)} t{k}[{PER}];" for k in turned]
    lines += ["      #pragma unroll", f"      for (int h = 0; h < {PER}; ++h) {{", f"        const {index} r = rb + h;"]
    lines += [f"        const ct_vec<{storage_type(operands[k].dtype)}, {PER}> a{k} = *reinterpret_cast<const "
              f"ct_vec<{storage_type(operands[k].dtype)}, {PER}>*>(in{k} + (size_t)r * {cols}u + cb);" for k in rowwise]
    lines += [f"        {word(k)} o{k};" for k in plain]
    lines += ["        #pragma unroll", f"        for (int u = 0; u < {PER}; ++u) {{", f"          const {index} c = cb + u;"]
    lines += ["          " + s for s in writer.lines]
    lines += [f"          o{k}.v[u] = ct_store<{storage_type(body[k].dtype)}>({names[k]});" for k in plain]
    lines += [f"          t{k}[u].v[h] = ct_store<{storage_type(body[k].dtype)}>({names[k]});" for k in turned]
    lines += ["          " + sums.fold(j, f"s{j}[u]", e) for j, e in enumerate(elements)]
    lines += ["        }"]
    lines += [f"        *reinterpret_cast<{word(k)}*>(out{k} + (size_t)r * {cols}u + cb) = o{k};" for k in plain]
    lines += ["      }"]
    lines += ["      #pragma unroll", f"      for (int u = 0; u < {PER}; ++u) {{"]
    lines += [f"        tile{k}[x * {PER}u + u][(i + x) % {TILE}u] = t{k}[u];" for k in turned]
    lines += ["      }", "    }", "  }"]
    lines += [f"  __shared__ {sums.acc} column{j}[{TILE_ROWS}][{SIDE}];" for j in range(len(reds))]
    lines += [f"  for (int u = 0; u < {PER}; ++u) column{j}[threadIdx.y][x * {PER}u + u] = s{j}[u];"
              for j in range(len(reds))]
    lines += ["  __syncthreads();",
              f"  for (unsigned int q = threadIdx.y; q < {SIDE}u; q += {TILE_ROWS}u) {{",
              f"    const {index} c = c0 + q, r = r0 + x * {PER}u;",
              f"    if (c < {cols}u && r < {rows}u) {{"]
    lines += [f"      *reinterpret_cast<{word(k)}*>(out{k} + (size_t)c * {rows}u + r) = tile{k}[q][(x + q / {PER}u) % {TILE}u];"
              for k in turned]
    lines += ["    }", "  }"]
    if reds:  # each column of the tile added down its threads' sums, in order, by one thread
        lines += [f"  const unsigned int t = threadIdx.y * {TILE}u + x;",
                  f"  if (t < {SIDE}u && c0 + t < {cols}u) {{"]
        for j in range(len(reds)):
            lines += [f"    {sums.acc} total = column{j}[0][t];",
                      f"    for (int y = 1; y < {TILE_ROWS}; ++y) total = {sums.combine(j, 'total', f'column{j}[y][t]')};",
                      f"    partials[({index})({j * sum_parts(rows)}u + blockIdx.y) * {cols}u + c0 + t] = total;"]
        lines += ["  }"]
    return lines, (-(-cols // SIDE), sum_parts(rows), 1)
