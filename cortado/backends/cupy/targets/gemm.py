"""cuBLASLt's GEMMs: ``gemm`` terms (``lowering/gemm.py``'s rules build them), each one call with its epilogue, the bias
gradient it makes written through the bias pointer, the gelu argument it keeps through the auxiliary pointer; the
operands it reads from copies, and the products it computes padded (below)."""

import math

from ..calls.cublaslt import Gemm, GemmCall, matrix
from ..codegen import VECTOR_BYTES, Operand, contiguous_strides, in_c_order
from ..layout import TENSOR_CORE_DTYPES
from ..lowering.gemm_op import GELU_ARGUMENT_RESULTS, GEMM, gemm_operands
from . import Target
from .library import LibraryCall

# cuBLASLt's tensor-core kernels load and store 16 bytes at a time (``VECTOR_BYTES``); a product whose operands or
# result have rows that are not whole 16-byte vectors (a vocabulary of 63 in bfloat16) runs on older kernels of one
# element a load, even with its rows padded: on an H200, in the GPT large step, the (8192, 768) x (768, 63) bfloat16
# product took 22.6 us, and the (63, 768) gradient from 8192 rows 25 us + 2.6 of split-K sums (with rows of 64
# apart, 24.2 and 25.9 + 2.8: ``benchmarks/results/h200/experiments/padded_rows/``). Such a product of at least
# ``PADDED_PRODUCT`` multiply-adds is computed with those dimensions padded instead (``gemm_padding``; the head's
# three products 28 us against 62, at GPT-2's vocabulary of 50257 5.37 ms against 15.38:
# ``benchmarks/results/h200/experiments/padded_dimensions/``), where it multiplies at least
# ``PADDED_MACS_PER_BYTE`` times for each byte its copies write: an H200 multiplies about 100 bfloat16 values in
# the time it copies a byte, so the copies then take no longer than the product. A smaller product, or one of
# few sums for its bytes (a head applied to one token: the whole weight copied for a sum a row), would spend more
# on its copies than it saves.
PADDED_PRODUCT = 1 << 27
PADDED_MACS_PER_BYTE = 128


def gemm_copies(t, strides):
    """The operands of gemm ``t`` that cuBLASLt cannot read where they are, each with its copy's C-order strides, and,
    where the product's dimensions are padded (``gemm_padding``), its padded shape: zeros after the value."""
    a, b, c, bias, aux = gemm_operands(t.args, t.attr("beta"), t.attr("epilogue"))
    batch = t.shape[:-2]
    copies = {x: (contiguous_strides(x.shape),) for x in (a, b) if matrix(x.shape, strides[x], batch) is None}
    copies.update({x: (contiguous_strides(x.shape),) for x in (c, bias, aux)
                   if x is not None and not in_c_order(x.shape, strides[x])})
    padding = gemm_padding(t, strides)
    if padding is not None:
        copies.update({x: (contiguous_strides(padded), padded) for x, padded in _padded_copies(t, strides, padding)})
    return tuple((x, *copy) for x, copy in copies.items())


