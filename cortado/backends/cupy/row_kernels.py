"""CUDA C for a row kernel (``rules.fusion``: a layer norm, a softmax, their gradients): each row a warp or a
block, which reduces the row once per reduction in the body, every thread keeping each total, then writes the
outputs. A reduction that only outputs of one value a row read (a float8 amax's row maxima of what the kernel
writes, ``rules.row_epilogues``) is folded in the pass that writes the row instead of a pass of its own. A float8
result may be written transposed as well (a float8 product's operand, ``lowering/float8_transposes.py``).
"""

import math
from dataclasses import replace

import numpy as np

from ...errors import BackendError
from ...exprgraph.graph import post_order
from ...exprgraph.ops import MEAN, PARAM
from ...rules.fusion import padded_rows, transposed_outputs, untransposed, written_rows
from .codegen import (
    REDUCTIONS, THREADS, _accumulator, _combine, _identity, _index_type, _reduction_space, _Writer, compute_type,
    constants_after_row, finished_source, offset, storage_type,
)
from .reduction_kernels import ROW_WARP_ROWS, ROW_WARP_VECTORS

ROW_KERNEL_WARP_LIMIT = 2048  # a row kernel's rows this long or shorter take a warp each, longer ones a block
# a row kernel writing rows transposed: a block's rows, 16 bytes of each column (two blocks fill a 32-byte sector),
# made by this many warps at once, two rows each: blocks of 256 threads, two of which share a multiprocessor where
# one of 512 (32 rows, 16 warps) held it alone (ncu: 25% occupancy), so that one computes while the other writes.
# On an H200 the large float8 GPT step took 12.07-12.10 ms against 12.16-12.17 with 32 rows and 16 warps; 16 warps
# of a row, or 8 rows a block, were slower (benchmarks/results/h200/experiments/transposed_row_blocks/)
TRANSPOSED_ROWS = 16
TRANSPOSED_WARPS = 8
# the most shared memory a block's rows to be written transposed may take: rows of up to 1536 float8 values (768
# written in both orders); on the H100 a block's 32 float8 rows of 3072 (96 KiB, two blocks a multiprocessor) made a
# gelu's row kernel 35 us slower, more than the copy it saved
SHARED_ROWS_LIMIT = 24 << 10
ROW_CACHE_VECTORS = 8  # the most 16-byte vectors of its operands' rows a row kernel's thread holds in registers (more spill)


def _all_reduced(red, acc_type, acc, width):
    """Lines leaving every thread of a row's ``width`` with the row's total of reduction ``red`` in ``acc``."""
    lines = ["  #pragma unroll", "  for (int s = 16; s > 0; s >>= 1) {",
             f"    {acc} = {_combine(red, acc_type, acc, f'__shfl_xor_sync(0xffffffffu, {acc}, s)')};", "  }"]
    if width > 32:
        lines += [f"  __shared__ {acc_type} {acc}_warps[{width // 32}];",
                  f"  if (threadIdx.x % 32 == 0) {acc}_warps[threadIdx.x / 32] = {acc};", "  __syncthreads();",
                  f"  {acc} = {acc}_warps[0];",
                  f"  for (int w = 1; w < {width // 32}; ++w) {acc} = {_combine(red, acc_type, acc, f'{acc}_warps[w]')};"]
    return lines


