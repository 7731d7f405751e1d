"""Attention and its gradient as one C function a call: ``attending``'s blockwise computation one head (one element of
the lead axes) at a time instead of all heads at once, so that a head's scores stay in cache from the product that
makes them to the products that read them.

``attending`` multiplies a block's stacks of matrices with one ``np.matmul``, which makes one BLAS call a head; here
each head's product is the CPU's own (``gemm.call``) where it has them, its bits otherwise than NumPy's in rounding
only, else the same BLAS call from C (``blas.call``), with ``attending``'s bits. A block's exponentials are NumPy's own
loop (``loops.unary``) on the head's scores. Its row sums (the scores times a column of ones: one ``?gemv`` over all
heads' rows) are the same ``?gemv`` on the head's rows, checked to give the same sums at the call's shape
(``rows_summed_per_head``); the gradient's ``einsum`` of each row of ``dP * P`` is NumPy's einsum loop written out
(``_einsum_model``), checked against ``np.einsum`` at the call's shape (``einsum_rows_agree``). Every other step is
elementwise, in C, in the same order of operations. Where a check fails, NumPy's BLAS would take another path (a
product of one row, column or term; a matrix times its own transpose) or the sequence needs many blocks, the
attention stays ``attending``'s.
"""

import contextlib
import ctypes
import functools
import math

import numpy as np

from ...exprgraph import attending
from . import blas, csource, gemm, loops, native

MAX_BLOCKS = 8  # blocks of queries written out in one function; a longer sequence stays NumPy's
COL_MAJOR = 102  # CBLAS's enumeration: NumPy's gemv passes a row-major matrix as the transpose of a column-major one


def extra_size(q, k):
    """Elements of scratch the C takes beyond ``attending``'s: each head's row sums and einsums of a block, and a
    row of ones."""
    return 2 * math.prod(q.shape[:-2]) * attending.block_rows(q, k) + k.shape[-2]


@functools.cache
def rows_summed_per_head(dtype, lead, rows, keys):
    """``?gemv``'s ``(address, integer C type is 64 bits)`` where, called on each head's ``rows`` of ``keys`` scores,
    on OpenBLAS's threads and on one (``blas.one_thread``), it gives ``attending._row_sums``'s sums of all heads'
    rows (NumPy's one ``?gemv`` over them) bit for bit on random scores; else None."""
    found = blas.entry(dtype, "gemv")
    if found is None:
        return None
    integer = ctypes.c_int64 if found[1] else ctypes.c_int32
    scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    call = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, integer, integer, scalar, ctypes.c_void_p, integer,
                            ctypes.c_void_p, integer, scalar, ctypes.c_void_p, integer)(found[0])
    s = np.random.default_rng(0).random(lead + (rows, keys)).astype(dtype)
    expected = attending._row_sums(s).reshape(-1, rows)
    ones, sums = np.ones(keys, dtype), np.empty(rows, dtype)
    for threads in (contextlib.nullcontext(), blas.one_thread()):
        with threads:
            for head, scores in zip(expected, s.reshape(-1, rows, keys)):
                call(COL_MAJOR, blas.TRANS, keys, rows, 1.0, scores.ctypes.data, keys, ones.ctypes.data, 1, 0.0,
                     sums.ctypes.data, 1)
                if not np.array_equal(sums.view(np.uint8), head.view(np.uint8)):
                    return None
    return found


def _lanes(dtype):
    return 16 // np.dtype(dtype).itemsize  # NumPy's einsum loops are its baseline's: 128-bit vectors


