"""GPU lowering as rules (on the CPU): gemm folding and composite expansion keep every value; the
kernel generator's index arithmetic is constants, vectors and 32-bit where it can be."""

import numpy as np
import pytest
from hypothesis import given

import cortado as ct
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.backends.cupy.sources import kernel_source, kernel_sources
from cortado.exprgraph.graph import schedule
from cortado.exprgraph.ops import parameter
from cortado.rules.engine import Trace
from cortado.backends.cupy.lowering import lowering as gpu_lowering
from cortado.testing import graphs_with_feeds
from reference_checks import made_in

TOLERANCE = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


def lowered(roots):
    trace = Trace()
    return gpu_lowering.run(list(roots), trace), trace.counts()


@given(graphs_with_feeds(ops=["matmul", "transpose", "add", "subtract", "multiply", "negative", "relu", "logsumexp",
                              "softmax", "log_softmax", "broadcast_to", "exp", "sum", "einsum", "gelu", "gelu_grad"],
                         dtypes=("float16", "float32", "float64")))
def test_lowering_keeps_every_value(case):
    graph, feeds = case
    new, _ = lowered(graph.outputs)
    for output, ours, expected in zip(graph.outputs, ct.evaluate(new, feeds), ct.evaluate(graph.outputs, feeds)):
        if ours.dtype.kind == "f":  # to the precision of the least precise value it is made from
            rtol, atol = TOLERANCE[(made_in(output) or ours.dtype).name]
            np.testing.assert_allclose(ours, expected, rtol=rtol, atol=atol * max(1.0, np.abs(expected).max(initial=0)))
        else:
            np.testing.assert_array_equal(ours, expected)


EINSUMS = [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ijk,jl->kli", [(2, 3, 4), (3, 5)]),
           ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("ij,k->ijk", [(2, 3), (4,)]), ("i,i->", [(3,), (3,)]),
           ("ij,ab->", [(2, 3), (4, 5)]), ("ii->i", [(3, 3)]), ("ij->", [(3, 4)]), ("iij,j->i", [(3, 3, 2), (2,)]),
           ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("ij,j->ij", [(1, 3), (3,)])]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("subscripts, shapes", EINSUMS)
def test_every_einsum_lowers_to_what_the_gpu_runs(subscripts, shapes, dtype):
    operands = [ct.var(f"x{i}", shape, dtype) for i, shape in enumerate(shapes)]
    out = ct.einsum(subscripts, *operands)
    (new,), _ = lowered([out])
    assert new.shape == out.shape and new.dtype == out.dtype
    assert not [t for t in schedule(new) if t.op.name in ("einsum", "matmul")]
    rng = np.random.default_rng(0)
    feeds = {v.name: (3 * rng.standard_normal(v.shape)).astype(dtype) for v in operands}
    np.testing.assert_allclose(ct.evaluate(new, feeds), ct.evaluate(out, feeds), rtol=1e-5, atol=1e-5)


def test_a_two_operand_einsum_is_one_gemm():
    a, b = ct.var("a", (2, 3, 4)), ct.var("b", (3, 5))
    (new,), counts = lowered([ct.einsum("ijk,jl->kli", a, b)])
    assert counts["einsum-as-matmul"] == 1
    assert [t.op.name for t in schedule(new) if t.op.name in ("gemm", "sum", "multiply")] == ["gemm"]


