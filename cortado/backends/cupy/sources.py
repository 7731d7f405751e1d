"""Which kernels compute a fused body: a row kernel, a fused reduction (one kernel, or two for split columns, with
the scratch between them), an elementwise kernel or several side by side; and the copy kernel.

    source = kernel_source(body, operands, aliased)   # -> Source(name, text, launch)
"""

from ...exprgraph.ops import parameter
from ...rules.fusion import REDUCTION_KERNEL, ROW_KERNEL, kernel_shape, row_shape
from ...rules.horizontal import Horizontal
from .codegen import elementwise_source, finished_source, horizontal_source, storage_type
from .reduction_kernels import partials_bytes, reduction_sources
from .row_kernels import row_source


def kernel_sources(body, operands, aliased=(), order=None, kernel=None):
    """The kernels computing the fused ``body`` (a tuple of output terms over ``in0, in1, ...``), in order (two for a
    split column reduction, whose last parameter is its scratch), as the ``kernel`` fusion decided (a fused term's
    attribute; for a body of one's own, ``rules.fusion.kernel_shape`` decides); ``order``, for an elementwise body,
    as ``elementwise_source``'s."""
    kernel = kernel_shape(body) if kernel is None else kernel
    if isinstance(kernel, Horizontal):
        return [horizontal_source(body, operands, aliased, kernel.spans())]
    if kernel == ROW_KERNEL:
        return [row_source(body, operands, aliased, row_shape(body))]
    if kernel == REDUCTION_KERNEL:
        return reduction_sources(body, operands, aliased)
    return [elementwise_source(body, operands, aliased, order)]


def kernel_source(body, operands, aliased=(), order=None):
    """The one kernel computing ``body`` where it needs no scratch (every body but a split column reduction's)."""
    (source,) = kernel_sources(body, operands, aliased, order)
    return source


TILE = 32  # a transposing copy's tile: TILE x TILE words (of 4 bytes, or one element where wider) through shared
TILE_ROWS = 8  # memory, by TILE x TILE_ROWS threads


def copy_source(operand, order=None):
    """The kernel writing ``operand``'s elements contiguously, in order (a reshape no view can be, a
    strided output leaving the arena), or packed with its axes in ``order`` (an image copied channels last).
    A matrix stored transposed (a float8 GEMM's operand, which cuBLASLt reads only with the contracted axis
    innermost) is copied by tiles, each read and written a row at a time: element by element, every read of a warp
    fell in a row of its own, and a float8 copy of 25 MB took 0.2 ms."""
    element = parameter(0, operand)
    if order is None and _stored_transposed(operand):
        return _transposing_copy(element, operand)
    return kernel_source((element,), [operand], order=order)


def _stored_transposed(operand):
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


def _transposing_copy(element, operand):
    """``operand`` (rows x cols, stored column by column) written row by row, a tile at a time. Each thread reads a
    ``per`` x ``per`` block of elements as ``per`` words (``per`` consecutive elements of a column each), transposes
    it in registers and keeps it as ``per`` words of rows in shared memory, from which whole words are written: a
    byte at a time through shared memory, a float8 copy ran at about half the memory's speed. A word's place in its
    tile row is turned by the row's block, so that neither the writes nor the reads of a warp meet in one bank."""
    rows, cols = operand.shape
    per = _per_word(operand)
    side = TILE * per
    word = f"ct_vec<{storage_type(operand.dtype)}, {per}>"
    text = (f"  __shared__ {word} tile[{side}][{TILE}];\n"
            f"  const unsigned int r0 = blockIdx.x * {side}u, c0 = blockIdx.y * {side}u, x = threadIdx.x;\n"
            f"  for (unsigned int i = threadIdx.y; i < {TILE}u; i += {TILE_ROWS}u) {{\n"
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
            f"      for (int u = 0; u < {per}; ++u) tile[x * {per}u + u][(i + x) % {TILE}u] = t[u];\n"
            f"    }}\n"
            f"  }}\n"
            f"  __syncthreads();\n"
            f"  for (unsigned int k = threadIdx.y; k < {side}u; k += {TILE_ROWS}u) {{\n"
            f"    const unsigned int r = r0 + k, c = c0 + x * {per}u;\n"
            f"    if (r < {rows}u && c < {cols}u)\n"
            f"      *reinterpret_cast<{word}*>(out0 + (size_t)r * {cols}u + c) = tile[k][(x + k / {per}u) % {TILE}u];\n"
            f"  }}\n")
    grid = (-(-rows // side), -(-cols // side), 1)
    return finished_source("transpose", text, (element,), [operand], (), grid, (TILE, TILE_ROWS, 1))


def reduction_scratch_bytes(body, operands, kernel=None):
    """The bytes of the partial sums a split column reduction of ``body`` over ``operands`` keeps between its two
    kernels (0: not split, or no reduction at all); ``kernel`` as ``kernel_sources``'s."""
    if (kernel_shape(body) if kernel is None else kernel) != REDUCTION_KERNEL:
        return 0
    return partials_bytes(body, operands)

