"""CUDA C for the ops that gather by index terms, ``take`` and ``take_along_axis``: one thread per output element
(``window_kernels.gather``), which reads its index and then the element it names. A signed index counts from the
end when negative, as NumPy's, an unsigned one never does (a uint64 past 2**63 is past the end), and one outside
its axis is clamped into it, so a kernel never reads out of bounds (on the CPU such an index is an error:
``exprgraph.gathering``).

A ``take`` of whole rows (an embedding's lookup: the elements after ``axis`` contiguous, a whole number of 16-byte
vectors each, every row starting on one) moves a 16-byte vector a thread instead: on an H200 the GPT's lookup of
8192 rows of 768 bfloat16 values took 20 us an element a thread.
"""

import math

from .codegen import VECTOR_BYTES, Operand, contiguous_strides
from .window_kernels import gather, offset


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
