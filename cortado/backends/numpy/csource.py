"""The C of one fused region of elementwise ops: a loop nest over its outputs' shape, each element's body computed in
registers from its operands, read at their own strides (0 along a broadcast axis), as NumPy would compute it op by op.

Only float32 and float64 values (and the bools of comparisons, and int32 and int64 values read and compared with
their own kind: a label with each class's index) take part, and only ops whose C gives NumPy's bits:
arithmetic and ``sqrt`` (correctly rounded in both), ``abs``, ``maximum``/``minimum``/``relu`` (NaN wins, as in
NumPy), comparisons, ``where`` and casts between them, so a program computes what the reference does, bit for bit.
The transcendentals stay NumPy's, its own loops called from C between loop nests (``fused._native``, ``loops``):
glibc's vector ``tanhf`` ran at NumPy's speed but differs from it by an ulp, and its scalar one is 45 times slower.
Any other term makes the region NumPy's (``loop_nest`` gives None).
"""

import functools
import hashlib
import math

import numpy as np

from ...exprgraph.graph import post_order
from ...exprgraph.ops import (
    ABS, ADD, BROADCAST_TO, CAST, CONST, DIVIDE, EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, MAXIMUM, MINIMUM,
    MEAN, MULTIPLY, NEGATIVE, NOT_EQUAL, PARAM, RELU, SQRT, SUBTRACT, SUM, WHERE,
)

C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.bool_): "unsigned char"}
FLOATING = (np.dtype(np.float32), np.dtype(np.float64))
# integers a loop nest reads and compares with integers of their own dtype (a label with each class's index), exactly as
# NumPy compares them; no other op takes them
INTEGERS = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}
COMPARISONS = frozenset({LESS, LESS_EQUAL, GREATER, GREATER_EQUAL, EQUAL, NOT_EQUAL})
INFIX = {ADD: "+", SUBTRACT: "-", MULTIPLY: "*", DIVIDE: "/", LESS: "<", LESS_EQUAL: "<=", GREATER: ">",
         GREATER_EQUAL: ">=", EQUAL: "==", NOT_EQUAL: "!="}
INLINE = {SQRT: "sqrt", ABS: "fabs"}  # instructions, correctly rounded, no library call
MAX_MIN = {MAXIMUM: "ct_max", MINIMUM: "ct_min"}


def _suffix(dtype):
    return "f" if dtype == np.float32 else ""


def _literal(value, dtype):
    value = np.asarray(value).astype(dtype)
    if dtype == np.bool_:
        return "1" if value else "0"
    if dtype in INTEGERS:
        return f"(({INTEGERS[dtype]}){int(value)}LL)"
    number = float(value)
    if np.isnan(number):
        return "(0.0/0.0)" if dtype == np.float64 else "(0.0f/0.0f)"
    if np.isinf(number):
        return ("-" if number < 0 else "") + ("(1.0/0.0)" if dtype == np.float64 else "(1.0f/0.0f)")
    return number.hex() + _suffix(dtype)  # exact: a hexadecimal literal


def _expression(t, operand):
    """The C expression of term ``t`` from its operands' C names (``operand(a)``), or None if it has none here."""
    if any(x.dtype in INTEGERS for x in t.args) and (t.op not in COMPARISONS or t.args[0].dtype != t.args[1].dtype):
        return None
    if t.op not in COMPARISONS and t.op is not CAST and (t.dtype not in FLOATING or any(
            x.dtype != t.dtype for x in t.args[t.op is WHERE:])):
        return None  # C's arithmetic on bytes is no bool's (True + True is 2), nor a float's division of bools
    a = [operand(x) for x in t.args]
    f = _suffix(t.dtype)
    if t.op in INFIX:
        return f"({a[0]} {INFIX[t.op]} {a[1]})"
    if t.op is NEGATIVE:
        return f"(-{a[0]})"
    if t.op in MAX_MIN:
        return f"{MAX_MIN[t.op]}{f}({a[0]}, {a[1]})"
    if t.op is RELU:
        return f"ct_max{f}({a[0]}, 0)"
    if t.op is WHERE:
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if t.op is CAST:
        return f"({a[0]} != 0)" if t.dtype == np.bool_ else f"(({C_TYPES[t.dtype]}){a[0]})"
    if t.op in INLINE:
        return f"__builtin_{INLINE[t.op]}{f}({a[0]})"
    return None


def _c_type(dtype):
    """The C type of a value of ``dtype`` a loop nest holds (``C_TYPES``, ``INTEGERS``), or None."""
    return C_TYPES.get(dtype) or INTEGERS.get(dtype)


