"""Which kernels compute a fused body: a row kernel, a fused reduction (one kernel, or two for split columns, with
the scratch between them), an elementwise kernel or several side by side; and the copy kernel.

    source = kernel_source(body, operands, aliased)   # -> Source(name, text, launch)
"""

from ...exprgraph.ops import parameter
from ...rules.fusion import REDUCTION_KERNEL, ROW_KERNEL, kernel_shape, row_shape
from ...rules.horizontal import Horizontal
from .codegen import elementwise_source, horizontal_source
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


def copy_source(operand, order=None):
    """The kernel writing ``operand``'s elements contiguously, in order (a reshape no view can be, a
    strided output leaving the arena), or packed with its axes in ``order`` (an image copied channels last)."""
    return kernel_source((parameter(0, operand),), [operand], order=order)


def reduction_scratch_bytes(body, kernel=None):
    """The bytes of the partial sums a split column reduction keeps between its two kernels (0: not split, or no
    reduction at all); ``kernel`` as ``kernel_sources``'s."""
    return partials_bytes(body) if (kernel_shape(body) if kernel is None else kernel) == REDUCTION_KERNEL else 0

