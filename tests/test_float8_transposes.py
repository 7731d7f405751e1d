"""A float8 product's operand that is the transpose of an elementwise kernel's float8 result, written transposed by
that kernel (``backends/cupy/lowering/float8_transposes``, ``transposed_kernels``) instead of copied by the call."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado import compiler
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy import sources
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.backends.cupy.transposed_kernels import TILE, TILE_ROWS
from cortado.backends.cupy.lowering.float8_op import FLOAT8_GEMM
from cortado.errors import BackendError
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import FUSED_OP, TRANSPOSE, parameter
from cortado.rules.fusion import TRANSPOSED_KERNEL, TRANSPOSED_SUMS_KERNEL
from float8_plans import assert_same_bits, float8_mlp_step
from reference_checks import skip_without_device

E4M3, E5M2, BF16 = (np.dtype(d) for d in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16))


def _planned(outputs, transposed=True, monkeypatch=None):
    if not transposed:
        monkeypatch.setattr(type(gpu_backend), "after_fusion", lambda self, roots, trace: roots)
    traces = {}
    return compiler._rewrite(outputs, gpu_backend, traces), traces["fusion"]


def _copied_operands(roots):
    """The float8 products' operands that are transposes of fused results: what their calls copy."""
    return [a for t in post_order(roots) if t.op is FLOAT8_GEMM for a in t.args[:2]
            if a.op is TRANSPOSE and any(s.op is FUSED_OP for s in post_order([a]))]


def test_a_float8_steps_casts_write_the_products_operands_transposed(monkeypatch):
    """The float8 MLP's step as the GPU plans it: every float8 operand a product reads transposed is written so by
    the kernel that casts it (the gradients' elementwise casts, the gelu's and the input's row kernels, which fold
    their rows' maxima too), so no product's call copies one, but the second weight's, whose cast runs side by side
    with other kernels at the step's start (``rules.horizontal``); the first layer's gradient, which only its weight
    gradient reads (the input needs none), is written only transposed. Every value is the bits of the plan
    without."""
    outputs, values, x, y = float8_mlp_step((256, 512, 256), (4, 128))
    ours, trace = _planned(outputs)
    apart, _ = _planned(outputs, transposed=False, monkeypatch=monkeypatch)
    assert sum(r.rule == "float8-operand-written-transposed" for r in trace) == 4
    assert len(_copied_operands(apart)) == 5 and [a.shape for a in _copied_operands(ours)] == [(512, 256)]
    writing = {(t.attr("kernel"), t.attr("outputs")) for t in post_order(ours)
               if t.op is FUSED_OP and any(o.op is TRANSPOSE for o in t.attr("outputs"))}
    assert sorted((kind, len(body), body[-1].dtype.name) for kind, body in writing) == [
        ("row", 3, "float8_e4m3fn"), ("row", 3, "float8_e4m3fn"),  # the gelu's rows and the input's: their maxima
        (TRANSPOSED_KERNEL, 2, "float8_e5m2"),
        (TRANSPOSED_SUMS_KERNEL, 4, "float32")]  # the first layer's gradient, its bias's gradient and AdamW step
    assert_same_bits(ours, apart, values, x, y)


def test_with_delayed_gradient_scales_each_gradient_is_cast_in_the_kernel_that_makes_it():
    """The float8 MLP's step with its gradients' scales delayed (``Linear(gradient_scaling="delayed")``): each
    gradient is cast to e5m2 by the row kernel that makes it, written transposed for its weight gradient there too,
    its rows' maxima folded for its history, so no kernel reads a gradient back to cast it and no product's call
    copies an operand but the second weight's. Every value is the bits of the plan without."""
    outputs, values, x, y = float8_mlp_step((256, 512, 256), (4, 128), gradient_scaling="delayed")
    with pytest.MonkeyPatch.context() as patch:
        ours, trace = _planned(outputs)
        apart, _ = _planned(outputs, transposed=False, monkeypatch=patch)
    assert [a.shape for a in _copied_operands(ours)] == [(512, 256)]
    writing = {(t.attr("kernel"), t.attr("outputs")) for t in post_order(ours)
               if t.op is FUSED_OP and any(o.op is TRANSPOSE for o in t.attr("outputs"))}
    assert sorted((kind, len(body), body[-1].dtype.name) for kind, body in writing) == [
        ("row", 3, "float8_e4m3fn"), ("row", 3, "float8_e4m3fn"),  # the gelu's rows and the input's
        ("row", 3, "float8_e5m2"),  # the first layer's gradient: bfloat16 for its bias, float8 transposed
        ("row", 4, "float8_e5m2")]  # the second's: bfloat16 for its bias, float8 and float8 transposed
    assert not [t for t in post_order(ours) if t.op is FUSED_OP and t.attr("kernel") in (TRANSPOSED_KERNEL,
                                                                                         TRANSPOSED_SUMS_KERNEL)]
    assert_same_bits(ours, apart, values, x, y)


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([16, 32, 48, 128]), st.sampled_from([16, 64, 96, 256]), st.sampled_from([16, 32]),
       st.sampled_from([(2, 16), (3, 32), (5, 16), (96,)]))