def _collapsed(shape, strides_of):
    """The loop nest's axes: ``shape`` without its axes of 1, neighbours merged where every array steps through them
    as one; ``(sizes, [strides of each array])``."""
    axes = [d for d, n in enumerate(shape) if n != 1]
    sizes, strides = [shape[d] for d in axes], [[s[d] for d in axes] for s in strides_of]
    d = len(sizes) - 2
    while d >= 0:
        if all(s[d] == s[d + 1] * sizes[d + 1] for s in strides):
            sizes[d:d + 2] = [sizes[d] * sizes[d + 1]]
            for s in strides:
                s[d:d + 2] = [s[d + 1]]
        d -= 1
    return sizes, strides


def _element_strides(array, shape):
    """``array``'s strides in elements over ``shape`` (right-aligned, 0 where broadcast); None where a stride is no
    whole number of elements."""
    lead = len(shape) - array.ndim
    strides = [0] * lead
    for n, step in zip(array.shape, array.strides):
        if step % array.itemsize:
            return None
        strides.append(0 if n == 1 else step // array.itemsize)
    return strides


# the innermost trip count from which a loop nest asks for vectorization (``omp simd``): GCC 12 on this machine's
# AVX-512, forced to vectorize a loop of 4 (a pooling window's elements), made it 20-40 times slower than its own
# choice (a select of 131072 values: 480 against 12 us), 1.5 times slower at 8 and 16, the same from 64 on
SIMD_MOST_USEFUL = 64


def _between(targets, sources):
    """The terms that compute ``targets`` from ``sources``, each after its operands."""
    order, seen = [], set(sources)

    def visit(t):
        if t in seen:
            return
        seen.add(t)
        for a in t.args:
            visit(a)
        order.append(t)

    for t in targets:
        visit(t)
    return order


def loop_nest(targets, sources, shape):
    """``(name, C source, arrays)`` of one loop nest over ``shape`` that computes each target term into its array
    (``targets``: ``(term, array)`` pairs) from the arrays of ``sources`` (``{term: array}``: a region's operands,
    values computed before), called with the ``arrays``' addresses in that order (the sources it reads, then the
    targets'); None where a term between them is not one this C computes."""
    if any(a.shape != shape or a.dtype not in C_TYPES for _, a in targets) or not all(a.size for _, a in targets):
        return None
    order = _between([t for t, _ in targets], sources)
    read = [t for t in dict.fromkeys(a for u in order for a in u.args) if t in sources]
    read += [t for t, _ in targets if t in sources and t not in read]
    arrays = [sources[t] for t in read] + [a for _, a in targets]
    strides = [_element_strides(a, shape) for a in arrays]
    if any(s is None for s in strides) or any(_c_type(a.dtype) is None for a in arrays):
        return None
    sizes, steps = _collapsed(shape, strides)
    index = [f"i{d}" for d in range(len(sizes))]

    def place(k):
        terms = [f"{i} * {s}" for i, s in zip(index, steps[k]) if s]
        return " + ".join(terms) or "0"

    names = {t: f"a{k}[{place(k)}]" for k, t in enumerate(read)}
    # the loop a value is computed in: the innermost along which something it reads moves (-1: before every loop),
    # so that a value broadcast along the inner loops (a pooling window's count) is computed once, not per element
    depth = {t: max((d for d, step in enumerate(steps[k]) if step), default=-1) for k, t in enumerate(read)}
    lines = []
    for t in order:
        if _c_type(t.dtype) is None:
            return None
        if t.op is BROADCAST_TO:
            names[t], depth[t] = names[t.args[0]], depth[t.args[0]]
            continue
        if t.op is CONST:
            if t.attr("value").scalar is None:
                return None
            names[t], depth[t] = _literal(t.attr("value").scalar, t.dtype), -1
            continue
        expression = _expression(t, names.__getitem__) if t.op is not PARAM and t.dtype in C_TYPES else None
        if expression is None:
            return None
        names[t], depth[t] = f"v{len(lines)}", max(depth[a] for a in t.args)
        lines.append((depth[t], f"const {C_TYPES[t.dtype]} {names[t]} = {expression};"))
    innermost = len(sizes) - 1
    mixed = _mixes_widths(arrays, order) or _reads_backwards(arrays)
    lines += [(innermost, f"o{k}[{place(len(read) + k)}] = {names[t]};") for k, (t, _) in enumerate(targets)]
    pointers = [f"const {_c_type(sources[t].dtype)}* a{k} = (const {_c_type(sources[t].dtype)}*)p[{k}];"
                for k, t in enumerate(read)]
    pointers += [f"{C_TYPES[a.dtype]}* o{k} = ({C_TYPES[a.dtype]}*)p[{len(read) + k}];"
                 for k, (_, a) in enumerate(targets)]
    text = f"{{\n  {' '.join(pointers)}\n" + "".join(f"  {line}\n" for d, line in lines if d < 0)
    for d, n in enumerate(sizes):
        indent = "  " * (d + 1)
        text += f"{indent}#pragma omp simd\n" if d == innermost and n >= SIMD_MOST_USEFUL and not mixed else ""
        text += f"{indent}for (long i{d} = 0; i{d} < {n}L; ++i{d}) {{\n"
        text += "".join(f"{indent}  {line}\n" for at, line in lines if at == d)
    text += "".join("  " * (d + 1) + "}\n" for d in reversed(range(len(sizes)))) + "}\n"
    name = "region_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"{'CT_NOT_VECTORIZED ' if mixed else ''}void {name}(void* const* p) {text}", arrays


def _mixes_widths(arrays, terms):
    """Whether a loop nest holds both float and double values: it is then compiled unvectorized (``CT_NOT_VECTORIZED``,
    no ``omp simd``). GCC 12.2 at -O3 with AVX2 vectorized such nests of a few constant trips wrongly: a 3 x 3
    ``where(x64 < x32, -x64, x64)``, x32 broadcast along its rows, left two elements unwritten, and 71 of 120 small
    nests comparing or adding float and double values came out wrong, where none of one width did."""
    return len({a.dtype for a in arrays if a.dtype in FLOATING} | {t.dtype for t in terms if t.dtype in FLOATING}) > 1


def _reads_backwards(arrays):
    """Whether a loop nest reads an array at a negative stride (``x[:, ::-1]``): it is then compiled unvectorized, as
    ``_mixes_widths`` says. GCC 12.2 at -O3 vectorized ``where(y > 0, y, x[:, ::-1])`` over rows of 2 to 16 wrongly,
    rows reversed or shifted onto others, where the same C at -O2 was right."""
    return any(stride < 0 for a in arrays for stride in a.strides)


def region(outputs, args, outs):
    """``loop_nest`` of a whole fused region: body ``outputs`` from ``args`` (its operands, by ``param`` index) into
    ``outs``."""
    sources = {t: args[t.attr("index")] for t in post_order(outputs) if t.op is PARAM}
    return loop_nest(list(zip(outputs, outs)), sources, outs[0].shape)


def leading_sum(x, axes, out):
    """``(name, C source, arrays)`` of ``np.add.reduce(x, axis=axes, out=out)`` where ``axes`` lead and ``x`` is
    stored in C order: NumPy then adds the rows of the kept elements to 0 one after another (so a sum of negative
    zeros is +0), and so does this loop, row by row, vectorized along the row. None elsewhere: a reduction to one
    element sums pairwise, and other layouts in other orders."""
    rows = math.prod(x.shape[:len(axes)])
    kept = x.size // max(rows, 1)
    if (tuple(axes) != tuple(range(len(axes))) or x.dtype not in FLOATING or out.dtype != x.dtype or kept < 2
            or rows < 1 or not x.flags.c_contiguous or not out.flags.c_contiguous or out.size != kept):
        return None
    c = C_TYPES[x.dtype]
    simd = "  #pragma omp simd\n" if kept >= SIMD_MOST_USEFUL else ""
    text = (f"{{\n  const {c}* x = (const {c}*)p[0]; {c}* out = ({c}*)p[1];\n"
            f"{simd}  for (long j = 0; j < {kept}L; ++j) out[j] = ({c})0 + x[j];\n"
            f"  for (long r = 1; r < {rows}L; ++r) {{\n  {simd}"
            f"    for (long j = 0; j < {kept}L; ++j) out[j] = out[j] + x[r * {kept}L + j];\n  }}\n}}\n")
    name = "leading_sum_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}", [x, out]


PAIRWISE_BLOCK = 128  # NumPy's pairwise sum: eight running sums up to this many elements, halves beyond


def _pairwise(row):
    """NumPy's pairwise sum of ``row`` (a 1-d array), in its dtype, as ``ct_pairwise`` computes it in C."""
    zero = row.dtype.type(0)
    if len(row) < 8:
        total = zero
        for value in row:
            total = total + value
        return total
    if len(row) <= PAIRWISE_BLOCK:
        sums, i = list(row[:8]), 8
        while i < len(row) - len(row) % 8:
            sums = [s + v for s, v in zip(sums, row[i:i + 8])]
            i += 8
        total = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]))
        for value in row[i:]:
            total = total + value
        return total
    half = len(row) // 2
    half -= half % 8
    return _pairwise(row[:half]) + _pairwise(row[half:])


