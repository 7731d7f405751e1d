"""Bias gradients as columns of their weight gradients' products (``lowering/bias_gradient_ones.py``) on an NVIDIA
GPU: a layer norm's input-gradient kernel (a row kernel), or gelu's backward kernel (elementwise), writes the input it
makes again for a weight gradient with columns of ones after each row, and that product's last columns are the bias
gradient. Against the reference and against the same step with cuBLASLt's BGRAD epilogue. Skipped where no GPU is
visible."""

import sys
from pathlib import Path

import numpy as np
import pytest

import cortado as ct
from cortado import compiler, nn
from cortado.backends import gpu_visible
from cortado.backends.cupy import CupyBackend
from cortado.backends.cupy.lowering.bias_gradient_ones import ones_columns
from cortado.rules.engine import Trace

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from gpt import GPT  # noqa: E402


def _gpt_gradients(width):
    """A two-layer bfloat16 GPT's loss and gradients, as a program for the GPU, its feeds and the graph."""
    model = GPT(16, context=32, width=width, heads=4, layers=2).compute_in("bfloat16")
    tokens, labels = ct.var("tokens", (4, 32), "int32"), ct.var("labels", (4, 32), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    outputs = [loss, *ct.grad(loss, list(params.values()))]
    rng = np.random.default_rng(3)
    feeds = {"tokens": rng.integers(0, 16, (4, 32)).astype(np.int32),
             "labels": rng.integers(0, 16, (4, 32)).astype(np.int32)}
    state = model.initial_values(0)
    program = ct.compile(outputs, inputs=[tokens, labels], state=state, backend="cupy", debug=True)
    return program, feeds, outputs, {v.name: value for v, value in state.items()}


@pytest.mark.parametrize("width", [64, 128])
def test_a_gpts_bias_gradients_from_padded_rows_match_bgrad_and_the_reference(width, monkeypatch):
    monkeypatch.setattr(compiler, "ARENA_GROWTH", np.inf)  # (a toy's arena may grow more than the ones take)
    program, feeds, outputs, values = _gpt_gradients(width)
    ones = program.traces["recompute"].counts()["gemm-bias-gradient-ones"]  # as many as the plan made copies for
    widths = (width + ones_columns(width), 4 * width + ones_columns(4 * width))
    padded = [k for k in program.kernels if k.term.op.name == "gemm" and k.term.shape[-1] in widths]
    assert ones >= 2 and len(padded) == ones and all(k.term.attr("epilogue") == "none" for k in padded)
    ours = [np.asarray(a.get(), np.float64) for a in program(**feeds)]

    monkeypatch.setattr(CupyBackend, "after_recomputation", lambda self, roots, copies, trace: (roots, copies))
    bgrad, _, _, _ = _gpt_gradients(width)
    assert "gemm-bias-gradient-ones" not in bgrad.traces.get("recompute", Trace()).counts()
    theirs = [np.asarray(a.get(), np.float64) for a in bgrad(**feeds)]

    expected = ct.evaluate(outputs, {**feeds, **values}, precision="float64")
    for a, b, e in zip(ours, theirs, expected):
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(a / scale, e / scale, rtol=5e-2, atol=5e-2)
        np.testing.assert_allclose(a / scale, b / scale, rtol=2e-2, atol=1e-2)  # bfloat16 roundings apart


def _normed_mlp_gradients(dtype):
    """A layer norm and a relu MLP over float32 weights computed in ``dtype``, the gradients of its input and every
    weight, as a program for the GPU (the layer norm's input gradient an output: its kernel writes the ones too), and
    its feeds."""
    x, t = ct.var("x", (4, 64, 128), dtype), ct.var("t", (4, 64, 128), dtype)
    model = nn.Sequential(nn.LayerNorm(128), nn.MLP(128, 384, 128)).compute_in(dtype)
    loss = ct.sum(ct.cast(model(x) * t, "float32"))
    params = model.parameters()
    outputs = [loss, *ct.grad(loss, [x, *params.values()])]
    program = ct.compile(outputs, inputs=[x, t], state=model.initial_values(1), backend="cupy", debug=True)
    rng = np.random.default_rng(4)
    return program, {"x": rng.standard_normal(x.shape).astype(x.dtype), "t": rng.standard_normal(t.shape).astype(t.dtype)}


def test_a_normed_mlps_gradients_with_its_input_gradient_asked_for_match_bgrads(monkeypatch):
    dtype = "bfloat16"  # (in float16 the H200's plan keeps the layer norm's output rather than make it again)
    monkeypatch.setattr(compiler, "ARENA_GROWTH", np.inf)
    program, feeds = _normed_mlp_gradients(dtype)
    assert program.traces["recompute"].counts()["gemm-bias-gradient-ones"] == 1, program.explain()
    ours = [np.asarray(a.get(), np.float64) for a in program(**feeds)]
    monkeypatch.setattr(CupyBackend, "after_recomputation", lambda self, roots, copies, trace: (roots, copies))
    theirs = [np.asarray(a.get(), np.float64) for a in _normed_mlp_gradients(dtype)[0](**feeds)]
    for a, b in zip(ours, theirs):  # (against the float64 reference, a relu's kink moves with bfloat16's rounding)
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a / scale, b / scale, rtol=2e-2, atol=1e-2)