def test_float8_steps_of_any_sizes_keep_their_bits_with_their_operands_written_transposed(width, hidden, out, batch):
    """MLP steps of several sizes (the multiples of 16 cuBLASLt's float8 products take), rows and columns of whole
    tiles or not, rows of whole blocks or not, batches of one axis or two: the plan with the operands written
    transposed computes the bits of the plan without."""
    outputs, values, x, y = float8_mlp_step((width, hidden, out), batch)
    with pytest.MonkeyPatch.context() as patch:
        ours, trace = _planned(outputs)
        apart, _ = _planned(outputs, transposed=False, monkeypatch=patch)
    assert any(r.rule == "float8-operand-written-transposed" for r in trace)
    assert_same_bits(ours, apart, values, x, y)


def test_a_result_only_read_transposed_is_written_only_transposed():
    """``q^T @ y8``: both operands are read only transposed, so their casts write them only so."""
    x, y = ct.var("x", (512, 256), "bfloat16"), ct.var("y", (512, 128), "bfloat16")
    scale = ct.var("s", (), "float32")
    q = ct.cast(ct.cast(x, "float32") * scale, "float8_e5m2")
    y8 = ct.cast(ct.cast(y, "float32") * scale, "float8_e4m3fn")
    product = ct.cast(ct.matmul(ct.transpose(q), y8), "bfloat16")
    ours, trace = _planned([product])
    assert sum(r.rule == "float8-operand-written-transposed" for r in trace) == 2
    kernels = [t for t in post_order(ours) if t.op is FUSED_OP]
    assert kernels and all(len(t.attr("outputs")) == 1 and t.attr("outputs")[0].op is TRANSPOSE for t in kernels)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16),
             "y": rng.standard_normal(y.shape).astype(ml_dtypes.bfloat16), "s": np.float32(4.0)}
    np.testing.assert_array_equal(*(np.asarray(ct.evaluate(r, feeds)[0], np.float32) for r in (ours, [product])))