def _blocks(shape, axes):
    """``(outer, kept, inner)``: the elements of the reduced axes before the kept ones, of the kept ones, and of the
    reduced axes after them, where the kept axes are one run (none: a sum of every element, one run of them all);
    None where they are not."""
    kept = [a for a in range(len(shape)) if a not in axes]
    if not kept:
        return 1, 1, math.prod(shape)
    if kept != list(range(kept[0], kept[-1] + 1)):
        return None
    return math.prod(shape[:kept[0]]), math.prod(shape[kept[0]:kept[-1] + 1]), math.prod(shape[kept[-1] + 1:])


@functools.cache
def numpy_sums_pairwise(dtype):
    """Whether this NumPy's ``np.add.reduce`` of a C-ordered value over all but a run of its axes adds, for each kept
    element, the pairwise sums (``_pairwise``) of its run of elements after the kept axes to 0, one after another
    along the axes before them, and over all its axes the pairwise sum of all its elements to 0; checked bit for bit
    on runs of lengths around the pairwise block sizes."""
    rng = np.random.default_rng(0)
    for inner in (1, 5, 8, 13, 64, 127, 128, 129, 200, 300, 1000):
        x = (rng.standard_normal((3, 2, inner)) * 10.0 ** rng.uniform(-3, 3, (3, 2, inner))).astype(dtype)
        for axes, outer in (((2,), x[:1]), ((0, 2), x)):
            expected = np.add.reduce(outer, axis=axes)
            for k, total in enumerate(expected.reshape(-1)):
                found = x.dtype.type(0)
                for a in range(len(outer)):
                    found = found + _pairwise(outer[a, k])
                if found != total:
                    return False
        if np.add.reduce(x, axis=(0, 1, 2)) != x.dtype.type(0) + _pairwise(x.reshape(-1)):  # every element: one run
            return False
    return True


