"""Bias gradients as columns of their weight gradients' products (``backends/cupy/lowering/bias_gradient_ones.py``),
planned for the GPU on the CPU: which products take them so, the row kernels' padded rows, the views of the product,
and the values, against the same program with cuBLASLt's BGRAD epilogue, through the reference interpreter."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado import compiler, nn
from cortado.backends.cupy import CupyBackend, layout
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy.codegen import Operand, contiguous_strides, elementwise_source
from cortado.backends.cupy.lowering.bias_gradient_ones import by_ones, ones_columns
from cortado.backends.cupy.lowering.gemm_op import gemm
from cortado.backends.cupy.row_kernels import row_source
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import parameter
from cortado.rules.fusion import padded_rows, row_shape
from gpu_rewrites import planning_without_a_device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import gpt  # noqa: E402


def _planned(outputs, inputs):
    signature = compiler._signature(outputs, inputs, None, None)
    options = compiler._options(gpu_backend, {})
    return compiler._recomputing(compiler._built(signature, gpu_backend, options), signature, gpu_backend, options)


def _gpt_step(width=128, context=64, batch=4, layers=2):
    """A bfloat16 GPT's loss and gradients, and its inputs (at the default size the columns of ones grow the arena by
    less than ``compiler.ARENA_GROWTH``)."""
    model = gpt.GPT(11, context=context, width=width, heads=2, layers=layers).compute_in("bfloat16")
    tokens, labels = ct.var("tokens_in", (batch, context), "int32"), ct.var("labels", (batch, context), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = list(model.parameters().values())
    return [loss, *ct.grad(loss, params)], [tokens, labels, *params]


def _feeds(variables):
    rng = np.random.default_rng(0)
    return {v.name: rng.integers(0, 11, v.shape).astype(v.dtype) if v.dtype.kind == "i"
            else (0.2 * rng.standard_normal(v.shape)).astype(v.dtype) for v in variables}


def test_a_gpts_bias_gradients_are_columns_of_their_weight_gradients_where_a_kernel_of_ours_writes_the_input(
        monkeypatch):
    """The layer norms' outputs made again by their input gradients' kernels are read only by the weight gradients
    of the attention's qkv product and the MLP's first, and the gelu made again by gelu's backward kernel only by
    the MLP's second: those kernels write them with columns of ones, and the products' last columns are the bias
    gradients (views, as the products cropped are). The attention's output projection reads cuDNN's output: BGRAD."""
    planning_without_a_device(monkeypatch)
    outputs, inputs = _gpt_step()  # rows of 128 bfloat16 values: the bias gradients' columns views too (256 bytes in)
    plan = _planned(outputs, inputs)
    assert plan.traces["recompute"].counts()["gemm-bias-gradient-ones"] == 6
    gemms = [k.term for k in plan.kernels if k.term.op.name == "gemm" and k.term.attr("output") == 0]
    padded = [g for g in gemms if g.shape[-1] in (128 + 8, 4 * 128 + 32)]  # (ones_columns: 8 after 128, 32 after 512)
    assert sorted(g.shape for g in padded) == [(128, 4 * 128 + 32)] * 2 + [(3 * 128, 136)] * 2 + [(4 * 128, 136)] * 2
    assert all(g.attr("epilogue") == "none" for g in padded)
    assert [g.shape for g in gemms if g.attr("epilogue") == "bgrad_a"] == [(128, 128)] * 2
    writers = {k.term.attr("kernel") for k in plan.kernels if k.term.op.name == "fused"
               and any(padded_rows(o) is not None for o in k.term.attr("outputs"))}
    assert writers == {"row", "elementwise"}
    _, views = layout.layouts(plan.kernels, compiler._options(gpu_backend, {}))
    crops = [k.term for k in plan.kernels if k.term.op.name == "fused" and any(a in padded for a in k.term.args)]
    assert len(crops) == 12 and all(c in views for c in crops)


def test_bias_gradients_from_columns_of_ones_are_those_of_bgrad(monkeypatch):
    """The same GPT's loss and gradients, with the bias gradients from the products' columns and from BGRAD, through
    the reference interpreter (each sum rounded to bfloat16 once, its terms added in another order)."""
    planning_without_a_device(monkeypatch)
    outputs, inputs = _gpt_step()
    ones = _planned(outputs, inputs)
    monkeypatch.setattr(CupyBackend, "after_recomputation", lambda self, roots, copies, trace: (roots, copies))
    bgrad = _planned(outputs, inputs)
    feeds = _feeds(inputs)
    for ours, theirs in zip(ct.evaluate(list(ones.roots), feeds), ct.evaluate(list(bgrad.roots), feeds)):
        ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
        np.testing.assert_allclose(ours, theirs, rtol=2 ** -7, atol=2 ** -7 * max(1.0, np.abs(theirs).max()))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["bfloat16", "float16"]), st.sampled_from([64, 72, 128]), st.sampled_from([2, 3, 4]),
       st.integers(8, 24), st.booleans())
def test_a_normed_mlps_gradients_from_columns_of_ones_are_those_of_bgrad(dtype, width, ratio, rows, gelu):
    """A layer norm, a linear layer, gelu or relu and a second linear layer, of random widths and rows, their inputs'
    gradient asked for too (the layer norm's input-gradient kernel is then an output's): the gradients planned with
    the bias gradients as columns of ones and with BGRAD, through the reference."""
    with pytest.MonkeyPatch.context() as patched:
        planning_without_a_device(patched)
        patched.setattr(compiler, "ARENA_GROWTH", np.inf)  # the values, wherever the rewrite applies
        x, t = ct.var("x", (2, rows, width), dtype), ct.var("t", (2, rows, width), dtype)
        activation = ct.gelu if gelu else ct.relu
        model = nn.Sequential(nn.LayerNorm(width), nn.MLP(width, ratio * width, width, activation=activation))
        model = model.compute_in(dtype)  # float32 weights: their gradients, the outputs, are casts of the products
        loss = ct.sum(ct.cast(model(x) * t, "float32"))
        params = list(model.parameters().values())
        outputs, inputs = [loss, *ct.grad(loss, [x, *params])], [x, t, *params]
        ones = _planned(outputs, inputs)
        patched.setattr(CupyBackend, "after_recomputation", lambda self, roots, copies, trace: (roots, copies))
        bgrad = _planned(outputs, inputs)
    if not gelu:  # (gelu's first bias gradient over so few rows is DGELU_BGRAD's; the GPT's test above has gelu's)
        assert ones.traces["recompute"].counts()["gemm-bias-gradient-ones"] == 1
    feeds = _feeds(inputs)
    for ours, theirs in zip(ct.evaluate(list(ones.roots), feeds), ct.evaluate(list(bgrad.roots), feeds)):
        ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
        np.testing.assert_allclose(ours, theirs, rtol=2 ** -7, atol=2 ** -7 * max(1.0, np.abs(theirs).max()))


def test_columns_of_ones_that_would_grow_the_arena_more_than_a_little_are_not_taken(monkeypatch):
    """The arena's placement of a small GPT's step with the ones grows 3.8%, past ``compiler.ARENA_GROWTH``: the
    plan is recomputation's alone, and the ones' rewrites are nowhere in the traces."""
    planning_without_a_device(monkeypatch)
    outputs, inputs = _gpt_step(width=64, context=16, batch=2)
    plan = _planned(outputs, inputs)
    assert "gemm-bias-gradient-ones" not in plan.traces["recompute"].counts()
    growth = compiler.ARENA_GROWTH
    monkeypatch.setattr(compiler, "ARENA_GROWTH", np.inf)
    grown = _planned(outputs, inputs)
    assert grown.traces["recompute"].counts()["gemm-bias-gradient-ones"] == 6
    assert grown.plan.peak_bytes > plan.plan.peak_bytes * (1 + growth)


def test_the_copies_left_apart_are_ordered_by_their_readers_in_the_rewritten_program(monkeypatch):
    """A GPT whose attention's copies made after the peak stay kernels of their own (heads of 384): the readers the
    compiler orders each copy before are terms of the program the ones rewrote (rebuilt over its new kernels), not
    of the one before it, where the order would silently not hold (the arena 16% larger)."""
    planning_without_a_device(monkeypatch)
    seen = {}
    rewrite = CupyBackend.after_recomputation

    def spied(self, roots, copies, trace):
        seen["roots"], seen["copies"] = rewrite(self, roots, copies, trace)
        return seen["roots"], seen["copies"]

    monkeypatch.setattr(CupyBackend, "after_recomputation", spied)
    plan = _planned(*_gpt_step(width=768, context=512, batch=8, layers=4))
    assert plan.traces["recompute"].counts()["gemm-bias-gradient-ones"] == 12 and len(seen["copies"]) == 12
    terms = set(post_order(list(seen["roots"])))
    assert all(c in terms and all(r in terms for r in readers) for c, readers in seen["copies"].items())


def test_a_product_of_a_value_with_itself_takes_no_ones(monkeypatch):
    """``X^T @ X`` with the column sums of ``X``: ``X`` is both operands, and padding it would pad both."""
    planning_without_a_device(monkeypatch)
    monkeypatch.setattr(compiler, "ARENA_GROWTH", np.inf)
    x = ct.var("x", (256, 64), "bfloat16")
    big = ct.exp(x) * 0.5
    outputs = [ct.cast(ct.transpose(big) @ big, "float32"), ct.cast(ct.sum(big, axis=0), "float32")]
    plan = _planned(outputs, [x])
    assert "gemm-bias-gradient-ones" not in plan.traces.get("recompute", {})
    feeds = _feeds([x])
    for ours, theirs in zip(ct.evaluate(list(plan.roots), feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_allclose(np.asarray(ours, np.float64), np.asarray(theirs, np.float64), rtol=2e-2, atol=1e-1)


def test_an_output_padded_by_the_program_is_no_padded_row():
    """A program's own ``pad`` of a kernel's operand at the end of its rows, beside another output of the padded
    shape, is a read at shifted indices, not a row written with constants after it."""
    x = ct.var("x", (32, 60), "float32")
    body = (ct.pad(parameter(0, x), ((0, 0), (0, 4))), ct.pad(parameter(0, x), ((0, 0), (0, 4))) * 2.0)
    assert padded_rows(body[0]) is None
    source = elementwise_source(body, [Operand(x.shape, x.dtype, contiguous_strides(x.shape))])
    assert "for (int q" not in source.text and "(out0)[j] = o0;" in source.text


@pytest.mark.parametrize("dtype, alpha, width, allowed", [
    ("bfloat16", 1.0, 64, True), ("float16", 1.0, 768, True),
    ("float32", 1.0, 64, False),  # a float32 product by one may round dy (TF32)
    ("bfloat16", 0.5, 64, False),  # the sums would be scaled too
    ("bfloat16", 1.0, 56, False),  # the ones more than an eighth of x's columns
    ("bfloat16", 1.0, 60, False),  # rows of no whole vectors
])
def test_which_weight_gradients_may_take_their_bias_gradients_from_ones(dtype, alpha, width, allowed):
    dy, x = ct.var("dy", (32, 128), dtype), ct.var("x", (32, width), dtype)
    assert by_ones(gemm(dy, x, transpose_a=True, alpha=alpha), "a") is allowed
    assert by_ones(gemm(x, dy, transpose_a=True, alpha=alpha), "b") is allowed
    stored_other_way = ct.var("xt", (width, 32), dtype)  # padding its last axis would pad the contracted one
    assert not by_ones(gemm(dy, stored_other_way, transpose_a=True, transpose_b=True, alpha=alpha), "a")


def test_rows_take_32_columns_of_ones_where_those_are_an_eighth_of_them_at_most_else_8():
    assert [ones_columns(w) for w in (768, 3072, 256, 128, 264, 64, 56, 60)] == [32, 32, 32, 8, 8, 8, None, None]


def test_a_row_kernel_writes_padded_rows_and_their_constants():
    """A row kernel's output ``pad(row, ones after it)``: its rows written ``n + 8`` apart as vectors, then the
    constants after each row by the row's first thread."""
    x = ct.var("x", (64, 96), "bfloat16")
    y = ct.cast(parameter(0, x), "float32")
    centered = y - ct.mean(y, axis=-1, keepdims=True)
    body = (ct.pad(ct.cast(centered * centered, "bfloat16"), ((0, 0), (0, 8)), constant_values=1),)
    assert row_shape(body) == (64, 96)
    source = row_source(body, [Operand(x.shape, x.dtype, contiguous_strides(x.shape))], (), row_shape(body))
    assert "(out0)[o * 13 + c]" in source.text  # rows of 104 elements: 13 vectors of 8
    assert "for (int q = 96; q < 104; ++q) out0[o * 104 + q]" in source.text


