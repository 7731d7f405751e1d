"""NumPy's own inner loops of its transcendental ufuncs, called from C: the same function ``np.exp(x, out=y)`` runs on
each stretch of elements, so its bits, without a Python call, on as few elements as a loop nest needs at a time (a
head's scores, kept in cache between the products around them; half of a fused region's elements, on a thread of its
own).

A ufunc object holds, for each of its type signatures, the address of its one-dimensional loop (the SIMD variant
NumPy chose for this CPU when it was imported) and that loop's data (``PyUFuncObject.functions``/``.data``). The
object's layout is read through the fields before them, checked against what the ufunc says of itself (its name,
its numbers of operands and signatures); the loop found is then checked against the ufunc itself, bit for bit, on
values that take every path (infinities, NaNs, overflow, underflow, subnormals), whole and cut into stretches at odd
places. Where anything differs the loop is not used.
"""

import ctypes
import functools
import hashlib

import numpy as np

from .standins import may_share_memory


class _UfuncHead(ctypes.Structure):
    """The fields of NumPy's ``PyUFuncObject`` up to its types."""

    _fields_ = [("refcount", ctypes.c_ssize_t), ("type", ctypes.c_void_p), ("nin", ctypes.c_int), ("nout", ctypes.c_int),
                ("nargs", ctypes.c_int), ("identity", ctypes.c_int), ("functions", ctypes.c_void_p),
                ("data", ctypes.c_void_p), ("ntypes", ctypes.c_int), ("reserved", ctypes.c_int),
                ("name", ctypes.c_char_p), ("types", ctypes.c_void_p)]


# the C type of a loop: (char** args, const npy_intp* dimensions, const npy_intp* steps, void* data)
C_SIGNATURE = "void (*)(char**, const long*, const long*, void*)"
_LOOP = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ssize_t),
                         ctypes.POINTER(ctypes.c_ssize_t), ctypes.c_void_p)


@functools.cache
def unary(ufunc, dtype):
    """``(loop address, data address)`` of ``ufunc``'s loop from ``dtype`` to ``dtype``, checked; None where it
    cannot be found or differs from the ufunc."""
    dtype = np.dtype(dtype)
    if ctypes.sizeof(ctypes.c_long) != ctypes.sizeof(ctypes.c_ssize_t) or ufunc.nin != 1 or ufunc.nout != 1:
        return None
    head = _UfuncHead.from_address(id(ufunc))
    if (head.name or b"").decode() != ufunc.__name__ or (head.nin, head.nout, head.nargs, head.ntypes) != (
            1, 1, 2, ufunc.ntypes) or not head.functions or not head.types:
        return None
    types = ctypes.string_at(head.types, 2 * head.ntypes)
    for i in range(head.ntypes):
        if types[2 * i] == types[2 * i + 1] == dtype.num:
            function = ctypes.c_void_p.from_address(head.functions + i * ctypes.sizeof(ctypes.c_void_p)).value
            data = ctypes.c_void_p.from_address(head.data + i * ctypes.sizeof(ctypes.c_void_p)).value if head.data else None
            found = function, data or 0
            return found if function and _agrees(ufunc, dtype, found) else None
    return None


def _agrees(ufunc, dtype, found):
    """Whether the loop ``found`` gives ``ufunc``'s bits, over the whole of a test array and over stretches of it."""
    rng = np.random.default_rng(0)
    info = np.finfo(dtype)
    x = (rng.standard_normal(3000) * 10.0 ** rng.uniform(-3, 2.5, 3000)).astype(dtype)
    x[:12] = [np.inf, -np.inf, np.nan, 0.0, -0.0, info.max, -info.max, info.tiny, info.smallest_subnormal, 1.0, -1.0,
              np.log(info.max)]
    with np.errstate(all="ignore"):
        expected = ufunc(x)
    out = np.empty_like(x)
    call = _LOOP(found[0])
    for start, stop in ((0, len(x)), (0, 5), (5, 21), (21, 1000), (1000, 2999), (2999, 3000)):
        arguments = (ctypes.c_void_p * 2)(x.ctypes.data + start * x.itemsize, out.ctypes.data + start * x.itemsize)
        call(arguments, (ctypes.c_ssize_t * 1)(stop - start), (ctypes.c_ssize_t * 2)(x.itemsize, x.itemsize),
             found[1] or None)
    return np.array_equal(out.view(np.uint8), expected.view(np.uint8))


def call_text(loop, data, source, into, count, dtype):
    """C statements calling the loop at the C pointer ``loop`` with its ``data`` on ``count`` contiguous elements of
    ``dtype`` from the C pointer ``source`` into ``into`` (addresses pass as pointers, so the text is the same in
    every process and its library is cached)."""
    size = np.dtype(dtype).itemsize
    return (f"{{ char* ct_args[2] = {{(char*)({source}), (char*)({into})}}; const long ct_n = {count}; "
            f"const long ct_steps[2] = {{{size}, {size}}};\n"
            f"  (({C_SIGNATURE})({loop}))(ct_args, &ct_n, ct_steps, {data}); }}\n")


def piece(ufunc, x, out):
    """``(name, C source, pointers)`` of ``ufunc(x, out=out)`` as one call of its loop (``unary``) on all the elements
    of ``x`` and ``out`` (both C-ordered, of one shape and dtype, the same elements or none in common), as NumPy calls
    it; None elsewhere."""
    if (x.shape != out.shape or x.dtype != out.dtype or not x.flags.c_contiguous or not out.flags.c_contiguous
            or x.size == 0 or (x.ctypes.data != out.ctypes.data and may_share_memory(x, out))):
        return None
    found = unary(ufunc, x.dtype)
    if found is None:
        return None
    text = "{\n  " + call_text("p[0]", "p[1]", "p[2]", "p[3]", x.size, x.dtype) + "}\n"
    name = "loop_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}", [found[0], found[1], x, out]
