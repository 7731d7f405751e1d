"""Which kernels compute a fused body: a row kernel, a fused reduction (one kernel, or two for split columns, with
the scratch between them), an elementwise kernel (writing some results transposed, or not) or several side by side;
and the copy kernel.

    source = kernel_source(body, operands, aliased)   # -> Source(name, text, launch)
"""

from ...exprgraph.ops import parameter
from ...rules.fusion import (
    REDUCTION_KERNEL, ROW_KERNEL, TRANSPOSED_KERNEL, TRANSPOSED_SUMS_KERNEL, kernel_shape, row_shape,
)
from ...rules.horizontal import Horizontal
from .codegen import elementwise_source
from .horizontal_kernels import horizontal_source
from .reduction_kernels import partials_bytes, reduction_sources
from .row_kernels import row_source
from .transposed_kernels import (
    stored_transposed, sum_partials_bytes, transposed_source, transposed_sum_sources, transposing_copy,
)


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
    if kernel == TRANSPOSED_KERNEL:
        return [transposed_source(body, operands, aliased)]
    if kernel == TRANSPOSED_SUMS_KERNEL:
        return transposed_sum_sources(body, operands, aliased)
    return [elementwise_source(body, operands, aliased, order)]


def kernel_source(body, operands, aliased=(), order=None):
    """The one kernel computing ``body`` where it needs no scratch (every body but a split column reduction's)."""
    (source,) = kernel_sources(body, operands, aliased, order)
    return source


def copy_source(operand, order=None):
    """The kernel writing ``operand``'s elements contiguously, in order (a reshape no view can be, a
    strided output leaving the arena), or packed with its axes in ``order`` (an image copied channels last).
    A matrix stored transposed (a float8 GEMM's operand, which cuBLASLt reads only with the contracted axis
    innermost) is copied by tiles (``transposed_kernels``): element by element, every read of a warp fell in a row
    of its own, and a float8 copy of 25 MB took 0.2 ms."""
    element = parameter(0, operand)
    if order is None and stored_transposed(operand):
        return transposing_copy(element, operand)
    return kernel_source((element,), [operand], order=order)


def reduction_scratch_bytes(body, operands, kernel=None):
    """The bytes of the partial sums a split column reduction of ``body`` over ``operands``, or a transposed kernel
    summing columns, keeps between its two kernels (0: not split, or no reduction at all); ``kernel`` as
    ``kernel_sources``'s."""
    kernel = kernel_shape(body) if kernel is None else kernel
    if kernel == TRANSPOSED_SUMS_KERNEL:
        return sum_partials_bytes(body)
    if kernel != REDUCTION_KERNEL:
        return 0
    return partials_bytes(body, operands)