def _einsum_model(a, b):
    """NumPy's einsum of each row of ``a`` times the same row of ``b`` (2-D arrays), as ``_einsum_text``'s C computes
    it: the products added into a vector of lanes, four vectors a step (the last first), each product rounded before
    it is added; the last, partial vector padded with zeros; the lanes added pairwise; the total added to 0."""
    lanes, (rows, keys) = _lanes(a.dtype), a.shape
    acc = np.zeros((rows, lanes), a.dtype)
    i = 0
    while keys - i >= 4 * lanes:
        for j in (3, 2, 1, 0):
            part = slice(i + j * lanes, i + (j + 1) * lanes)
            acc = a[:, part] * b[:, part] + acc
        i += 4 * lanes
    for start in range(i, keys, lanes):
        padded = np.zeros((2, rows, lanes), a.dtype)
        padded[0, :, :keys - start], padded[1, :, :keys - start] = a[:, start:start + lanes], b[:, start:start + lanes]
        acc = padded[0] * padded[1] + acc
    while acc.shape[1] > 1:
        acc = acc[:, 0::2] + acc[:, 1::2]
    return a.dtype.type(0) + acc[:, 0]


@functools.cache
def einsum_rows_agree(dtype, shape):
    """Whether ``np.einsum("...ij,...ij->...i")`` of two C-ordered arrays of ``shape`` gives ``_einsum_model``'s bits
    on random values."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    expected = np.einsum("...ij,...ij->...i", a, b).reshape(-1)
    found = _einsum_model(a.reshape(-1, shape[-1]), b.reshape(-1, shape[-1]))
    return np.array_equal(expected.view(np.uint8), found.view(np.uint8))


def _einsum_text(c, lanes, rows, keys):
    """C of ``_einsum_model``: ``dots[i]``, the sum of row ``i`` of ``ds`` times row ``i`` of ``s``."""
    step = 4 * lanes
    products = "".join(f"        acc[l] = a[j + {u * lanes} + l] * b[j + {u * lanes} + l] + acc[l];\n" for u in (3, 2, 1, 0))
    pairs, width = "", lanes
    while width > 1:
        pairs += f"    for (int l = 0; l < {width // 2}; ++l) acc[l] = acc[2 * l] + acc[2 * l + 1];\n"
        width //= 2
    return (f"  for (long i = 0; i < {rows}L; ++i) {{\n"
            f"    const {c}* a = ds + i * {keys}L; const {c}* b = s + i * {keys}L;\n"
            f"    {c} acc[{lanes}] = {{0}};\n    long j = 0;\n"
            f"    for (; j + {step} <= {keys}L; j += {step})\n      for (int l = 0; l < {lanes}; ++l) {{\n{products}      }}\n"
            f"    for (; j < {keys}L; j += {lanes})\n"
            f"      for (int l = 0; l < {lanes}; ++l) acc[l] = (j + l < {keys}L ? a[j + l] * b[j + l] : ({c})0) + acc[l];\n"
            f"{pairs}    dots[i] = ({c})0 + acc[0];\n  }}\n")


def _head(a):
    """The first head's matrix of stack ``a``."""
    return a[(0,) * (a.ndim - 2)]


def _at(name, matrix, row):
    """The C pointer to row ``row`` of ``name``'s matrix (``matrix``: one of its shape and strides)."""
    return f"{name} + {row * matrix.strides[0] // matrix.itemsize}L"


