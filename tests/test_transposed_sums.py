"""A column sum joining the transposed kernel that reads the same rows (``backends/cupy/lowering/transposed_sums``,
``transposed_kernels.transposed_sum_sources``): a float8 layer's bias gradient summed by the kernel that casts the
gradient to float8 written transposed. Which sums join, that the plan computes what it did, and on the GPU that the
cast's bits are the reference's and the sums the reference's within float32's rounding, the same every run."""

import ml_dtypes
import numpy as np
import pytest

import cortado as ct
import cortado.backends.cupy as cupy_backend
from cortado import compiler
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy import sources
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import parameter
from cortado.rules.fusion import TRANSPOSED_SUMS_KERNEL
from float8_plans import assert_same_bits, float8_mlp_step
from reference_checks import host, skip_without_device

BF16 = np.dtype(ml_dtypes.bfloat16)


def _planned(outputs, join=True, monkeypatch=None):
    if not join:
        monkeypatch.setattr(cupy_backend, "sums_into_transposed", lambda roots, trace: roots)
    traces = {}
    return compiler._rewrite(outputs, gpu_backend, traces), traces["fusion"]


def _joined(roots):
    return {t.attr("outputs") for t in post_order(roots)
            if t.op.name == "fused" and t.attr("kernel") == TRANSPOSED_SUMS_KERNEL}


def test_a_float8_steps_bias_gradients_join_the_casts_of_their_gradients(monkeypatch):
    """The float8 MLP's step as the GPU plans it: the hidden layer's bias gradient (with its AdamW step) is summed by
    the kernel casting that layer's gradient to e5m2, written only transposed (the input needs no gradient); every
    value is the bits of the plan without."""
    outputs, values, x, y = float8_mlp_step((256, 512, 256), (4, 128))
    ours, trace = _planned(outputs)
    apart, _ = _planned(outputs, join=False, monkeypatch=monkeypatch)
    assert [r.rule for r in trace].count("column-sum-into-transposed") == 1
    (body,) = _joined(ours)
    assert [(o.shape, o.dtype.name) for o in body] == [((512, 512), "float8_e5m2")] + [((512,), "float32")] * 3
    assert not _joined(apart)
    assert_same_bits(ours, apart, values, x, y)


Y8 = ct.var("y", (512, 128), "float8_e4m3fn")


def _cast_and_product(x, scale):
    """``x`` (512 rows) cast to e5m2 and read transposed by a float8 product with ``Y8``, so that its cast writes it
    transposed."""
    q = ct.cast(ct.cast(x, "float32") * scale, "float8_e5m2")
    return ct.cast(ct.matmul(ct.transpose(q), Y8), "bfloat16")


def test_a_column_sum_joins_only_a_cast_that_reads_its_rows_and_waits_for_nothing_of_it():
    x, z = ct.var("x", (512, 256), "bfloat16"), ct.var("z", (512, 256), "bfloat16")
    scale = ct.var("s", (), "float32")
    column = ct.sum(ct.cast(x, "float32"), axis=0) * 0.5
    joins = [r.rule for r in _planned([_cast_and_product(x, scale), column])[1]]
    assert joins.count("column-sum-into-transposed") == 1
    other = ct.sum(ct.cast(x, "float32") * ct.cast(z, "float32"), axis=0)  # reads z, which the cast does not
    assert "column-sum-into-transposed" not in [r.rule for r in _planned([_cast_and_product(x, scale), other])[1]]
    waiting = _cast_and_product(x, 1.0 / ct.max(ct.abs(column)))  # the cast's scale comes from the sum
    assert "column-sum-into-transposed" not in [r.rule for r in _planned([waiting, column])[1]]


def test_sibling_sums_are_taken_apart_each_joining_its_own_cast():
    """Two gradients' column sums times a rate they share, which fusion makes one kernel of sibling sums (as it does
    two layers' bias gradients with their AdamW steps), each join the cast of their own gradient; where only one
    gradient is cast, the other's sum stays a reduction, of its own operands alone."""
    x, z = ct.var("x", (512, 256), "bfloat16"), ct.var("z", (512, 256), "bfloat16")
    scale, rate = ct.var("s", (), "float32"), ct.var("t", (), "float32")
    sums = [ct.sum(ct.cast(v, "float32"), axis=0) * rate for v in (x, z)]
    roots, trace = _planned([_cast_and_product(x, scale), _cast_and_product(z, scale), *sums])
    assert [r.rule for r in trace].count("column-sum-into-transposed") == 2
    roots, trace = _planned([_cast_and_product(x, scale), *sums])
    assert [r.rule for r in trace].count("column-sum-into-transposed") == 1
    (alone,) = {t.attr("outputs"): t for t in post_order(roots) if t.op.name == "fused"
                and t.attr("kernel") == "reduction" and t.shape == (256,)}.values()
    assert z in alone.args and x not in alone.args and len(alone.attr("outputs")) == 1
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((512, 256)).astype(BF16), "z": rng.standard_normal((512, 256)).astype(BF16),
             "s": np.float32(2.0), "t": np.float32(0.5), "y": rng.standard_normal((512, 128)).astype(ml_dtypes.float8_e4m3fn)}
    for ours, expected in zip(ct.evaluate(list(roots), feeds),
                              ct.evaluate([_cast_and_product(x, scale), *sums], feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32))


