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


TILE = 32  # a transposing copy's tile: TILE x TILE elements through shared memory, by TILE x TILE_ROWS threads
TILE_ROWS = 8


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
    return operand.strides == (1, rows) and min(rows, cols) >= TILE and -(-cols // TILE) < 1 << 16


def _transposing_copy(element, operand):
    """``operand`` (rows x cols, stored column by column) written row by row, a tile at a time."""
    rows, cols = operand.shape
    c = storage_type(operand.dtype)
    text = (f"  __shared__ {c} tile[{TILE}][{TILE + 1}];\n"
            f"  const unsigned int r0 = blockIdx.x * {TILE}u, c0 = blockIdx.y * {TILE}u;\n"
            f"  for (unsigned int k = threadIdx.y; k < {TILE}u; k += {TILE_ROWS}u) {{\n"
            f"    const unsigned int r = r0 + threadIdx.x, col = c0 + k;\n"
            f"    if (r < {rows}u && col < {cols}u) tile[k][threadIdx.x] = in0[(size_t)col * {rows}u + r];\n"
            f"  }}\n"
            f"  __syncthreads();\n"
            f"  for (unsigned int k = threadIdx.y; k < {TILE}u; k += {TILE_ROWS}u) {{\n"
            f"    const unsigned int r = r0 + k, col = c0 + threadIdx.x;\n"
            f"    if (r < {rows}u && col < {cols}u) out0[(size_t)r * {cols}u + col] = tile[threadIdx.x][k];\n"
            f"  }}\n")
    grid = (-(-rows // TILE), -(-cols // TILE), 1)
    return finished_source("transpose", text, (element,), [operand], (), grid, (TILE, TILE_ROWS, 1))


def reduction_scratch_bytes(body, kernel=None):
    """The bytes of the partial sums a split column reduction keeps between its two kernels (0: not split, or no
    reduction at all); ``kernel`` as ``kernel_sources``'s."""
    return partials_bytes(body) if (kernel_shape(body) if kernel is None else kernel) == REDUCTION_KERNEL else 0