def blocked_sums(x, axes, out, mean):
    """``(name, C source, arrays)`` of a sum (``mean``: a mean) over all but a run of the axes of ``x`` stored in C
    order (a layer norm's rows, a batch norm's channels): for each kept element, the pairwise sums
    (``ct_pairwise``) of its elements after the kept axes added to 0 one after another along the axes before them,
    as NumPy adds them (``numpy_sums_pairwise``); a mean divided by the count in float64 as NumPy divides by an
    ``np.intp``. None elsewhere: where the reduced axes all lead (``leading_sum``), where one element is kept of
    several runs (NumPy then sums them as one run), or where this NumPy sums otherwise."""
    blocks = _blocks(x.shape, axes)
    if (blocks is None or blocks[2] == 1 or (blocks[1] == 1 and blocks[0] > 1) or x.dtype not in FLOATING
            or out.dtype != x.dtype or x.size == 0 or out.size != blocks[1] or not x.flags.c_contiguous
            or not out.flags.c_contiguous or not numpy_sums_pairwise(x.dtype)):
        return None
    (outer, kept, inner), c = blocks, C_TYPES[x.dtype]
    sums = (f"  for (long k = 0; k < {kept}L; ++k) out[k] = 0;\n"
            f"  for (long a = 0; a < {outer}L; ++a)\n    for (long k = 0; k < {kept}L; ++k)\n"
            f"      out[k] = out[k] + ct_pairwise{_suffix(x.dtype)}(x + (a * {kept}L + k) * {inner}L, {inner}L);\n")
    divide = f"  for (long k = 0; k < {kept}L; ++k) out[k] = ({c})((double)out[k] / (double){outer * inner});\n"
    text = f"{{\n  const {c}* x = (const {c}*)p[0]; {c}* out = ({c}*)p[1];\n{sums}{divide if mean else ''}}}\n"
    name = "blocked_sums_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}", [x, out]


def reduction(op, axes, x, out):
    """``leading_sum`` or ``blocked_sums`` of a sum or a mean (``op``) over ``axes`` of ``x`` into ``out``, or
    None."""
    if op is SUM:
        return leading_sum(x, axes, out) or blocked_sums(x, axes, out, mean=False)
    if op is MEAN:
        return blocked_sums(x, axes, out, mean=True)
    return None