def test_a_row_kernel_of_a_block_a_row_writes_its_constants_from_one_thread():
    """Rows longer than a warp takes (a block each): the row's first thread writes the constants after it."""
    x = ct.var("x", (16, 4096), "bfloat16")
    y = ct.cast(parameter(0, x), "float32")
    centered = y - ct.mean(y, axis=-1, keepdims=True)
    body = (ct.pad(ct.cast(centered, "bfloat16"), ((0, 0), (0, 8)), constant_values=1),)
    source = row_source(body, [Operand(x.shape, x.dtype, contiguous_strides(x.shape))], (), row_shape(body))
    assert source.block == (256, 1, 1) and "const unsigned lane = threadIdx.x % 256;" in source.text
    assert "(out0)[o * 513 + c]" in source.text and "if (lane == 0)" in source.text


def test_an_elementwise_kernel_writes_padded_rows_and_their_constants():
    """An elementwise kernel's output ``pad(x, ones after each row)`` beside a plain one: its vectors placed ``n + 8``
    apart by rows, the constants after each row by the thread of the row's first vector."""
    x = ct.var("x", (32, 64), "bfloat16")
    y = ct.cast(ct.exp(ct.cast(parameter(0, x), "float32")), "bfloat16")
    body = (y, ct.pad(y, ((0, 0), (0, 8)), constant_values=1))
    source = elementwise_source(body, [Operand(x.shape, x.dtype, contiguous_strides(x.shape))])
    assert "(out0)[j] = o0;" in source.text and "(out1)[j / 8 * 9 + j % 8] = o1;" in source.text
    assert "if (j % 8 == 0)" in source.text and "out1[j / 8 * 72 + q]" in source.text


def test_an_elementwise_kernel_reads_rows_lying_apart_as_vectors():
    """An operand holding the kernel's elements but for its rows lying further apart (a weight gradient cropped from
    the product with its bias gradient's columns) is read 16 bytes at a time within its rows."""
    x = ct.var("x", (32, 64), "bfloat16")
    body = (ct.cast(parameter(0, x), "float32") * 2.0,)
    source = elementwise_source(body, [Operand(x.shape, x.dtype, (72, 1))])
    assert "(in0)[j / 8 * 9 + j % 8]" in source.text  # 8 elements a thread: rows of 8 vectors, 9 apart


def test_an_elementwise_kernel_of_one_value_writes_no_row_constants():
    """A kernel of a single value (as the optimizer's step count is) has no rows to pad, and none are looked for."""
    step = ct.var("step", (), "float32")
    source = elementwise_source((parameter(0, step) + 1.0,), [Operand((), step.dtype, ())])
    assert "for (int q" not in source.text
