"""CUDA C for the window ops that move elements between a tensor and its border or windows: ``pad`` (and
crop), ``flip`` and ``overlap_add``, and the columns a convolution as GEMM multiplies (``im2col``,
``calls.conv_im2col``). ``windows`` needs none: it is a strided view (``layout``).

Each is a gather over its output, one thread per element: the thread finds, by constant index
arithmetic, the input elements its output element comes from. ``overlap_add`` so sums the taps of
every window that covers the element, in a fixed order, with no atomics: the result is the same
bits every run. float16 and bfloat16 sums are taken in float32 and rounded once, as the reference
takes them.
"""

import math

from .codegen import THREADS, Operand, compute_type, finished_source, literal, storage_type


def coordinates(shape):
    """Statements giving ``c0, c1, ...``, the coordinates of the flat output index ``i`` in ``shape``."""
    lines, inner = [], 1
    for axis in reversed(range(len(shape))):
        lines.append(f"    const long long c{axis} = (i / {inner}) % {shape[axis]};")
        inner *= shape[axis]
    return lines


def offset(strides, coordinate):
    return " + ".join(f"({coordinate(a)}) * {s}" for a, s in enumerate(strides) if s) or "0"


def gather(kind, operands, out, statements, extra=None):
    """A kernel over ``out``'s elements (a term or anything with ``shape`` and ``dtype``) reading ``operands``
    (``in0, in1, ...``, and ``extra``, a last parameter's declaration) and running ``statements`` for each, with
    ``i`` its flat index and ``c0, c1, ...`` its coordinates. The loop runs once a thread but where the grid is
    capped, and is not unrolled: unrolled, working out its trip count (a division by the grid's size) and its
    remainder cost more than an element's work."""
    n = math.prod(out.shape)
    lines = ["  const long long stride = (long long)gridDim.x * blockDim.x;", "  #pragma unroll 1",
             f"  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {n}; i += stride) {{"]
    lines += coordinates(out.shape) + statements + ["  }"]
    blocks = max(1, min(-(-n // THREADS), 1 << 20))
    return finished_source(kind, "\n".join(lines) + "\n", [out], list(operands), (), blocks, (THREADS, 1, 1), extra)


def pad_source(operand, out, lows, value):
    """``out`` = ``operand`` placed at ``lows`` along each axis (negative: cropped), ``value`` elsewhere."""
    sources = [f"c{a} - ({low})" for a, low in enumerate(lows)]
    inside = " && ".join(f"(c{a} >= {low} && c{a} < {low + n})" for a, (low, n) in enumerate(zip(lows, operand.shape)))
    fill = literal(value, out.dtype)
    read = f"ct_load(in0[{offset(operand.strides, lambda a: sources[a])}])"
    statements = [f"    out0[i] = ct_store<{storage_type(out.dtype)}>(({inside or 'true'}) ? {read} : "
                  f"({compute_type(out.dtype)})({fill}));"]
    return gather("pad", [operand], out, statements)


def flip_source(operand, out, axes):
    """``out`` = ``operand`` with its elements in reverse order along ``axes``."""
    sources = [f"{n - 1} - c{a}" if a in axes else f"c{a}" for a, n in enumerate(operand.shape)]
    statements = [f"    out0[i] = in0[{offset(operand.strides, lambda a: sources[a])}];"]
    return gather("flip", [operand], out, statements)


def overlap_add_source(operand, out, strides, dilation):
    """``out`` = the windows ``operand`` (``lead + counts + window``) added where ``windows`` took them: each output
    element the sum, over each tap of the window, of the window that puts that tap on it (if one does)."""
    count = len(strides)
    lead = len(out.shape) - count
    counts, window = operand.shape[lead:lead + count], operand.shape[lead + count:]
    acc = compute_type(out.dtype)
    statements = [f"    {acc} acc = ({acc})0;"]
    depth = "    "
    positions = []
    for k, (size, stride, d, taps) in enumerate(zip(counts, strides, dilation, window)):
        axis = lead + k
        statements += [f"{depth}#pragma unroll", f"{depth}for (int t{k} = 0; t{k} < {taps}; ++t{k}) {{",
                       f"{depth}  const long long q{k} = c{axis} - t{k} * {d};",
                       f"{depth}  if (q{k} < 0 || q{k} % {stride} != 0 || q{k} / {stride} >= {size}) continue;"]
        positions.append(f"q{k} / {stride}")
        depth += "  "
    coordinates = [f"c{a}" for a in range(lead)] + positions + [f"t{k}" for k in range(count)]
    statements.append(f"{depth}acc += ct_load(in0[{offset(operand.strides, lambda a: coordinates[a])}]);")
    for _ in range(count):
        depth = depth[:-2]
        statements.append(f"{depth}}}")
    statements.append(f"    out0[i] = ct_store<{storage_type(out.dtype)}>(acc);")
    return gather("overlap_add", [operand], out, statements)


def im2col_source(images, window, strides, lows, dilation, counts):
    """The columns of ``images`` (``(B, C, *spatial)``, read where they lie): a ``(C * taps, B * positions)``
    row-major matrix whose element ``((c, *tap), (b, *position))`` is ``images[b, c, position * strides - lows +
    tap * dilation]``, zero where that falls in the padding; ``window`` is the taps per axis, ``counts`` the
    positions per axis."""
    count = len(window)
    batch, channels = images.shape[:2]
    out = Operand((channels, *window, batch, *counts), images.dtype, ())
    taps = [f"c{1 + a}" for a in range(count)]
    positions = [f"c{2 + count + a}" for a in range(count)]
    sources = [f"({p}) * {s} - ({low}) + ({t}) * {d}" for p, t, s, low, d in zip(positions, taps, strides, lows, dilation)]
    statements = [f"    const long long x{a} = {source};" for a, source in enumerate(sources)]
    inside = " && ".join(f"x{a} >= 0 && x{a} < {n}" for a, n in enumerate(images.shape[2:]))
    coordinates = [f"c{1 + count}", "c0"] + [f"x{a}" for a in range(count)]
    read = f"in0[{offset(images.strides, lambda a: coordinates[a])}]"
    zero = f"ct_store<{storage_type(images.dtype)}>(({compute_type(images.dtype)})0)"
    statements.append(f"    out0[i] = ({inside}) ? {read} : {zero};")
    return gather("im2col", [images], out, statements)