def sequence(names):
    """``(name, C source)`` of one function calling the C functions ``names`` in turn, its ``k``-th pointer the
    address of the ``k``-th one's pointers: one call from Python instead of one each."""
    calls = "".join(f"  {name}((void* const*)p[{k}]);\n" for k, name in enumerate(names))
    name = "sequence_" + hashlib.sha256(calls.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {{\n{calls}}}\n"


def switch(selector, statements):
    """C running the ``k``-th of ``statements`` (each ending in ``;``) where ``selector`` is ``k``."""
    cases = "".join(f"    case {k}: {statement.strip()}\n      break;\n" for k, statement in enumerate(statements))
    return f"  switch ({selector}) {{\n{cases}  }}\n"


def in_parts(kind, part, parts, before=""):
    """``(name, C source)`` of a function running, after the statements ``before``, ``part`` (the body of a
    ``void part(void* const* p, long part)``) for parts 0 to ``parts - 1`` on the pool's threads (``native``'s
    ``ct_in_parts``)."""
    name = f"{kind}_" + hashlib.sha256(f"{parts}:{before}{part}".encode()).hexdigest()[:16]
    return name, (f"static void {name}_part(void* const* p, long part) {part}"
                  f"void {name}(void* const* p) {{\n{before}  ct_in_parts({name}_part, p, {parts});\n}}\n")


def _row_peak(c, suffix, keys):
    """C statements leaving in ``peak`` the max of ``row``'s ``keys`` values, 0 where that is not finite or one of them
    is NaN (``numerics.finite_peak`` of ``np.max``): the max of the others, which need not compare NaNs, vectorizes."""
    infinity = f"(1.0{suffix}/0.0{suffix})"
    return (f"    {c} peak = -{infinity};\n    int nan = 0;\n"
            f"    #pragma omp simd reduction(max:peak) reduction(|:nan)\n"
            f"    for (long j = 0; j < {keys}L; ++j) {{ peak = row[j] > peak ? row[j] : peak; nan |= row[j] != row[j]; }}\n"
            f"    if (nan || !((peak < 0 ? -peak : peak) < {infinity})) peak = 0;\n")


def rows_shifted(rows, keys, dtype):
    """``(name, C source)`` of the softmax family's shift over ``rows`` C-ordered rows of ``keys``: ``p[1] = p[0] -
    peak`` with each row's peak (``_row_peak``) written to ``p[2]``, in one pass a row instead of NumPy's five."""
    c, suffix = C_TYPES[np.dtype(dtype)], _suffix(np.dtype(dtype))
    text = (f"{{\n  const {c}* x = (const {c}*)p[0]; {c}* into = ({c}*)p[1]; {c}* peaks = ({c}*)p[2];\n"
            f"  for (long r = 0; r < {rows}L; ++r) {{\n    const {c}* row = x + r * {keys}L;\n"
            f"{_row_peak(c, suffix, keys)}    peaks[r] = peak;\n"
            f"    for (long j = 0; j < {keys}L; ++j) into[r * {keys}L + j] = row[j] - peak;\n  }}\n}}\n")
    name = "shifted_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}"


def scores_shift(shape, start, scale, causal, dtype):
    """``(name, C source)`` of ``attending.shift_scores`` over a block of scores of ``shape`` (``lead + (queries,
    keys)``, C order; its first query ``start``), in place and in one pass a row instead of NumPy's five: each score
    times ``scale`` rounded to ``dtype`` (as NumPy multiplies by a Python float), ``-inf`` past the row's own query
    where ``causal``, then less the row's peak (``_row_peak``)."""
    c, suffix = C_TYPES[np.dtype(dtype)], _suffix(np.dtype(dtype))
    queries, keys = shape[-2], shape[-1]
    rows = int(np.prod(shape[:-1]))
    mask = f"    for (long j = q + {start}L + 1; j < {keys}L; ++j) row[j] = -(1.0{suffix}/0.0{suffix});\n" if causal else ""
    text = (f"{{\n  {c}* s = ({c}*)p[0];\n"
            f"  for (long r = 0; r < {rows}L; ++r) {{\n    {c}* row = s + r * {keys}L;\n    const long q = r % {queries}L;\n"
            f"    for (long j = 0; j < {keys}L; ++j) row[j] = row[j] * {_literal(scale, dtype)};\n{mask}"
            f"{_row_peak(c, suffix, keys)}"
            f"    for (long j = 0; j < {keys}L; ++j) row[j] = row[j] - peak;\n  }}\n}}\n")
    name = "shift_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return name, f"void {name}(void* const* p) {text}"