def test_the_kernel_writes_rows_and_their_transpose_a_tile_of_words_at_a_time():
    """A cast of a bfloat16 (8, 1024, 768) activation written as it is and transposed: 128 x 128 tiles, the
    activation read 4 elements at once, both results written 4 at once, the transposed ones through shared memory."""
    shape = (8, 1024, 768)
    operand = Operand(shape, BF16, contiguous_strides(shape))
    bias = Operand((768,), BF16, (1,))
    x, b = parameter(0, operand), parameter(1, bias)
    q = ct.cast(ct.cast(x, "float32") + ct.cast(b, "float32"), "float8_e4m3fn")
    (source,) = sources.kernel_sources((q, ct.transpose(ct.reshape(q, (8192, 768)))), [operand, bias])
    assert source.blocks == (768 // 128, 8192 // 128, 1) and source.block == (TILE, TILE_ROWS, 1) == (32, 16, 1)
    assert "ct_vec<__nv_bfloat16, 4>*>(in0 + (size_t)r * 768u + cb)" in source.text  # the activation, 8 bytes a load
    assert "in1[c]" in source.text  # the bias row, an element at a time
    assert "__shared__ ct_vec<__nv_fp8_e4m3, 4> tile1[128][32]" in source.text
    assert "(out1 + (size_t)c * 8192u + r)" in source.text and "(out0 + (size_t)r * 768u + cb)" in source.text


def test_a_transposed_kernel_refuses_what_it_cannot_write():
    """Not float8, or sides that are not whole words: a BackendError, never a kernel writing out of place."""
    for shape, dtype in (((64, 32), "bfloat16"), ((64, 30), "float8_e4m3fn")):
        operand = Operand(shape, np.dtype(np.float32), contiguous_strides(shape))
        q = ct.cast(parameter(0, operand), dtype)
        with pytest.raises(BackendError, match="whole words"):
            sources.kernel_sources((ct.transpose(q),), [operand])


def _rows_scaled(x):
    """Each row scaled to its largest magnitude and cast to float8, and the largest magnitude of each float8 row: a
    row kernel of two passes, both reductions maxima, which are the same bits in any order."""
    wide = ct.cast(x, "float32")
    y = ct.cast(wide * (400.0 / ct.max(ct.abs(wide), axis=-1, keepdims=True)), "float8_e4m3fn")
    return y, ct.max(ct.abs(ct.cast(y, "float32")), axis=-1, keepdims=True)


def test_a_row_kernel_writes_its_rows_transposed_a_block_of_rows_at_a_time():
    """A row kernel's float8 rows written as they are and transposed: a warp a row, eight warps two rows each into
    shared memory, then the block's 16 rows a column at a time; rows that are not whole blocks, or whose block would
    take more than 24 KiB of shared memory, are refused."""
    shape = (8, 1024, 768)
    operand = Operand(shape, BF16, contiguous_strides(shape))
    y, peak = _rows_scaled(parameter(0, operand))
    (source,) = sources.kernel_sources((y, peak, ct.transpose(ct.reshape(y, (8192, 768)))), [operand])
    assert source.blocks == 8192 // 16 and source.block == (256, 1, 1) and source.shared == 16 * 768
    assert "__launch_bounds__" not in source.text and "for (unsigned int g = 0; g < 2u; ++g)" in source.text
    assert "tile2 = reinterpret_cast<__nv_fp8_e4m3 (*)[768]>(ct_rows + 0)" in source.text
    assert "(out2 + (size_t)r * 8192u + blockIdx.x * 16u)" in source.text
    for shape in ((40, 64), (64, 3072)):  # rows that are not whole blocks; a block's rows past 24 KiB
        odd = Operand(shape, BF16, (shape[1], 1))
        y, peak = _rows_scaled(parameter(0, odd))
        with pytest.raises(BackendError, match="blocks of 16 whole rows"):
            sources.kernel_sources((y, peak, ct.transpose(y)), [odd])


def test_a_row_kernel_gives_every_lane_of_a_warp_as_many_vectors_of_its_row():
    """Rows cast to float8 take 16 elements a thread at a time (16 bytes of float8), but a row of 768 is then 48
    vectors, which leave half of the warp that takes it idle in its second turn: it takes vectors of 8 (96, three
    turns of every lane); rows of 1536 keep 16 (96 vectors), and so do rows of 3072 and 2304, which a block of 256
    threads takes (192 and 144 vectors, one turn)."""
    for n, width in ((768, 8), (1536, 16), (3072, 16), (2304, 16)):
        operand = Operand((4096, n), BF16, (n, 1))
        y, peak = _rows_scaled(parameter(0, operand))
        (source,) = sources.kernel_sources((y, peak), [operand])
        assert f"ct_vec<__nv_fp8_e4m3, {width}> s0;" in source.text, n


def test_a_row_kernel_whose_rows_are_read_only_transposed_stays_a_row_kernel():
    """Rows scaled to their largest magnitude, cast to float8 and read only transposed, the float8 rows' maxima
    returned: the kernel keeps the maxima and the transpose, a row kernel still (its rows are the transposed
    result's), which folds the maxima in the pass writing the rows; the values are the reference's."""
    x, z, s = ct.var("x", (256, 1024), "bfloat16"), ct.var("z", (256, 128), "bfloat16"), ct.var("s", (), "float32")
    y, peak = _rows_scaled(x)
    z8 = ct.cast(ct.cast(z, "float32") * s, "float8_e4m3fn")
    product = ct.cast(ct.matmul(ct.transpose(y), z8), "bfloat16")
    ours, _ = _planned([product, peak])
    rows = [t for t in post_order(ours) if t.op is FUSED_OP and t.attr("kernel") == "row"]
    assert rows and all(o.op.name != "cast" for t in rows for o in t.attr("outputs"))  # no rows written in order
    for t in rows:
        operands = [Operand(a.shape, a.dtype, contiguous_strides(a.shape)) for a in t.args]
        (source,) = sources.kernel_sources(t.attr("outputs"), operands, (), None, t.attr("kernel"))
        assert source.shared == 16 * 1024
        assert [o.op.name for o in t.attr("outputs")] == ["max", "transpose"]
        assert source.text.count("r = c * ") == 2  # the scale's max, then the pass writing the rows and their maxima
    rng = np.random.default_rng(8)
    feeds = {"x": rng.standard_normal(x.shape).astype(ml_dtypes.bfloat16),
             "z": rng.standard_normal(z.shape).astype(ml_dtypes.bfloat16), "s": np.float32(2.0)}
    for planned, written in zip(ct.evaluate(ours, feeds), ct.evaluate([product, peak], feeds)):
        np.testing.assert_array_equal(np.asarray(planned, np.float32), np.asarray(written, np.float32))


def _launched(body, operands, given, outputs):
    """``outputs`` (sizes in bytes) written by ``body``'s kernel on the device, fed ``given``, as bytes."""
    import cupy

    from cortado.backends.cupy.kernels import launcher

    (source,) = sources.kernel_sources(body, operands)
    on_device = [cupy.asarray(np.asarray(g).reshape(-1).view(np.uint8)) for g in given]
    outs = [cupy.zeros(size, np.uint8) for size in outputs]
    launcher(source, [a.data.ptr for a in on_device + outs])()
    cupy.cuda.Device().synchronize()
    return [out.get() for out in outs]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 1024, 768), (2, 130, 260), (4, 66, 132), (36, 12)])
