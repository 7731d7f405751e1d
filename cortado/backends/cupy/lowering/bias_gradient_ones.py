"""``ones_into_writers``: a weight gradient's bias gradient as more columns of its product, its input padded with
ones by the kernel that writes that input, instead of cuBLASLt's BGRAD epilogue.

The bias gradient of ``y = x @ W^T + b`` is the column sums of ``dy``, the very sums the weight gradient
``dy^T @ x`` makes against a column of ones: ``dy^T @ [x, 1]`` is the weight gradient and, in its last columns, the
bias gradient. BGRAD instead reads ``dy`` again after the product (``by_ones`` has the figures). After
recomputation, a layer norm's output is made again for the weight gradient of the product after it by the layer
norm's input-gradient kernel (a row kernel, ``memplan.copy_hosts``), and a gelu's output for the weight gradient
after it by gelu's backward kernel (elementwise, ``gemm._beside_gelu``); only that weight gradient reads it. That
kernel writes its rows with ``ones_columns`` ones after each (``rules.fusion.padded_rows``), and the weight
gradient's product and bias gradient are views of the one product of the padded rows. Nothing reads ``dy`` twice.

    roots, made = ones_into_writers(roots, trace, kept)   # after ``memplan.copy_hosts.into_row_kernels``
"""

from ....exprgraph import constructors as ct
from ....exprgraph.dtypes import is_narrow_float
from ....exprgraph.graph import post_order, readers_of
from ....exprgraph.ops import FUSED_OP, PARAM, RESHAPE, parameter
from ....exprgraph.term import make
from ....rules.engine import Rewrite
from ....rules.fusion import ELEMENTWISE_KERNEL, ROW_KERNEL, row_shape, transposed_outputs
from ....rules.scalar_epilogues import fused_kernels, kernel_key, substitution
from .gemm_op import GEMM, gemm, gemm_parts


# the columns of ones a weight gradient's input may be padded with (``ones_columns``), each column making the same
# sums: 32, so that rows of a multiple of 32 bfloat16 or float16 values start 64-byte aligned (from 8192 rows on an
# H200, (out x in) 2304 x 768 took 45.8 us against 47.6 with 8 columns, 768 x 768 21.3 against 22.1, 3072 x 768 55.9
# against 56.6, 768 x 3072 53.4 against 54.6, ``benchmarks/results/h200/experiments/bias_gradient_ones/ones.txt``),
# or 8, one 16-byte vector (cuBLASLt's alignment)
ONES_COLUMNS = (32, 8)


def by_ones(g, summed):
    """Whether weight gradient ``g`` (``dy^T @ x``, or ``x^T @ dy``) may take the sums of ``dy``'s columns, which
    cuBLASLt's ``bgrad_{summed}`` epilogue would make, from more columns (rows) of its product, ``x`` padded with
    columns of ones (``ones_into_writers``): BGRAD reads ``dy`` again after the product, the ones
    cost the product at most a few columns. On an H200, from 8192 rows of bfloat16, (out x in) 3072 x 768 took
    55.7 us alone, 75.6 with BGRAD and 56.6 with the ones; 2304 x 768 44.0, 59.8 and 47.6; 768 x 3072 55.0, 62.1
    and 54.6; 768 x 768 18.9, 26.7 and 22.1 (``benchmarks/results/h200/experiments/bias_gradient_ones/``). Only over
    bfloat16 and float16, whose products by one are exact in the float32 accumulator, so that the sums are of the
    same terms, added in another order; only at scale 1 (the sums would be scaled too); only where ``ones_columns``
    has a count for ``x``'s width."""
    parts = gemm_parts(g)
    side = "b" if summed == "a" else "a"
    x = parts[side]
    x_last = not parts["transpose_b"] if side == "b" else parts["transpose_a"]  # x stored (rows, its width)
    return (is_narrow_float(g.dtype) and x_last and parts["alpha"] == 1.0 and parts["c"] is None and x.ndim == 2
            and ones_columns(x.shape[-1]) is not None)


def ones_columns(width):
    """The columns of ones after rows of ``width`` (``ONES_COLUMNS``): the most that keep the padded rows as aligned
    as the rows and are at most an eighth of them (the arena grows by no more); None where none is."""
    return next((n for n in ONES_COLUMNS if width % n == 0 and width >= 8 * n), None)