def gemm_padding(t, strides):
    """``(m, n, k)`` of gemm ``t``'s product with each dimension that some operand (read at ``strides``) or the product
    holds along its rows rounded up to a whole ``VECTOR_BYTES`` vector, where one is not (a vocabulary of 63): the
    operands are copied with zeros after them (``gemm_copies``: those padded, and any read with rows not whole
    vectors apart) and the product, where padded, is written whole in the workspace, then packed
    (``gemm_padded_result``); a padded row or column adds zeros to no sum that is kept; a ``c`` it adds is copied
    padded too. None where the product runs as it is: one of fewer than ``PADDED_PRODUCT`` multiply-adds or of fewer
    than ``PADDED_MACS_PER_BYTE`` for each byte the copies would write, not over bfloat16 or float16, batched, or with
    an epilogue (a bias, a bias gradient, the gelu's argument are as long as the product's own rows or columns)."""
    attrs = t.attrs
    a, b = t.args[:2]
    if t.dtype not in TENSOR_CORE_DTYPES or attrs.epilogue != "none" or t.ndim != 2 or a.ndim != 2 or b.ndim != 2:
        return None
    m, n = t.shape
    k = a.shape[0] if attrs.transpose_a else a.shape[1]
    if m * n * k < PADDED_PRODUCT:
        return None
    inner = {"n", _along_rows(a, strides[a], ("k", "m") if attrs.transpose_a else ("m", "k")),
             _along_rows(b, strides[b], ("n", "k") if attrs.transpose_b else ("k", "n"))}
    per_vector = VECTOR_BYTES // t.dtype.itemsize
    padding = tuple(-(-size // per_vector) * per_vector if name in inner else size
                    for name, size in zip("mnk", (m, n, k)))
    if padding == (m, n, k):
        return None
    written = sum(math.prod(padded) for _, padded in _padded_copies(t, strides, padding))
    written += math.prod(padding[:2]) if padding[:2] != (m, n) else 0
    return padding if m * n * k >= PADDED_MACS_PER_BYTE * written * t.dtype.itemsize else None


def _along_rows(x, strides, names):
    """Which of ``names`` (the product's dimensions along ``x``'s two axes) ``x`` holds along its rows as cuBLASLt
    reads it: its last axis, or its first where it is stored transposed (a copy is stored in C order)."""
    read = matrix(x.shape, strides, ())
    return names[0] if read is not None and read[0] else names[1]


def _padded_copies(t, strides, padding):
    """``(operand, its padded shape)`` for each operand of gemm ``t`` that its product padded to ``padding`` reads as a
    copy: padded, or read with rows that are not whole ``VECTOR_BYTES`` vectors apart."""
    m, n, k = padding
    attrs = t.attrs
    a, b, c = gemm_operands(t.args, attrs.beta, attrs.epilogue)[:3]
    shapes = ((a, (k, m) if attrs.transpose_a else (m, k)), (b, (n, k) if attrs.transpose_b else (k, n)), (c, (m, n)))
    return [(x, padded) for x, padded in shapes
            if x is not None and (padded != x.shape or not _whole_vector_rows(x, strides[x]))]


def _whole_vector_rows(x, strides):
    """Whether cuBLASLt reads matrix ``x`` where it is at ``strides`` with its rows whole ``VECTOR_BYTES`` vectors
    apart (every buffer starts ``ALIGNMENT`` bytes aligned)."""
    read = matrix(x.shape, strides, ())
    return read is not None and read[1] * x.dtype.itemsize % VECTOR_BYTES == 0


def gemm_padded_result(t, padding):
    """``(strides, shape)`` of gemm ``t``'s product as it writes it in its workspace, padded to ``padding``
    (``gemm_padding``), before a copy packs it where it belongs; None where it writes its product in place."""
    if padding is None or padding[:2] == t.shape:
        return None
    return contiguous_strides(padding[:2]), padding[:2]


def gemm_call(t, strides, tf32, padding=None):
    """The ``GemmCall`` of gemm term ``t``, its operands stored at ``strides``; of the product padded to ``padding``
    (``gemm_padding``: ``(m, n, k)``, its product and operands' copies C-order blocks of that padding), where
    given."""
    a, b = t.args[:2]
    attrs = t.attrs
    shape, a_shape, b_shape = t.shape, a.shape, b.shape
    if padding is not None:
        m, n, k = padding
        shape = (m, n)
        a_shape = (k, m) if attrs.transpose_a else (m, k)
        b_shape = (n, k) if attrs.transpose_b else (k, n)
    return GemmCall(Operand(a_shape, a.dtype, strides[a]), Operand(b_shape, b.dtype, strides[b]), shape, t.dtype,
                    attrs.transpose_a, attrs.transpose_b, attrs.alpha, attrs.beta, attrs.epilogue, tf32)


def _runner(kernel, view):
    t, terms = kernel.term, kernel.terms
    a, b, c, bias, aux = gemm_operands(t.args, t.attrs.beta, t.attrs.epilogue)

    second = terms[1] if len(terms) > 1 else None  # a bias gradient, or the gelu's argument
    kept = t.attrs.epilogue in GELU_ARGUMENT_RESULTS

    def arguments(placed, workspace):
        bias_address = placed[bias] if bias is not None else placed[second] if second is not None and not kept else None
        aux_address = placed[aux] if aux is not None else placed[second] if kept else None
        return (placed[a], placed[b], placed[c if c is not None else t], placed[t], workspace, bias_address, aux_address)

    padding = gemm_padding(t, view.strides)
    written = gemm_padded_result(t, padding)
    return LibraryCall(kernel, view, gemm_copies(t, view.strides),
                       lambda reads: Gemm(gemm_call(t, reads, view.options["tf32"], padding)), arguments,
                       t.attrs.epilogue, written=None if written is None else (t, *written))


TARGET = Target("gemm", (GEMM,), _runner, reusable=True)