def _row_vector(shape, operands, elements, body):
    """``(width, rows, across)``: how many elements of a row each thread takes at a time (16 bytes of the narrowest
    type where the row divides; half that where only half gives each lane of the warp that takes a row as many
    vectors as the others),
    the operands it then loads as one vector of its row (those laid out as the rows themselves), and those it loads
    as one vector of the one row they hold for every row (a layer norm's gain and bias): ``width`` scattered loads of
    those, a lane's elements ``width`` elements apart from its neighbours', would take many times the memory
    pipeline's cycles of the vectors. (A float8 result in a layer norm's gradient kernel, rows of 768: 48 vectors of
    16 leave half a warp idle in its second turn, 96 of 8 none; on the H100 the float8 GPT step's gradient kernels
    took 70 to 90 us with the first, about 50 with the second.)"""
    n = shape[-1]
    rows = {k for k, o in enumerate(operands) if offset(elements, o) == f"o * {n} + r"}
    across = {k for k, o in enumerate(operands) if offset(elements, o) == "r"}
    written = [t for t in body if t.shape == shape or _padded(t, shape) is not None]
    sizes = [operands[k].dtype.itemsize for k in rows] + [t.dtype.itemsize for t in written]
    lengths = {n} | {t.shape[-1] for t in written}
    vec = 16 // min(sizes, default=16)
    while vec > 1 and any(length % vec for length in lengths):
        vec //= 2
    if vec > 2 and n <= ROW_KERNEL_WARP_LIMIT and (n // vec) % 32 and (n // (vec // 2)) % 32 == 0:
        vec //= 2
    return (vec, rows, across) if vec > 1 and math.prod(shape[:-1]) > 1 else (1, set(), set())


def _row_pass(writer, index, n, width, vec, rows, across, prefix, inner, stores=(), cached=0, tiles=()):
    """A loop over a row, ``vec`` elements a thread at a time (the ``rows`` operands loaded as vectors, the others
    taken from the thread's ``cached`` vectors of them; the ``across`` operands' one row loaded as vectors), running
    ``writer``'s lines and then ``inner`` for each element ``r``; ``stores``: ``(k, dtype, length)`` of the outputs
    ``inner`` puts in ``s{k}.v[u]``, stored as vectors into rows of ``length`` (one element at a time where ``vec`` is
    1, by ``inner`` itself);
    ``tiles``: likewise, of the outputs written into the warp's row of shared memory ``tile{k}`` (``_turned``)."""
    if vec == 1:
        return [f"  for ({index} r = lane; r < {n}; r += {width}) {{"] + ["    " + s for s in writer.lines + inner] + ["  }"]
    if cached:
        lines = ["  #pragma unroll", f"  for (int i = 0; i < {cached}; ++i) {{", f"    const {index} c = lane + i * {width};"]
        lines += [f"    if (c >= {n // vec}) break;"] if (n // vec) % width else []
    else:
        lines = [f"  for ({index} c = lane; c < {n // vec}; c += {width}) {{"]
    lines += [f"    const {_vector(writer.operands[k], vec)} {prefix}{k} = {_row_vector_read(writer.operands[k], k, n, vec)};"
              for k in sorted(writer.read & rows)]
    lines += [f"    const {_vector(writer.operands[k], vec)} {prefix}{k} = {_row_vector_read(writer.operands[k], k, 0, vec)};"
              for k in sorted(writer.read & across)]
    lines += [f"    ct_vec<{storage_type(dtype)}, {vec}> s{k};" for k, dtype, _ in stores]
    lines += [f"    ct_vec<{storage_type(dtype)}, {vec}> s{k};" for k, dtype in tiles]
    lines += ["    #pragma unroll", f"    for (int u = 0; u < {vec}; ++u) {{", f"      const {index} r = c * {vec} + u;"]
    lines += ["      " + s for s in writer.lines + inner] + ["    }"]
    lines += [f"    reinterpret_cast<ct_vec<{storage_type(dtype)}, {vec}>*>(out{k})[o * {length // vec} + c] = s{k};"
              for k, dtype, length in stores]
    lines += [f"    reinterpret_cast<ct_vec<{storage_type(dtype)}, {vec}>*>(tile{k}[slot])[c] = s{k};"
              for k, dtype in tiles]
    return lines + ["  }"]


def _vector(operand, vec):
    return f"ct_vec<{storage_type(operand.dtype)}, {vec}>"


def _row_vector_read(operand, k, n, vec):
    """The ``c``-th vector of ``vec`` elements of row ``o`` of operand ``k`` (rows of ``n``; 0: its one row)."""
    row = f"o * {n // vec} + " if n else ""
    return f"reinterpret_cast<const {_vector(operand, vec)}*>(in{k})[{row}c]"


def _row_cache(operands, read, index, n, width, vec, count):
    """Lines loading each thread's ``count`` vectors of the row of each operand in ``read`` into registers
    (``row{k}[i]``), once, for every pass to use."""
    lines = []
    for k in sorted(read):
        lines += [f"  {_vector(operands[k], vec)} row{k}[{count}];", "  #pragma unroll",
                  f"  for (int i = 0; i < {count}; ++i) {{", f"    const {index} c = lane + i * {width};",
                  f"    if (c < {n // vec}) row{k}[i] = {_row_vector_read(operands[k], k, n, vec)};", "  }"]
    return lines


def _trailing(body, shape):
    """The reductions of ``body`` that no output of the row ``shape`` (written in order or transposed) and no other
    reduction reads, where there is such an output: only outputs of one value a row read them, so the pass writing
    the row folds them too."""
    reductions = [t for t in post_order(body) if t.op in REDUCTIONS]
    full = [written_rows(t) for t in body if written_rows(t).shape == shape]
    read = set(post_order(full + [red.args[0] for red in reductions])) if full else set(reductions)
    return {red for red in reductions if red not in read}


def _padded(output, shape):
    """The row of ``shape`` that ``output`` writes with constants after it (``rules.fusion.padded_rows``), or None."""
    row = padded_rows(output)
    return row if row is not None and row.shape == shape else None


def _padding(padded, n):
    """Lines in which the first thread of each row writes the constants after it, for each output of ``padded``
    (``(k, pad term)``; rows of ``n``)."""
    lines = ["    " + constants_after_row(k, t, n, "o") for k, t in padded]
    return ["  if (lane == 0) {"] + lines + ["  }"] if lines else []


def _total(red, j, width, n):
    """Lines leaving every thread of a row with reduction ``red``'s total in ``total{j}``, from its ``acc{j}``."""
    acc = _accumulator(red)
    total = f"acc{j}" if red.op is not MEAN else f"(acc{j} / ({acc}){n})"
    return _all_reduced(red, acc, f"acc{j}", width) + [
        f"  const {compute_type(red.dtype)} total{j} = ({compute_type(red.dtype)}){total};"]


def _fold(red, j, element):
    """The line folding ``element`` into reduction ``red``'s ``acc{j}``."""
    acc = _accumulator(red)
    return f"acc{j} = {_combine(red, acc, f'acc{j}', f'(({acc}){element})')};"


def writes_rows_transposed(rows, n, dtypes):
    """Whether a row kernel of ``rows`` rows of ``n`` can write results of ``dtypes`` transposed: float8, in blocks of
    ``TRANSPOSED_ROWS`` whole rows, whose rows fit in shared memory."""
    return (all(np.dtype(d).itemsize == 1 for d in dtypes) and rows % TRANSPOSED_ROWS == 0
            and len(dtypes) * TRANSPOSED_ROWS * n <= SHARED_ROWS_LIMIT)


def _turned(turned, n, rows, threads):
    """Lines writing each transposed output of ``turned`` (``(k, dtype)``) from the block's rows in shared memory
    (``tile{k}``): a column of the block's ``TRANSPOSED_ROWS`` rows a thread at a time, half a 32-byte sector, whose
    other half the next block writes."""
    lines = ["  __syncthreads();", f"  for (unsigned int r = threadIdx.x; r < {n}u; r += {threads}u) {{"]
    for k, dtype in turned:
        word = f"ct_vec<{storage_type(dtype)}, {TRANSPOSED_ROWS}>"
        lines += [f"    {word} w{k};", "    #pragma unroll",
                  f"    for (int h = 0; h < {TRANSPOSED_ROWS}; ++h) w{k}.v[h] = tile{k}[h][r];",
                  f"    *reinterpret_cast<{word}*>(out{k} + (size_t)r * {rows}u + blockIdx.x * {TRANSPOSED_ROWS}u) = w{k};"]
    return lines + ["  }"]


def row_lines(body, operands, shape, block_index):
    """``(statements, blocks)`` of a row kernel writing nothing transposed, as it computes alone, with the block's
    index ``block_index`` (a part of kernels side by side: ``horizontal_kernels``)."""
    if transposed_outputs(body):
        raise BackendError(f"a row kernel side by side writes nothing transposed: {body}")
    return row_source(body, operands, (), shape, block_index)


def row_source(body, operands, aliased, shape, block_index=None):
    """A row kernel: a warp (rows of up to ``ROW_KERNEL_WARP_LIMIT``, or, in a kernel of one pass, rows of few
    vectors where there are many: ``ROW_WARP_VECTORS``, ``ROW_WARP_ROWS``) or a block to each row, which reduces the
    row once for each reduction of the body in order, every thread holding each total, then computes the outputs:
    those of the row shape element by element, folding the reductions only outputs of one value a row read
    (``_trailing``), then those of the reduced shape once. Nothing between the passes is stored. Each thread takes
    16 bytes of a row at a time where the row divides, the operands laid out as the rows loaded and the outputs
    stored as vectors; where its share of those operands' rows fits ``ROW_CACHE_VECTORS`` (else its share of those
    that the reductions' passes read, which a later pass reads again), it loads them into registers once, before
    the first pass, instead of reading the row again (from cache) in each. Results written
    transposed (``rules.fusion.transposed_outputs``) take a warp a row, each warp ``TRANSPOSED_ROWS / TRANSPOSED_WARPS`` rows in
    turn into shared memory, from which the block writes its ``TRANSPOSED_ROWS`` rows a column at a time
    (``_turned``). With ``block_index``, its statements and block count, for a kernel of parts to call."""
    n, rows = shape[-1], math.prod(shape[:-1])
    transposed = transposed_outputs(body)
    turned = [(k, t) for k, t in enumerate(body) if t in transposed]
    if turned and not writes_rows_transposed(rows, n, [t.dtype for _, t in turned]):
        raise BackendError(f"a row kernel writes float8 rows transposed by blocks of {TRANSPOSED_ROWS} whole rows "
                           f"within {SHARED_ROWS_LIMIT >> 10} KiB of shared memory, not {body}")
    reductions = [t for t in post_order(body) if t.op in REDUCTIONS]
    trailing = _trailing(body, shape)
    index = _index_type(body, operands)
    last = (len(shape) - 1,)
    elements, row = _reduction_space(shape, last), _reduction_space(shape[:-1] + (1,), last)
    vec, vectors, across = _row_vector(shape, operands, elements, body)
    one_pass = len(trailing) == len(reductions)
    short = n <= ROW_KERNEL_WARP_LIMIT or one_pass and n // vec <= ROW_WARP_VECTORS and rows >= ROW_WARP_ROWS
    width = 32 if short or turned else THREADS
    threads = 32 * TRANSPOSED_WARPS if turned else THREADS
    per_block = threads // width
    count = -(-(n // vec) // width) if vec > 1 else 0
    reread = vectors & {p.attr("index") for red in reductions if red not in trailing
                        for p in post_order([red.args[0]]) if p.op is PARAM}
    fitting = [s for s in (vectors, reread) if s and not one_pass and count * len(s) <= ROW_CACHE_VECTORS]
    kept = fitting[0] if fitting else set()  # the operands whose rows the thread holds in registers
    cached = count if kept else 0

    def loads(prefix):
        return {k: f"row{k}[i].v[u]" if k in kept else f"{prefix}{k}.v[u]" for k in vectors | across}

    lines, read, totals = [], set(), {}
    for j, red in enumerate(reductions):
        acc = _accumulator(red)
        lines.append(f"  {acc} acc{j} = {_identity(red, acc)};")
        if red in trailing:
            continue
        writer = _Writer(elements, operands, f"a{j}_", loads(f"p{j}_"))
        writer.names.update(totals)
        element = writer.value(red.args[0])
        lines += _row_pass(writer, index, n, width, vec, vectors - kept, across, f"p{j}_", [_fold(red, j, element)],
                           cached=cached)
        lines += _total(red, j, width, n)
        totals[red] = f"total{j}"
        read |= writer.read
    padded = [(k, t) for k, t in enumerate(body) if _padded(t, shape) is not None]
    full = [(k, t) for k, t in enumerate(body) if t.shape == shape and t not in transposed]
    full += [(k, _padded(t, shape)) for k, t in padded]
    lengths = {k: t.shape[-1] for k, t in enumerate(body)}
    if full or turned:
        writer = _Writer(elements, operands, "e", loads("q"))
        writer.names.update(totals)
        values = [writer.value(t) for _, t in full]
        matrices = [writer.value(untransposed(t)) for _, t in turned]
        folded = [(j, red, writer.value(red.args[0])) for j, red in enumerate(reductions) if red in trailing]
        place = (lambda k: f"out{k}[o * {lengths[k]} + r]") if vec == 1 else (lambda k: f"s{k}.v[u]")
        into_tile = (lambda k: f"tile{k}[slot][r]") if vec == 1 else (lambda k: f"s{k}.v[u]")
        inner = [f"{place(k)} = ct_store<{storage_type(t.dtype)}>({v});" for (k, t), v in zip(full, values)]
        inner += [f"{into_tile(k)} = ct_store<{storage_type(t.dtype)}>({v});" for (k, t), v in zip(turned, matrices)]
        inner += [_fold(red, j, element) for j, red, element in folded]
        lines += _row_pass(writer, index, n, width, vec, vectors - kept, across, "q", inner,
                           [(k, t.dtype, lengths[k]) for k, t in full] if vec > 1 else (), cached=cached,
                           tiles=[(k, t.dtype) for k, t in turned] if vec > 1 else ())
        for j, red, _ in folded:
            lines += _total(red, j, width, n)
            totals[red] = f"total{j}"
        read |= writer.read
        lines += _padding(padded, n)
    reduced = [(k, t) for k, t in enumerate(body) if t.shape != shape and t not in transposed and (k, t) not in padded]
    if reduced:
        writer = _Writer(row, operands, "w")
        writer.names.update(totals)
        values = [writer.value(t) for _, t in reduced]
        lines += ["  if (lane == 0) {"] + ["    " + s for s in writer.lines]
        lines += [f"    out{k}[o] = ct_store<{storage_type(t.dtype)}>({v});" for (k, t), v in zip(reduced, values)]
        lines.append("  }")
    if turned:  # a block's rows in groups of a row a warp, kept in shared memory, then written transposed
        groups = TRANSPOSED_ROWS // per_block
        first = f"(({index})blockIdx.x * {groups} + g) * {per_block}"
        head = [f"  const {index} o = {first} + threadIdx.x / {width};",
                f"  const unsigned int slot = g * {per_block} + threadIdx.x / {width};"]
    else:
        head = [f"  const {index} o = ({index}){block_index or 'blockIdx.x'} * {per_block} + threadIdx.x / {width};"]
    head += [f"  const unsigned lane = threadIdx.x % {width};"] + ([] if turned else [f"  if (o >= {rows}) return;"])
    if cached:
        head += _row_cache(operands, read & kept, index, n, width, vec, cached)
    if block_index is not None:
        return head + lines, -(-rows // per_block)
    if not turned:
        return finished_source("rows", "\n".join(head + lines) + "\n", body, operands, aliased, -(-rows // per_block),
                               (threads, 1, 1))
    tiles = ["  extern __shared__ __align__(16) unsigned char ct_rows[];"]
    tiles += [f"  auto tile{k} = reinterpret_cast<{storage_type(t.dtype)} (*)[{n}]>(ct_rows + {j * TRANSPOSED_ROWS * n});"
              for j, (k, t) in enumerate(turned)]
    loop = [f"  for (unsigned int g = 0; g < {groups}u; ++g) {{"] + ["  " + s for s in head + lines] + ["  }"]
    text = "\n".join(tiles + loop + _turned([(k, t.dtype) for k, t in turned], n, rows, threads)) + "\n"
    source = finished_source("rows", text, body, operands, aliased, rows // TRANSPOSED_ROWS, (threads, 1, 1))
    return replace(source, shared=len(turned) * TRANSPOSED_ROWS * n)
