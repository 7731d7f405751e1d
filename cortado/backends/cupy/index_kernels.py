"""CUDA C for the ops that gather by index terms, ``take`` and ``take_along_axis``: one thread per output element
(``window_kernels.gather``), which reads its index and then the element it names. An index counts from the end
when negative, as NumPy's, and one outside its axis is clamped into it, so a kernel never reads out of bounds (on
the CPU such an index is an error: ``exprgraph.gathering``).
"""

from .window_kernels import gather, offset


def _place(index, size):
    """Statements setting ``p``, the place along an axis of ``size`` that ``index`` (an expression) names."""
    return [f"    long long p = (long long)({index});",
            f"    p = p < 0 ? p + {size} : p;",
            f"    p = p < 0 ? 0 : (p > {size - 1} ? {size - 1} : p);"]


def take_source(operand, indices, out, axis):
    """``out`` = ``operand``'s elements at ``indices`` along ``axis``: output coordinates ``axis ..`` are the indices'
    own, the rest the operand's."""
    count = len(indices.shape)
    index = f"in1[{offset(indices.strides, lambda a: f'c{axis + a}')}]"

    def source(a):
        return "p" if a == axis else f"c{a}" if a < axis else f"c{a + count - 1}"

    return gather("take", [operand, indices], out, _place(index, operand.shape[axis]) +
                  [f"    out0[i] = in0[{offset(operand.strides, source)}];"])


def take_along_axis_source(operand, indices, out, axis):
    """``out`` = ``operand``'s elements along ``axis`` at the places ``indices`` hold, the two broadcast against each
    other off ``axis`` (an axis of size 1 is read at 0)."""

    def at(shape):
        return lambda a: "0" if shape[a] == 1 else f"c{a}"

    index = f"in1[{offset(indices.strides, at(indices.shape))}]"
    here = at(operand.shape)
    return gather("take_along_axis", [operand, indices], out, _place(index, operand.shape[axis]) +
                  [f"    out0[i] = in0[{offset(operand.strides, lambda a: 'p' if a == axis else here(a))}];"])