def test_an_einsum_summing_a_label_of_one_operand_alone_adds_its_products():
    """Summed before the product, ``(-inf + 1 + 1) * (-inf + 1 + 1)`` is inf where the einsum, a sum of products, is NaN
    (the edge fuzzer drew it); and a sum of one operand can overflow where no product does. As a product's free axis
    summed after it, it would write out a product as large as all its labels; so no matmul takes it."""
    x0 = ct.var("x0", (2, 3, 1))
    out = ct.einsum("abc,adc->", x0, x0)
    (new,), counts = lowered([out])
    assert counts["einsum-as-matmul"] == 0 and counts["einsum-as-product"] == 1  # its products summed as made
    infinite = np.array([[[-np.inf], [1], [1]], [[1], [1], [1]]], np.float32)
    assert np.isnan(ct.evaluate(new, {"x0": infinite})) and np.isnan(ct.compile([out], inputs=[x0])(infinite)[0])
    x, y = ct.var("x", (2,)), ct.var("y", (2,))
    large = {"x": np.array([2e38, 2e38], np.float32), "y": np.array([1e-38, 1e-38], np.float32)}
    (new,), _ = lowered([ct.einsum("i,j->", x, y)])
    assert np.isfinite(ct.evaluate(new, large)) and np.isfinite(ct.compile([ct.einsum("i,j->", x, y)], inputs=[x, y])(
        **large)[0])


def test_an_einsum_of_half_precision_operands_adds_their_products_in_float32():
    """As products rounded to float16 each, 300 * 300 and -300 * 300 were inf and -inf, their sum NaN; the einsum adds
    them in float32 and rounds once (0)."""
    h, k = ct.var("h", (2,), "float16"), ct.var("k", (1,), "float16")
    feeds = {"h": np.array([300, -300], np.float16), "k": np.array([300], np.float16)}
    for out, names in ((ct.einsum("i,j->j", h, k), "hk"), (ct.einsum("i,i,i->", h, h, h), "h")):
        (new,), _ = lowered([out])
        given = {name: feeds[name] for name in names}
        assert new.dtype == out.dtype
        np.testing.assert_array_equal(ct.evaluate(new, given), ct.evaluate(out, given))


def test_a_product_scaled_by_zero_keeps_its_nans():
    """A GEMM of alpha 0 reads neither operand (BLAS's rule), where ``(a @ b) * 0`` is NaN for a NaN in them."""
    a, b = ct.var("a", (4, 3)), ct.var("b", (3, 5))
    (new,), _ = lowered([ct.matmul(a, b) * 0.0])
    assert all(t.attr("alpha") != 0 for t in schedule(new) if t.op.name == "gemm")
    feeds = {"a": np.full((4, 3), np.nan, np.float32), "b": np.ones((3, 5), np.float32)}
    assert np.isnan(ct.evaluate(new, feeds)).all()


def test_an_sgd_update_of_a_weight_gradient_is_one_gemm_in_place():
    x, d, W = ct.var("x", (8, 4)), ct.var("d", (8, 3)), ct.var("W", (4, 3))
    (update,), counts = lowered([W - 0.1 * (ct.transpose(x) @ d)])
    assert update.op.name == "gemm" and update.args == (x, d, W)
    transpose_a, transpose_b, alpha, beta, epilogue, _ = update.attrs
    assert (transpose_a, transpose_b, beta, epilogue) == (True, False, 1.0, "none") and alpha == pytest.approx(-0.1)
    assert counts["gemm-transpose"] == counts["gemm-scale"] == counts["gemm-subtract"] == 1


def test_bias_and_relu_become_the_epilogue():
    x, W, b = ct.var("x", (8, 4)), ct.var("W", (4, 3)), ct.var("b", (3,))
    (out,), _ = lowered([ct.relu(x @ W + b)])
    assert out.op.name == "gemm" and out.args == (x, W, b) and out.attrs[4] == "bias_relu"


def test_gelu_and_its_backward_become_epilogues():
    x, W1, b1, W2 = ct.var("x", (8, 4)), ct.var("W1", (4, 16)), ct.var("b1", (16,)), ct.var("W2", (16, 3))
    (out,), _ = lowered([ct.gelu(x @ W1 + b1)])
    assert out.op.name == "gemm" and out.args == (x, W1, b1) and out.attrs[4] == "bias_gelu"
    z = x @ W1 + b1
    (gW1,) = ct.grad(ct.sum(ct.gelu(z) @ W2), [W1])
    (new,), counts = lowered([gW1])
    assert counts["gemm-dgelu"] == 1
    dgelu = [t for t in schedule(new) if t.op.name == "gemm" and t.attrs[4] == "dgelu"]
    assert len(dgelu) == 1 and dgelu[0].args[-1].op.name == "gemm"  # the gelu argument z, itself a gemm with its bias
    rng = np.random.default_rng(2)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, W1, b1, W2)}
    np.testing.assert_allclose(ct.evaluate(new, feeds), ct.evaluate(gW1, feeds), rtol=1e-5, atol=1e-5)


