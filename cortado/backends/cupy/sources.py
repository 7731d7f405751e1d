"""Which kernels compute a fused body: a row kernel, a fused reduction (one kernel, or two for split columns, with
the scratch between them) or an elementwise kernel; and the copy kernel.

    source = kernel_source(body, operands, aliased)   # -> Source(name, text, launch)
"""

from ...exprgraph.graph import post_order
from ...exprgraph.ops import parameter
from .codegen import REDUCTIONS, elementwise_source
from .reduction_kernels import partials_bytes, reduction_sources
from .row_kernels import row_shape, row_source


def kernel_sources(body, operands, aliased=(), order=None):
    """The kernels computing the fused ``body`` (a tuple of output terms over ``in0, in1, ...``), in order (two for a
    split column reduction, whose last parameter is its scratch); ``order``, for an elementwise body, as
    ``elementwise_source``'s."""
    shape = row_shape(body)
    if shape is not None:
        return [row_source(body, operands, aliased, shape)]
    if any(t.op in REDUCTIONS for t in post_order(body)):
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


def reduction_scratch_bytes(body):
    """The bytes of the partial sums a split column reduction keeps between its two kernels (0: not split, or no
    reduction at all)."""
    if row_shape(body) is not None or not any(t.op in REDUCTIONS for t in post_order(body)):
        return 0
    return partials_bytes(body)
