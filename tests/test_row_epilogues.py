"""A row max of a kernel's result joining the kernel that makes it (``rules.row_epilogues``), and the row kernels it
makes: which join, that every value is as before, and that such a max costs the kernel no pass of its own."""

import ml_dtypes
import numpy as np
import pytest

import cortado as ct
from cortado import compiler
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy import sources
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import parameter
from cortado.rules.fusion import ROW_KERNEL, row_shape
from float8_plans import assert_same_bits, assert_same_training, float8_gpt_trained, float8_mlp_step
from reference_checks import host, skip_without_device


def _kernels(roots):
    return {(t.args, t.attr("outputs"), t.attr("kernel")) for t in post_order(roots) if t.op.name == "fused"}


def _planned(outputs, join=True, monkeypatch=None):
    if not join:
        monkeypatch.setattr(compiler, "into_producers", lambda roots, trace: tuple(roots))
    traces = {}
    return compiler._rewrite(outputs, gpu_backend, traces), traces["fusion"]


def test_a_float8_steps_amax_row_maxima_join_the_kernels_that_make_their_rows_values_unchanged(monkeypatch):
    """The float8 MLP's step as the GPU plans it: the row maxima of each layer's input, weight and gradient are
    folded by the kernels that write those rows (fewer kernels, no row max reading an activation back), and the loss
    and every update are the bits of the same program planned without the join."""
    outputs, values, x, y = float8_mlp_step((256, 512, 256), (4, 128))
    joined, trace = _planned(outputs)
    apart, _ = _planned(outputs, join=False, monkeypatch=monkeypatch)
    assert sum(r.rule == "row-reduction-into-producer" for r in trace) >= 4
    assert len(_kernels(joined)) < len(_kernels(apart))
    assert any(kind == ROW_KERNEL and any(o.shape == (4, 128, 1) for o in body) and len(body) < 6
               for _, body, kind in _kernels(joined))  # an elementwise cast grew its rows' maxima
    assert_same_bits(joined, apart, values, x, y)


def test_only_a_max_joins_and_it_reads_the_value_as_stored(monkeypatch):
    """A max of a bfloat16 result joins its kernel and reads the result rounded as it is stored; a sum, whose
    order would change its bits, stays a reduction of its own."""
    x = ct.var("x", (512, 768), "bfloat16")
    y = ct.gelu(x) * 3.0
    biggest, total = ct.max(ct.abs(ct.cast(y, "float32"))), ct.sum(ct.cast(y, "float32"))
    joined, trace = _planned([y, biggest])
    assert [r.rule for r in trace].count("row-reduction-into-producer") == 1
    assert not any(r.rule == "row-reduction-into-producer" for r in _planned([y, total])[1])
    feeds = {"x": (np.random.default_rng(0).standard_normal((512, 768)) * 4).astype(ml_dtypes.bfloat16)}
    ours_y, ours_max = ct.evaluate(joined, feeds)
    assert np.float32(ours_max) == np.abs(np.asarray(ours_y, np.float32)).max()
    np.testing.assert_array_equal(np.float32(ours_max), np.float32(ct.evaluate([biggest], feeds)[0]))


def test_a_row_max_of_a_value_no_kernel_makes_joins_its_cast_where_neither_waits_for_the_other():
    """The row maxima of a product's result (a GEMM makes it: no kernel of ours to fold them) join the kernel that
    casts it at a scale given beforehand, which then folds them as it reads the rows; where the cast's scale comes
    from those maxima, the cast waits for them, and they stay a kernel of their own. Same bits either way."""
    x, w = ct.var("x", (256, 128), "bfloat16"), ct.var("w", (128, 768), "bfloat16")
    scale = ct.var("s", (), "float32")
    h = ct.cast(ct.matmul(x, w), "float32")
    amax = ct.max(ct.abs(h))
    delayed = ct.cast(h * scale, "float8_e4m3fn")
    current = ct.cast(h * (448.0 / amax), "float8_e4m3fn")
    joined, trace = _planned([delayed, amax])
    assert [r.rule for r in trace].count("row-reduction-into-sibling") == 1
    assert any(kind == ROW_KERNEL for _, _, kind in _kernels(joined))
    assert "row-reduction-into-sibling" not in [r.rule for r in _planned([current, amax])[1]]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16),
             "w": rng.standard_normal((128, 768)).astype(ml_dtypes.bfloat16), "s": np.float32(4.0)}
    for ours, expected in zip(ct.evaluate(list(joined), feeds), ct.evaluate([delayed, amax], feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32))