def test_float64_gelu_stays_out_of_the_gemm():
    x, W = ct.var("x", (8, 4), "float64"), ct.var("W", (4, 16), "float64")
    (out,), _ = lowered([ct.gelu(x @ W)])
    assert out.op.name == "gelu" and out.args[0].attrs[4] == "none"


def test_a_product_used_twice_is_not_folded_into_its_users():
    x, W, b = ct.var("x", (8, 4)), ct.var("W", (4, 3)), ct.var("b", (3,))
    product = x @ W
    (out,), _ = lowered([ct.exp(product) + (product + b)])
    gemms = [t for t in schedule(out) if t.op.name == "gemm"]
    assert len(gemms) == 1 and gemms[0].attrs[4] == "none"


def test_what_no_gemm_takes_becomes_a_reduction():
    n, m = ct.var("n", (3, 4), "int32"), ct.var("m", (4, 2), "int32")
    (out,), counts = lowered([n @ m])
    assert counts == {"matmul-as-reduction": 1}
    feeds = {"n": np.arange(12, dtype=np.int32).reshape(3, 4), "m": np.arange(8, dtype=np.int32).reshape(4, 2)}
    assert np.array_equal(ct.evaluate(out, feeds), feeds["n"] @ feeds["m"])


def test_vectors_are_one_row_or_one_column_matrices():
    v, W = ct.var("v", (4,)), ct.var("W", (4, 3))
    (out,), counts = lowered([v @ W])
    assert counts["matmul-to-gemm"] == 1 and out.op.name == "reshape" and out.shape == (3,)


def _operand(shape, dtype="float32", strides=None):
    return Operand(tuple(shape), np.dtype(dtype), tuple(strides) if strides else contiguous_strides(shape))


def test_kernels_take_pointers_only_and_fold_strides_into_constants():
    x, b = ct.var("x", (64, 32)), ct.var("b", (32,))
    body = (ct.tanh(parameter(0, x) + parameter(1, b)),)
    plain = kernel_source(body, [_operand((64, 32)), _operand((32,))])
    signature = plain.text.split('extern "C" __global__ void ')[1].split(")")[0]
    assert all("*" in p for p in signature.split(","))  # no shapes or strides passed at run time
    assert "ct_vec<float, 4>" in plain.text and "unsigned int" in plain.text  # 16-byte vectors, 32-bit indexing
    assert "in1[(i % 32)]" in plain.text  # the broadcast row, its index a constant modulus
    transposed = kernel_source(body, [_operand((64, 32), strides=(1, 64)), _operand((32,))])
    assert "in0[(i / 32) + (i % 32) * 64]" in transposed.text
    half = kernel_source((ct.exp(parameter(0, ct.var("h", (64,), "float16"))),), [_operand((64,), "float16")])
    assert "ct_vec<__half, 8>" in half.text and "float v" in half.text  # 8 halves a vector, computed in float


def test_huge_tensors_index_in_64_bits_and_reductions_pick_rows_or_columns():
    big = ct.var("x", (2 ** 16, 2 ** 16), "float16")
    assert "unsigned long long" in kernel_source((ct.exp(parameter(0, big)),), [_operand(big.shape, "float16")]).text
    x = ct.var("x", (300, 500))
    rows = kernel_source((ct.sum(parameter(0, x), axis=1),), [_operand(x.shape)])
    columns, _ = kernel_sources((ct.sum(parameter(0, x), axis=0),), [_operand(x.shape)])  # two parts of 150 rows
    assert rows.block == (256, 1, 1) and rows.blocks == 300 and "__shfl_down_sync" in rows.text
    # rows of 500 float32 are whole 16-byte vectors: 16 threads across, 4 columns each
    assert columns.block == (16, 16, 1) and columns.blocks == (8, 2, 1) and "partial[1][16][64]" in columns.text
    assert "ct_vec<float, 4>" in columns.text