def _crop(value, widths):
    """A view of ``value`` cropped by negative pad ``widths`` (``layout.crop_offset``): a fused kernel of one pad."""
    body = (ct.pad(parameter(0, value), widths),)
    return make(FUSED_OP, (value,), (body, 0, False, ELEMENTWISE_KERNEL))


def _rows_written(x, results, readers):
    """``(kernel result, its body's index)`` where operand ``x`` of a gemm whose ``results`` are its product and its
    bias gradient (or the reshape of it merging leading axes that ``x`` is) is read by them alone, as one operand, and
    is a row-shaped, not transposed result of a row kernel, or a result of an elementwise kernel (of at most three
    axes), computed there (not a copy of an operand); else None."""
    written = x.args[0] if x.op is RESHAPE and x.args[0].shape[-1] == x.shape[-1] else x
    if readers.get(x) != set(results) or sum(a is x for a in results[0].args) != 1:
        return None
    if written.op is not FUSED_OP or written.attr("kernel") not in (ROW_KERNEL, ELEMENTWISE_KERNEL) \
            or written.attr("again"):
        return None
    body, index = written.attr("outputs"), written.attr("index")
    rows = row_shape(body) if written.attr("kernel") == ROW_KERNEL else body[index].shape
    if readers.get(written) != ({x} if x is not written else set(results)) or body[index].op is PARAM \
            or body[index].shape != rows or body[index] in transposed_outputs(body) or len(rows) > 3:
        return None  # (an elementwise kernel of images may write them channels last: not padded)
    return written, index


def ones_into_writers(roots, trace, kept=frozenset()):
    """``(roots, made)`` (``made``: each old term's new one, ``rules.scalar_epilogues.substitution``), ``roots`` with
    each weight gradient that ``by_ones`` allows, whose input is a row or elementwise kernel's
    result that only it reads (``_rows_written``), taking its bias gradient from more columns (rows) of its product,
    that kernel writing the input with columns of ones after its own; where every reader of its results is a
    generated kernel, neither they nor that input are roots, and neither they nor that kernel's results are in
    ``kept`` (terms others refer to)."""
    roots = tuple(roots)
    order = post_order(roots)
    readers = readers_of(order)
    kernels, _ = fused_kernels(roots)
    sums = {(g.args, g.attrs[:5]): g for g in order if g.op is GEMM and g.attr("output") == 1}
    replaced, taken = {}, set()
    for g in order:
        if g.op is not GEMM or g.attr("output") != 0 or g.attr("epilogue") not in ("bgrad_a", "bgrad_b"):
            continue
        summed = g.attr("epilogue")[-1]
        side = "b" if summed == "a" else "a"
        bias = sums.get((g.args, g.attrs[:5]))
        parts = gemm_parts(g)
        x = parts[side]
        found = None if bias is None else _rows_written(x, (g, bias), readers)
        if found is None or not by_ones(g, summed) or \
                any(r.op is not FUSED_OP for t in (g, bias) for r in readers.get(t, ())):
            continue
        written, index = found
        key = kernel_key(written)
        if key in taken or {g, bias, written, x} & set(roots) or {g, bias, *kernels[key]} & kept:
            continue
        taken.add(key)
        body = list(key[1])
        row = body[index]
        ones = ones_columns(x.shape[-1])
        body[index] = ct.pad(row, ((0, 0),) * (row.ndim - 1) + ((0, ones),), constant_values=1)
        kind = written.attr("kernel")
        new = {t: make(FUSED_OP, key[0], (tuple(body), t.attr("index"), False, kind)) for t in kernels[key]}
        replaced.update(new)
        padded_x = ct.reshape(new[written], x.shape[:-1] + (x.shape[-1] + ones,))
        product = gemm(**{**parts, "epilogue": "none", side: padded_x})
        m, n = g.shape
        if summed == "a":
            replaced[g] = _crop(product, ((0, 0), (0, -ones)))
            replaced[bias] = ct.reshape(_crop(product, ((0, 0), (-n, 1 - ones))), bias.shape)
        else:
            replaced[g] = _crop(product, ((0, -ones), (0, 0)))
            replaced[bias] = ct.reshape(_crop(product, ((-m, 1 - ones), (0, 0))), bias.shape)
        trace.append(Rewrite("gemm-bias-gradient-ones", bias, replaced[bias]))
    return substitution(roots, replaced) if replaced else (roots, {})