def test_two_row_maxima_that_would_each_wait_for_the_others_sibling_join_one_only():
    """Each max reads a value made from the other's sibling cast: each join is fine alone, both would make the two
    kernels wait for each other; the second, checked on the graph the first made, is refused. Same bits."""
    x1, x2 = ct.var("x1", (256, 128), "bfloat16"), ct.var("x2", (256, 128), "bfloat16")
    w, scale = ct.var("w", (128, 768), "bfloat16"), ct.var("s", (), "float32")
    h1, h2 = (ct.cast(ct.matmul(x, w), "float32") for x in (x1, x2))
    e1, e2 = (ct.cast(h * scale, "float8_e4m3fn") for h in (h1, h2))
    k1, k2 = (ct.sum(ct.cast(e, "float32")) for e in (e1, e2))
    outputs = [e1, e2, ct.max(ct.abs(h1) * k2), ct.max(ct.abs(h2) * k1)]
    joined, trace = _planned(outputs)
    assert [r.rule for r in trace].count("row-reduction-into-sibling") == 1
    rng = np.random.default_rng(3)
    feeds = {"x1": rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16),
             "x2": rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16),
             "w": rng.standard_normal((128, 768)).astype(ml_dtypes.bfloat16), "s": np.float32(0.5)}
    for ours, expected in zip(ct.evaluate(list(joined), feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32))


def test_a_max_that_only_one_value_a_row_reads_costs_the_row_kernel_no_pass():
    """A row kernel writing ``y`` and its rows' max folds the max in the pass that writes ``y``: one loop over
    the row's 384 vectors, where a max that the row's outputs read takes a pass before them."""
    shape = (4096, 3072)
    operand = Operand(shape, np.dtype(ml_dtypes.bfloat16), contiguous_strides(shape))
    x = parameter(0, operand)
    y = ct.cast(ct.tanh(ct.cast(x, "float32")) * 2.0, "bfloat16")
    trailing = (y, ct.max(ct.abs(ct.cast(y, "float32")), axis=-1, keepdims=True))
    assert row_shape(trailing) == shape
    (one,) = sources.kernel_sources(trailing, [operand])
    assert one.text.count("r = c * 8 + u;") == 1
    assert one.block == (256, 1, 1) and one.blocks == 4096 // 8  # a warp a row: many rows of 384 vectors
    leading = (x / ct.max(ct.abs(x), axis=-1, keepdims=True),)
    (two,) = sources.kernel_sources(leading, [operand])
    assert two.text.count("r = c * 8 + u;") == 2 and two.blocks == 4096  # two passes, a block a row of 3072


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(512, 768), (300, 3000), (4096, 3072)])
def test_on_the_gpu_a_row_max_folded_as_its_rows_are_written_is_the_max_of_what_is_stored(shape, dtype):
    """``gelu(x) * 3`` and the largest magnitude of it: the rows' maxima folded by the kernel that writes the rows (a
    warp a row of 768, a block a row of 3000, a warp a row of 3072 in a kernel of one pass), then the max of the
    rows. Exactly the max of the values the kernel stored; those values as the reference's."""
    skip_without_device("cupy")
    x = ct.var("x", shape, dtype)
    y = ct.gelu(x) * 3.0
    amax = ct.max(ct.abs(ct.cast(y, "float32")))
    program = ct.compile([y, amax], inputs=[x], backend="cupy")
    assert "row-reduction-into-producer" in program.traces["fusion"].counts()
    values = (np.random.default_rng(2).standard_normal(shape) * 5).astype(np.dtype(ml_dtypes.bfloat16) if dtype ==
                                                                          "bfloat16" else np.float32)
    values[shape[0] // 2, 7] = 60.0
    ours, biggest = (host(v) for v in program(x=values))
    assert np.float32(biggest) == np.abs(ours.astype(np.float32)).max()
    expected = ct.evaluate([y], {"x": values}, precision="float64")[0]
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(ours.astype(np.float64), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("join", ["into_producers", "into_siblings"])
def test_on_the_gpu_a_float8_gpt_step_is_the_same_bits_with_its_row_maxima_joined(monkeypatch, join):
    """A one-layer float8 GPT: its amax row maxima folded where the rows are written (or, of the attention's output,
    where its cast reads them), against the same step with each such row max a kernel of its own: fewer kernels,
    and three steps give the same losses and state, bit for bit."""
    skip_without_device("cupy")
    joined = float8_gpt_trained()
    monkeypatch.setattr(compiler, join, lambda roots, trace: tuple(roots))
    apart = float8_gpt_trained()
    assert len(joined[0]) < len(apart[0])
    assert_same_training(joined, apart)