def test_a_training_step_computes_each_product_once():
    x, W, b, y = ct.var("x", (8, 4)), ct.var("W", (4, 5)), ct.var("b", (5,)), ct.var("y", (8, 5))
    z = x @ W + b
    loss = ct.sum(ct.relu(z) * y)
    gW, gb = ct.grad(loss, [W, b])
    roots, _ = lowered([loss, W - 0.1 * gW, b - 0.1 * gb])
    forward = [t for t in schedule(roots) if t.op.name == "gemm" and t.args[:2] == (x, W)]
    # relu's gradient reads relu's output, so z is read by relu alone and dies in the GEMM's epilogue
    assert len(forward) == 1 and forward[0].attrs[4] == "bias_relu"
    assert not any(t.op.name == "relu" for t in schedule(roots))


def test_bias_gradients_come_from_the_gemm_that_reads_the_gradient():
    x, W, b, y = ct.var("x", (8, 4)), ct.var("W", (4, 5)), ct.var("b", (5,)), ct.var("y", (8, 5))
    loss = ct.sum(ct.relu(x @ W + b) * y)
    gW, gb = ct.grad(loss, [W, b])
    updates = [W - 0.1 * gW, b - 0.1 * gb]
    roots, counts = lowered(updates)
    assert counts["gemm-bias-gradient"] == 1
    assert not any(t.op.name == "sum" for t in schedule(roots))  # b's gradient is the weight gradient's second result
    (weights,) = [t for t in schedule(roots) if t.op.name == "gemm" and t.attrs[4] == "bgrad_b" and t.attrs[5] == 0]
    assert weights in roots
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, W, b, y)}
    for ours, expected in zip(ct.evaluate(roots, feeds), ct.evaluate(updates, feeds)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


def test_a_kept_bias_gradient_stays_a_sum():
    x, W, b, y = ct.var("x", (8, 4)), ct.var("W", (4, 5)), ct.var("b", (5,)), ct.var("y", (8, 5))
    gW, gb = ct.grad(ct.sum(ct.relu(x @ W + b) * y), [W, b])
    updates = [W - 0.1 * gW, b - 0.1 * gb]
    trace = Trace()
    gpu_lowering.run(updates, trace)
    (summed,) = [r.before for r in trace if r.rule == "gemm-bias-gradient"]
    roots = gpu_lowering.run(updates, None, {"gemm": frozenset([summed])})
    assert summed in schedule(roots) and not any(t.op.name == "gemm" and t.attrs[5] for t in schedule(roots))


def test_gelu_bias_gradients_are_the_dgelu_products_column_sums():
    x, W1, b1, W2 = ct.var("x", (6, 3)), ct.var("W1", (3, 8)), ct.var("b1", (8,)), ct.var("W2", (8, 2))
    gradients = ct.grad(ct.sum(ct.gelu(x @ W1 + b1) @ W2), [W1, b1])
    roots, counts = lowered(gradients)
    assert roots[1].op.name == "gemm" and roots[1].attrs[4:] == ("dgelu_bgrad", 1)
    rng = np.random.default_rng(1)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, W1, b1, W2)}
    for ours, expected in zip(ct.evaluate(roots, feeds), ct.evaluate(gradients, feeds)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


def test_a_gelu_layers_bias_gradient_over_batched_rows_comes_from_its_weight_gradients_gemm():
    """Over (batch, time) rows, too many for DGELU_BGRAD, the gelu layer's bias gradient sums the dgelu product,
    which its weight gradient's GEMM reads through reshapes there and back: that GEMM sums it (BGRAD), so no
    product is held for a sum of its own."""
    from cortado.backends.cupy.lowering.gemm import DGELU_BGRAD_MOST_ROWS

    rows = DGELU_BGRAD_MOST_ROWS // 2 + 1
    x, t = ct.var("x", (2, rows, 8)), ct.var("t", (2, rows, 8))
    W1, b1, W2, b2 = ct.var("W1", (8, 16)), ct.var("b1", (16,)), ct.var("W2", (16, 8)), ct.var("b2", (8,))
    loss = ct.sum((ct.gelu(x @ W1 + b1) @ W2 + b2) * t)
    gradients = ct.grad(loss, [W1, b1, W2, b2])
    roots, counts = lowered(gradients)
    assert counts["gemm-bias-gradient"] == 2 and not any(s.op.name == "sum" for s in schedule(roots))
    rng = np.random.default_rng(2)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, t, W1, b1, W2)}
    for ours, expected in zip(ct.evaluate(roots, feeds), ct.evaluate(gradients, feeds)):
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_a_gelu_whose_argument_the_backward_pass_reads_is_written_by_the_gemm_beside_it():
    """Training a gelu layer reads its product twice, as gelu's argument and in gelu's backward (dgelu): one gemm
    writes both (cuBLASLt's GELU_AUX_BIAS), the next layer's product reads the gelu it wrote, and the weight
    gradient, which runs in the backward pass, reads a gelu of the kept argument computed where it runs (so the
    forward pass's gelu is not held until then). Over (batch, time) rows too, through the reshapes."""
    x, t = ct.var("x", (2, 6, 8)), ct.var("t", (2, 6, 8))
    W1, b1, W2 = ct.var("W1", (8, 16)), ct.var("b1", (16,)), ct.var("W2", (16, 8))
    y = ct.gelu(x @ W1 + b1) @ W2
    loss = ct.sum(y * y * t)  # the output's gradient, which the weight gradient reads, waits for the output
    gradients = ct.grad(loss, [W1, b1, W2])
    roots, counts = lowered([loss, *gradients])
    assert counts["gemm-gelu-argument"] == 1
    order = schedule(roots)
    (kept,) = [g for g in order if g.op.name == "gemm" and g.attr("epilogue") == "bias_gelu_aux" and g.attr("output")]
    (late,) = [h for h in order if h.op.name == "gelu"]
    assert late.args[0].args[0] is kept  # the gelu of the kept argument, reshaped to (batch, time) rows
    rng = np.random.default_rng(3)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, t, W1, b1, W2)}
    for ours, expected in zip(ct.evaluate(roots, feeds), ct.evaluate([loss, *gradients], feeds)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_a_reader_of_two_kept_gelus_reads_both_computed_late():
    """A term that reads two gelus of products read on their own too, and waits for another reader of them, reads
    both gelus computed again from the products each gemm keeps beside its gelu."""
    x = ct.var("x", (6, 8))
    W1, W2 = ct.var("W1", (8, 16)), ct.var("W2", (8, 16))
    p1, p2 = x @ W1, x @ W2
    a, b = ct.gelu(p1), ct.gelu(p2)
    first = a + b
    late = ct.where(ct.sum(first) > 0, a, b)  # waits for ``first``
    roots, counts = lowered([first, late, p1, p2])
    kept = {g for g in schedule(roots) if g.op.name == "gemm" and g.attr("epilogue") == "gelu_aux" and g.attr("output")}
    again = [h for h in schedule(roots) if h.op.name == "gelu"]
    assert counts["gemm-gelu-argument"] == 2 and len(again) == 2 and {h.args[0] for h in again} == kept
    rng = np.random.default_rng(4)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, W1, W2)}
    for ours, expected in zip(ct.evaluate(roots, feeds), ct.evaluate([first, late, p1, p2], feeds)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


CONVS_CUDNN_CANNOT_TAKE = [  # x shape, w shape, ct.conv keywords, dtype
    ((2, 4, 5, 4, 3, 3), (6, 2, 2, 1, 2, 2), dict(strides=(1, 2, 1, 1), padding=((1, 0), (0, 1), (1, 1), (-1, 0)),
                                                  lhs_dilation=(1, 1, 2, 1), rhs_dilation=(2, 1, 1, 1), groups=2),
     "float64"),
    ((1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 1, 1), {}, "float32"),
    ((2, 6, 6, 5), (4, 3, 3, 2), dict(strides=(2, 1), padding=((1, 1), (0, 1)), groups=2), "int32"),
]


@pytest.mark.parametrize("x_shape, w_shape, options, dtype", CONVS_CUDNN_CANNOT_TAKE)
def test_a_convolution_cudnn_cannot_take_is_a_matrix_product_over_its_windows(x_shape, w_shape, options, dtype):
    x, w = ct.var("x", x_shape, dtype), ct.var("w", w_shape, dtype)
    y = ct.conv(x, w, **options)
    (new,), counts = lowered([y])
    ops = {t.op.name for t in schedule(new)}
    assert "conv" not in ops and "dnn_conv" not in ops and "windows" in ops, ops
    assert ("gemm" in ops) == (dtype != "int32"), ops  # cuBLASLt's for floats; a reduction for integers
    rng = np.random.default_rng(0)
    feeds = {v.name: (3 * rng.standard_normal(v.shape)).astype(dtype) for v in (x, w)}
    np.testing.assert_allclose(ct.evaluate([new], feeds)[0], ct.evaluate([y], feeds)[0], rtol=1e-12, atol=1e-12)


def _residual_block(conv_also_returned=False):
    x, w, b = ct.var("x", (2, 4, 6, 6)), ct.var("w", (4, 4, 3, 3)), ct.var("b", (4,))
    w2, b2 = ct.var("w2", (4, 4, 3, 3)), ct.var("b2", (4,))
    first = ct.conv2d(x, w, padding=1)
    h = ct.relu(first + ct.reshape(b, (-1, 1, 1)))
    y = ct.relu(ct.conv2d(h, w2, padding=1) + ct.reshape(b2, (-1, 1, 1)) + h)
    loss = ct.sum(y * y)
    outputs = [loss] + ct.grad(loss, [w, b, w2, b2]) + ([first] if conv_also_returned else [])
    return outputs, [x, w, b, w2, b2]


@pytest.mark.parametrize("conv_also_returned", [False, True])
def test_a_convolutions_bias_residual_and_relu_fold_into_its_epilogue(conv_also_returned):
    outputs, variables = _residual_block(conv_also_returned)
    new, counts = lowered(outputs)
    epilogues = sorted(t.attr("epilogue") for t in schedule(new) if t.op.name == "dnn_conv" and t.attr("mode") == "fprop")
    # a convolution another term reads keeps its result plain: folding would compute it twice
    assert epilogues == (["bias_add_relu", "none"] if conv_also_returned else ["bias_add_relu", "bias_relu"])
    assert counts["conv-epilogue"] == (3 if conv_also_returned else 5)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in variables}
    for ours, expected in zip(ct.evaluate(new, feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_an_epilogue_kernel_walks_a_channels_last_result_in_memory_order():
    from cortado.backends.cupy.codegen import channels_last_strides, memory_order
    from cortado.backends.cupy.calls.conv_epilogue import EpilogueKernel
    from cortado.backends.cupy.lowering.conv import dnn_conv
    from cortado.backends.cupy.targets.conv import conv_call

    shape = (2, 3, 4, 5)
    assert memory_order(shape, contiguous_strides(shape)) is None
    assert memory_order(shape, channels_last_strides(shape)) == (0, 2, 3, 1)
    x, w, b = ct.var("x", shape), ct.var("w", (3, 3, 1, 1)), ct.var("b", (3,))
    term = dnn_conv(x, w, "fprop", (1, 1), ((0, 0), (0, 0)), (1, 1), 1, shape, "bias_relu", (b,))
    layouts = {x: contiguous_strides(shape), w: contiguous_strides(w.shape), term: channels_last_strides(shape), b: (1,)}
    channels_last = EpilogueKernel(conv_call(term, layouts, {"tf32": False, "deterministic": True})).source.text
    layouts[term] = contiguous_strides(shape)
    c_order = EpilogueKernel(conv_call(term, layouts, {"tf32": False, "deterministic": True})).source.text
    assert channels_last != c_order and "in1" in channels_last and "out0" in channels_last


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_a_weight_gradient_is_recognised_with_or_without_groups(groups):
    x, w = ct.var("x", (2, 8, 9, 9)), ct.var("w", (8, 8 // groups, 3, 3))
    y = ct.conv2d(x, w, stride=2, padding=1, groups=groups)
    outputs = ct.grad(ct.sum(y * y), [w])
    new, _ = lowered(outputs)
    terms = schedule(new)
    modes = sorted(t.attr("mode") for t in terms if t.op.name == "dnn_conv")
    assert modes == ["fprop", "wgrad"], modes
    wgrad = next(t for t in terms if t.op.name == "dnn_conv" and t.attr("mode") == "wgrad")
    assert wgrad.shape == w.shape and wgrad.attr("groups") == groups
    assert not any(t.op.name in ("transpose", "reshape") for t in terms), [t.op.name for t in terms]
    feeds = {v.name: np.random.default_rng(0).standard_normal(v.shape).astype(np.float32) for v in (x, w)}
    np.testing.assert_allclose(ct.evaluate(new, feeds)[0], ct.evaluate(outputs, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "softplus", "silu"])
def test_a_planned_step_finds_what_a_lowering_rule_made_through_the_later_stages(activation):
    """The GPU lowering's bias-gradient sums, followed through the composites spelled out below them and through
    fusion, are terms of the planned step (``PlannedStep.made_by``), whatever the activation: otherwise the variant
    that computes them apart would silently never be proposed."""
    from cortado.backends.cupy import CupyBackend
    from cortado.backends.interface import PlannedStep
    from cortado.compiler import _rewrite
    from cortado.exprgraph.graph import post_order

    x, y = ct.var("x", (256, 64)), ct.var("y", (256, 32))
    W1, b1, W2, b2 = ct.var("W1", (64, 128)), ct.var("b1", (128,)), ct.var("W2", (128, 32)), ct.var("b2", (32,))
    loss = ct.mean((getattr(ct, activation)(x @ W1 + b1) @ W2 + b2 - y) ** 2)
    traces = {}
    roots = _rewrite([loss, *ct.grad(loss, [W1, b1, W2, b2])], CupyBackend(), traces)
    made = PlannedStep(None, traces).made_by("lowering", "gemm-bias-gradient")
    assert len(made) == 2 and set(made) <= set(post_order(roots))


def test_products_that_hold_the_card_at_its_power_limit_keep_the_heuristics_first_choice():
    """The large MLP's 8192^3 products are not timed (``cublaslt.SETTLED_PRODUCT``); the GPT's largest, 8192 x 3072
    over 768, and a 4096^3 product are."""
    from cortado.backends.cupy.calls.cublaslt import WORKSPACE_LIMIT, GemmCall
    from cortado.exprgraph.dtypes import BFLOAT16

    def product(m, n, k):
        return GemmCall.product(Operand((m, k), BFLOAT16, (k, 1)), Operand((k, n), BFLOAT16, (n, 1)))

    assert not product(8192, 8192, 8192).timed and product(8192, 8192, 8192).workspace_limit == WORKSPACE_LIMIT[1]
    assert product(8192, 3072, 768).timed and product(4096, 4096, 4096).timed and product(128, 256, 784).timed