class _Writer:
    """The C of one attention call: the statements of a head's blocks, and the shift functions they call."""

    def __init__(self, q, k, scale, causal, stacks):
        self.q, self.k, self.scale, self.causal = q, k, scale, causal
        self.stacks = stacks  # {C name: the stack of matrices it points into, a head at a time}
        self.c, self.keys, self.rows = csource.C_TYPES[q.dtype], k.shape[-2], attending.block_rows(q, k)
        self.shifts = []
        self.gemv = None
        self.parts = min(native.threads(), math.prod(q.shape[:-2]))  # the heads' parts, one a thread
        self.own = gemm.available()  # the heads' products the CPU's own, else NumPy's BLAS calls

    def product(self, a, b, out, pointers):
        """One head's ``a @ b`` into ``out`` (2-D matrices of its shapes and strides), at the C pointers ``pointers``:
        the CPU's own product (``gemm.call``) where it has them, else ``blas.call``; a ValueError where NumPy would not
        call ``?gemm``."""
        found = (gemm.call if self.own else blas.call)(a, b, out, "p[0]", pointers)
        if found is None:
            raise ValueError("not a gemm")
        return "  " + found

    def probabilities(self, start, stop, scratch):
        """C computing the block's probabilities into ``s`` (``attending._probabilities`` of one head)."""
        rows, keys, c = stop - start, self.keys, self.c
        lead = self.q.shape[:-2]
        gemv = rows_summed_per_head(self.q.dtype, lead, rows, keys)
        if gemv is None or not (self.own or _distinct(self.q[..., start:stop, :], self.k)):
            raise ValueError("not NumPy's calls")
        self.gemv = gemv
        q, s = _head(self.q), scratch[:rows * keys].reshape(rows, keys)
        scores = self.product(q[start:stop], _head(self.k).T, s, (_at("qh", q, start), "kh", "s"))
        shift = csource.scores_shift(s.shape, start, self.scale, self.causal, s.dtype)
        self.shifts.append(shift)
        integer = "long long" if gemv[1] else "int"
        signature = (f"void (*)(int, int, {integer}, {integer}, {c}, const {c}*, {integer}, const {c}*, {integer}, {c}, "
                     f"{c}*, {integer})")
        return (f"{scores}  {{ void* ct_s[1] = {{s}}; {shift[0]}(ct_s); }}\n"
                f"  {loops.call_text('p[2]', 'p[3]', 's', 's', rows * keys, s.dtype)}"
                f"  (({signature})p[1])({COL_MAJOR}, {blas.TRANS}, {keys}, {rows}, 1, s, {keys}, ones, 1, 0, sums, 1);\n"
                f"  for (long i = 0; i < {rows}L; ++i)\n    for (long j = 0; j < {keys}L; ++j) "
                f"s[i * {keys}L + j] = s[i * {keys}L + j] / sums[i];\n")

    def heads(self, body, scratch, zeroed=()):
        """C running ``body`` for each head of one part (``part``; heads are independent, each has its own scratch): its
        pointers ``<name>h`` set to the head's matrices of ``self.stacks``, ``scratch`` (``{name: elements a head}``)
        pointers to its part of the scratch of that name, ``sums`` and ``dots`` to its part of ``extra``; the matrices
        of ``zeroed`` (names) set to 0 first."""
        lead, rows = self.q.shape[:-2], self.rows
        heads, count = math.prod(lead), self.parts
        text = f"  for (long h = part * {heads}L / {count}; h < (part + 1) * {heads}L / {count}; ++h) {{\n"
        for d, n in enumerate(lead):
            text += f"    const long h{d} = h / {math.prod(lead[d + 1:])}L % {n}L;\n"
        for name, size in scratch.items():
            text += f"    {self.c}* {name} = {name}_all + h * {size}L;\n"
        text += f"    {self.c}* sums = extra + h * {2 * rows}L; {self.c}* dots = sums + {rows}L;\n"
        for name, stack in self.stacks.items():
            steps = [s // stack.itemsize for s in stack.strides[:-2]]
            offset = " + ".join(f"h{d} * {s}L" for d, s in enumerate(steps) if s) or "0"
            const = "" if name.startswith(("d", "out")) else "const "
            text += f"    {const}{self.c}* {name}h = {name} + {offset};\n"
        for name in zeroed:
            m = _head(self.stacks[name])
            text += (f"    for (long i = 0; i < {m.shape[0]}L; ++i) for (long j = 0; j < {m.shape[1]}L; ++j) "
                     f"{name}h[i * {m.strides[0] // m.itemsize}L + j * {m.strides[1] // m.itemsize}L] = 0;\n")
        return text + body + "  }\n"

    def function(self, kind, header, body, arrays):
        """``(definitions, piece)``: the shift functions called, and the piece ``(name, C source, pointers)`` of a
        function filling ``extra``'s row of ones (the last of ``arrays``), then running ``header`` and ``body`` (each
        part of the heads, ``heads``) on the pool's threads (``ct_in_parts``), its pointers ``p[0..3]`` the gemm, the
        gemv, NumPy's exp loop and its data, then ``arrays``."""
        exp = loops.unary(np.exp, self.q.dtype)
        ones = f"{self.c}* ones = ({self.c}*)p[{len(arrays) + 3}] + {math.prod(self.q.shape[:-2]) * 2 * self.rows}L"
        name, source = csource.in_parts(kind, f"{{\n{header}{body}}}\n", self.parts,
                                        f"  {ones};\n  for (long j = 0; j < {self.keys}L; ++j) ones[j] = 1;\n")
        gemv = self.gemv[0] if self.gemv else 0  # none where the probabilities are given, not made
        product = gemm.address(self.q.dtype) if self.own else blas.gemm(self.q.dtype)[0]
        return self.shifts, (name, source, [product, gemv, exp[0], exp[1], *arrays])


def _distinct(first, second):
    """Whether no head's matrices of ``first`` and ``second`` start at the same element (NumPy calls ``?syrk`` for a
    matrix times its own transpose)."""
    lead = first.shape[:-2]
    return all(first[h].ctypes.data != second[h].ctypes.data for h in (np.ndindex(*lead) if lead else [()]))


def _usable(arrays, q, k):
    """Whether C computes this attention: one floating dtype, every stride a whole number of elements, every size
    above 0, few blocks, and NumPy's loops and BLAS at hand."""
    dtype, stacks = arrays[0].dtype, [a for a in arrays if a.ndim >= 2]
    return (dtype in csource.FLOATING and len({a.shape[:-2] for a in stacks}) == 1
            and all(a.dtype == dtype and a.size for a in arrays)
            and all(s % a.itemsize == 0 for a in arrays for s in a.strides)
            and len(list(attending.blocks(q, k))) <= MAX_BLOCKS
            and blas.gemm(dtype) is not None and loops.unary(np.exp, dtype) is not None)


def _pointers(c, names, first):
    """C declarations of ``names`` (first the inputs, read only) from ``p[first]`` on."""
    return "".join(f"  {'' if name.startswith(('d', 'out')) else 'const '}{c}* {name} = ({c}*)p[{first + i}];\n"
                   for i, name in enumerate(names))


def _scratch_pointers(c, names, first, heads, rows):
    """C declarations of the scratch ``names`` (``<name>_all``), then ``extra`` and its row of ones, from
    ``p[first]`` on."""
    text = "".join(f"  {c}* {name}_all = ({c}*)p[{first + i}];\n" for i, name in enumerate(names))
    return text + f"  {c}* extra = ({c}*)p[{first + len(names)}]; {c}* ones = extra + {heads * 2 * rows}L;\n"


def forward(out, q, k, v, scale, causal, scores, extra):
    """``(definitions, piece)`` of ``attending.attention_into(out, q, k, v, scale, causal, scores)`` in C (``extra``:
    ``extra_size`` more elements of scratch); None where it stays NumPy's."""
    if not _usable([out, q, k, v, scores, extra], q, k):
        return None
    writer = _Writer(q, k, scale, causal, {"q": q, "k": k, "v": v, "out": out})
    rows, keys = attending.block_rows(q, k), k.shape[-2]
    try:
        body = ""
        for start, stop in attending.blocks(q, k):
            s = scores[:(stop - start) * keys].reshape(stop - start, keys)
            o = _head(out)
            body += writer.probabilities(start, stop, scores)
            body += writer.product(s, _head(v), o[start:stop], ("s", "vh", _at("outh", o, start)))
    except ValueError:
        return None
    c = writer.c
    heads = math.prod(q.shape[:-2])
    header = _pointers(c, ["q", "k", "v", "out"], 4) + _scratch_pointers(c, ["s"], 8, heads, rows)
    return writer.function("attention", header, writer.heads(body, {"s": rows * keys}), [q, k, v, out, scores, extra])


def backward(dq, dk, dv, q, k, v, dout, scale, causal, scores, adjoints, partial, extra, given=False):
    """``(definitions, piece)`` of ``attending.attention_grad_into(dq, dk, dv, q, k, v, dout, scale, causal, scores,
    adjoints, partial, given=given)`` in C (``extra``: ``extra_size`` more elements of scratch); None where it stays
    NumPy's. ``given``: ``scores`` holds the forward's probabilities, read as they are."""
    arrays = [dq, dk, dv, q, k, v, dout, scores, adjoints, partial, extra]
    if not _usable(arrays, q, k):
        return None
    writer = _Writer(q, k, scale, causal, {"q": q, "k": k, "v": v, "g": dout, "dq": dq, "dk": dk, "dv": dv})
    rows, keys, c = attending.block_rows(q, k), k.shape[-2], csource.C_TYPES[q.dtype]
    lanes, scale_literal = _lanes(q.dtype), csource._literal(scale, q.dtype)
    body = ""
    try:
        for start, stop in attending.blocks(q, k):
            n = stop - start
            if not einsum_rows_agree(q.dtype, q.shape[:-2] + (n, keys)) or not (
                    writer.own or _distinct(dout[..., start:stop, :], v)):
                return None
            s, ds = scores[:n * keys].reshape(n, keys), adjoints[:n * keys].reshape(n, keys)
            part_v, part_k = partial[:keys * v.shape[-1]].reshape(keys, -1), partial[:keys * q.shape[-1]].reshape(keys, -1)
            g, qh, kh, vh, dqh = _head(dout)[start:stop], _head(q)[start:stop], _head(k), _head(v), _head(dq)[start:stop]
            body += "" if given else writer.probabilities(start, stop, scores)
            body += writer.product(s.T, g, part_v, ("s", _at("gh", _head(dout), start), "part"))
            body += _accumulate(c, "dvh", _head(dv))
            body += writer.product(g, vh.T, ds, (_at("gh", _head(dout), start), "vh", "ds"))
            body += _einsum_text(c, lanes, n, keys)
            body += (f"  for (long i = 0; i < {n}L; ++i)\n    for (long j = 0; j < {keys}L; ++j) {{\n"
                     f"      const long at = i * {keys}L + j;\n"
                     f"      ds[at] = ((ds[at] - dots[i]) * s[at]) * {scale_literal};\n    }}\n")
            body += writer.product(ds, kh, dqh, ("ds", "kh", _at("dqh", _head(dq), start)))
            body += writer.product(ds.T, qh, part_k, ("ds", _at("qh", _head(q), start), "part"))
            body += _accumulate(c, "dkh", _head(dk))
    except ValueError:
        return None
    heads = math.prod(q.shape[:-2])
    header = (_pointers(c, ["q", "k", "v", "g", "dq", "dk", "dv"], 4)
              + _scratch_pointers(c, ["s", "ds", "part"], 11, heads, rows))
    scratch = {"s": rows * keys, "ds": rows * keys, "part": keys * max(q.shape[-1], v.shape[-1])}
    return writer.function("attention_grad", header, writer.heads(body, scratch, zeroed=("dk", "dv")),
                           [q, k, v, dout, dq, dk, dv, scores, adjoints, partial, extra])


def _accumulate(c, name, matrix):
    """C adding ``part`` (C-ordered, of ``matrix``'s shape) into the head's matrix ``name`` (``matrix``'s strides)."""
    (rows, cols), (r, col) = matrix.shape, (s // matrix.itemsize for s in matrix.strides)
    return (f"  for (long i = 0; i < {rows}L; ++i)\n    for (long j = 0; j < {cols}L; ++j) "
            f"{name}[i * {r}L + j * {col}L] = {name}[i * {r}L + j * {col}L] + part[i * {cols}L + j];\n")