def test_on_the_gpu_a_cast_is_written_as_it_is_and_transposed(shape):
    """Both results, in order and transposed, are the reference's bits, whether the sides are whole tiles or not;
    a bias row read along the columns and a scale of one value."""
    skip_without_device("cupy")
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    operands = [Operand(shape, BF16, contiguous_strides(shape)), Operand((cols,), BF16, (1,)),
                Operand((), np.dtype(np.float32), ())]
    x, b, s = (parameter(k, o) for k, o in enumerate(operands))
    q = ct.cast((ct.cast(x, "float32") + ct.cast(b, "float32")) * s, "float8_e5m2")
    rng = np.random.default_rng(2)
    given = [(rng.standard_normal(shape) * 300).astype(BF16), rng.standard_normal(cols).astype(BF16), np.float32(8.0)]
    expected = ct.evaluate(ct.cast((ct.cast(ct.const(given[0]), "float32") + ct.cast(ct.const(given[1]), "float32"))
                                   * float(given[2]), "float8_e5m2"), {})
    written, turned = _launched((q, ct.transpose(ct.reshape(q, (rows, cols)))), operands, given, [rows * cols] * 2)
    expected = np.asarray(expected).reshape(rows, cols).view(np.uint8)
    np.testing.assert_array_equal(written.reshape(rows, cols), expected)
    np.testing.assert_array_equal(turned.reshape(cols, rows), expected.T)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 1024, 768), (64, 1536), (32, 36), (32, 33)])
@pytest.mark.parametrize("in_order", [True, False])
def test_on_the_gpu_a_row_kernel_writes_its_rows_and_their_transpose(shape, in_order):
    """A row kernel's float8 rows (or none, where they are read only transposed), their maxima and their transpose
    are the reference's bits, at the GPT's shapes, at rows of few vectors a lane and at rows read an element at a
    time."""
    skip_without_device("cupy")
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    operand = Operand(shape, BF16, contiguous_strides(shape))
    y, peak = _rows_scaled(parameter(0, operand))
    given = (np.random.default_rng(4).standard_normal(shape) * 5).astype(BF16)
    expected_y, expected_peak = (np.asarray(v) for v in ct.evaluate(list(_rows_scaled(ct.const(given))), {}))
    body = (y,) * in_order + (peak, ct.transpose(ct.reshape(y, (rows, cols))))
    *written, peaks, turned = _launched(body, [operand], [given], [rows * cols] * in_order + [rows * 4, rows * cols])
    expected_y = expected_y.reshape(rows, cols).view(np.uint8)
    if in_order:
        np.testing.assert_array_equal(written[0].reshape(rows, cols), expected_y)
    np.testing.assert_array_equal(turned.reshape(cols, rows), expected_y.T)
    np.testing.assert_array_equal(peaks.view(np.float32), expected_peak.reshape(-1))