def test_two_sums_that_would_each_wait_for_the_others_cast_join_one_cast_only():
    """Each sum reads a value made from the other gradient's cast: each join is fine alone, but both would make the
    two kernels wait for each other; one join, checked on the graph the other made, is refused."""
    a, c = ct.var("a", (512, 64), "bfloat16"), ct.var("c", (512, 64), "bfloat16")
    w, scale = ct.var("w", (64, 256), "bfloat16"), ct.var("s", (), "float32")
    x, z = ct.matmul(a, w), ct.matmul(c, w)
    casts = [_cast_and_product(v, scale) for v in (x, z)]
    totals = [ct.sum(ct.cast(ct.cast(ct.cast(v, "float32") * scale, "float8_e5m2"), "float32")) for v in (x, z)]
    sums = [ct.sum(ct.cast(x, "float32"), axis=0) * totals[1], ct.sum(ct.cast(z, "float32"), axis=0) * totals[0]]
    roots, trace = _planned([*casts, *sums])
    assert [r.rule for r in trace].count("column-sum-into-transposed") == 1
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((512, 64)).astype(BF16), "c": rng.standard_normal((512, 64)).astype(BF16),
             "w": rng.standard_normal((64, 256)).astype(BF16), "s": np.float32(2.0),
             "y": rng.standard_normal((512, 128)).astype(ml_dtypes.float8_e4m3fn)}
    for ours, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate([*casts, *sums], feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32))


def _sums_body(shape):
    """A gradient's e5m2 cast, in order and transposed, and its columns' sums times a vector (an epilogue reading an
    operand of the sums' shape), over a bfloat16 ``shape``, a vector and a scale."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    operands = [Operand(shape, BF16, contiguous_strides(shape)), Operand((), np.dtype(np.float32), ()),
                Operand((cols,), np.dtype(np.float32), (1,))]
    x, s, v = (parameter(k, o) for k, o in enumerate(operands))
    q = ct.cast(ct.cast(x, "float32") * s, "float8_e5m2")
    total = ct.sum(ct.cast(x, "float32"), axis=tuple(range(len(shape) - 1))) * v
    return (q, ct.transpose(ct.reshape(q, (rows, cols))), total), operands


def test_a_transposed_kernel_that_sums_its_columns_is_two_kernels_with_a_part_a_tile_row():
    body, operands = _sums_body((8, 1024, 768))
    first, second = sources.kernel_sources(body, operands, kernel=TRANSPOSED_SUMS_KERNEL)
    assert first.blocks == (6, 64, 1) and second.blocks == 24  # tiles of 128 x 128; 32 columns a block
    assert "partials" in first.text and "partials" in second.text
    assert sources.reduction_scratch_bytes(body, operands, TRANSPOSED_SUMS_KERNEL) == 64 * 768 * 4


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 1024, 768), (2, 130, 260), (36, 12)])
def test_on_the_gpu_a_transposed_kernel_sums_its_columns_as_the_reference_and_the_same_every_run(shape):
    """The cast, in order and transposed, is the reference's bits; the sums are within float32's rounding of the
    reference's, and two runs give the same bits; sides of whole tiles or not."""
    skip_without_device("cupy")
    import cupy

    from cortado.backends.cupy.kernels import launcher

    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    body, operands = _sums_body(shape)
    rng = np.random.default_rng(6)
    given = [(rng.standard_normal(shape) * 30).astype(BF16), np.float32(512.0), rng.standard_normal(cols).astype(np.float32)]
    kernels = sources.kernel_sources(body, operands, kernel=TRANSPOSED_SUMS_KERNEL)
    scratch = cupy.zeros(sources.reduction_scratch_bytes(body, operands, TRANSPOSED_SUMS_KERNEL), np.uint8)

    def run():
        inputs = [cupy.asarray(np.asarray(g).reshape(-1).view(np.uint8)) for g in given]
        outs = [cupy.zeros(rows * cols, np.uint8), cupy.zeros(rows * cols, np.uint8), cupy.zeros(cols * 4, np.uint8)]
        places = [a.data.ptr for a in inputs + outs] + [scratch.data.ptr]
        for source in kernels:
            launcher(source, places)()
        cupy.cuda.Device().synchronize()
        return [host(out) for out in outs]

    written, turned, total = run()
    expected = np.asarray(ct.evaluate([ct.cast(ct.cast(ct.const(given[0]), "float32") * 512.0, "float8_e5m2")],
                                      {})[0]).reshape(rows, cols).view(np.uint8)
    np.testing.assert_array_equal(written.reshape(rows, cols), expected)
    np.testing.assert_array_equal(turned.reshape(cols, rows), expected.T)
    exact = given[0].astype(np.float64).reshape(rows, cols).sum(axis=0) * given[2]
    magnitude = np.abs(given[0].astype(np.float64)).reshape(rows, cols).sum(axis=0) * np.abs(given[2])
    assert np.all(np.abs(total.view(np.float32) - exact) <= 1e-5 * magnitude + 1e-6)
    np.testing.assert_array_equal(run()[2], total)
