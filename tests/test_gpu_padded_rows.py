"""Large bfloat16 and float16 products whose rows are not whole 16-byte vectors, on an NVIDIA GPU: computed padded,
their operands copied with zeros after them and their products packed after (``targets.gemm.gemm_padding``), in an
arena filled with NaNs first. Against the reference, whichever axis is padded; a product with a bias is not padded.
Skipped where no GPU is visible."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends import gpu_visible
from cortado.backends.cupy.calls.cublaslt import Gemm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]


def _values(rng, shape, dtype):
    import ml_dtypes

    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)


def _gemm_calls(program):
    """What ``explain`` says of each cuBLASLt call of ``program``."""
    return [made.describe() for made, _ in program._executor.tuned if isinstance(made.library, Gemm)]


def _close(program, outputs, feeds):
    """``program``'s outputs for ``feeds`` against the reference, its arena (the workspace, where the padded copies and
    products lie) first filled with NaN bytes: the zeros after each padded operand are the copies' own."""
    program._executor.arena.memory.fill(0xFF)  # 0xFFFF: a NaN in bfloat16 and in float16
    got = program(**feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    expected = ct.evaluate(outputs, feeds, precision="float64")
    for a, e in zip(got, expected):
        a = np.asarray(a.get(), np.float64)
        np.testing.assert_allclose(a, e, rtol=2e-2, atol=2e-2 * float(np.abs(e).max()))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_vocabulary_of_63_runs_padded_and_matches_the_reference(dtype):
    rng = np.random.default_rng(0)
    x, w = ct.var("x", (8192, 768), dtype), ct.var("w", (63, 768), dtype)
    dy = ct.var("dy", (8192, 63), dtype)
    logits = ct.matmul(x, ct.transpose(w))
    outputs = [logits, ct.matmul(dy, w), ct.matmul(ct.transpose(dy), x)]  # the head, its input's and weight's gradients
    program = ct.compile(outputs, inputs=[x, w, dy], backend="cupy")
    said = _gemm_calls(program)
    assert sum("product written padded" in s for s in said) == 2  # the head's 64 columns, the weight's 64 rows
    assert sum("operands copied padded" in s for s in said) == 3  # the weight's row of zeros, dy's column
    assert "product written padded, then packed" in program.explain()
    _close(program, outputs, {"x": _values(rng, x.shape, dtype), "w": _values(rng, w.shape, dtype),
                              "dy": _values(rng, dy.shape, dtype)})


def test_a_padded_sum_a_padded_product_adding_c_and_an_unpadded_one_with_a_bias_match_the_reference():
    rng = np.random.default_rng(1)
    a, b = ct.var("a", (8192, 63), "bfloat16"), ct.var("b", (63, 512), "bfloat16")
    x, w, bias = ct.var("x", (8192, 256), "bfloat16"), ct.var("w", (256, 63), "bfloat16"), ct.var("bias", (63,), "bfloat16")
    y, c = ct.var("y", (8192, 512), "bfloat16"), ct.var("c", (63, 512), "bfloat16")
    outputs = [ct.matmul(a, b), ct.matmul(x, w) + bias, ct.matmul(ct.transpose(a), y) + c]
    program = ct.compile(outputs, inputs=[a, b, x, w, bias, y, c], backend="cupy")
    said = _gemm_calls(program)
    assert sum("operands copied padded" in s for s in said) == 2 and sum("written padded" in s for s in said) == 1
    _close(program, outputs, {v.name: _values(rng, v.shape, "bfloat16") for v in (a, b, x, w, bias, y, c)})
