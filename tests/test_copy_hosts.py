"""A value made again after the memory peak joining the row kernel of the backward pass that reads all it reads
(``memplan.copy_hosts``): a layer norm's output, made again for the weight gradient after it, is written by the
layer norm's input-gradient kernel; where no such kernel exists the copy stays a kernel of its own; the values are
the same bits either way. Planned for the GPU on the CPU (no device is asked, no call needs scratch)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

import cortado as ct
from cortado import compiler, nn
from cortado.backends.cupy import backend as gpu_backend
from gpu_rewrites import planning_without_a_device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import gpt  # noqa: E402
from test_row_values import _normalized_steps  # noqa: E402


def _planner(monkeypatch):
    """``plan(outputs, inputs, join=True)``: the GPU's plan with recomputation, and without its copies joined."""
    planning_without_a_device(monkeypatch)

    def plan(outputs, inputs, join=True):
        if not join:
            monkeypatch.setattr(compiler, "into_row_kernels", lambda roots, copies: (roots, copies, {}))
        signature = compiler._signature(outputs, inputs, None, None)
        options = compiler._options(gpu_backend, {})
        return compiler._recomputing(compiler._built(signature, gpu_backend, options), signature, gpu_backend, options)

    return plan


@pytest.fixture
def planned_on_the_cpu(monkeypatch):
    return _planner(monkeypatch)


def _feeds(variables, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in variables:
        if v.dtype.kind == "i":
            feeds[v.name] = rng.integers(0, 11, v.shape).astype(v.dtype)
        else:
            feeds[v.name] = (0.2 * rng.standard_normal(v.shape)).astype(v.dtype)
    return feeds


def test_a_gpts_layer_norm_outputs_made_again_are_written_by_their_input_gradients_kernels(planned_on_the_cpu):
    model = gpt.GPT(11, context=16, width=64, heads=2, layers=2).compute_in("bfloat16")
    tokens, labels = ct.var("tokens_in", (2, 16), "int32"), ct.var("labels", (2, 16), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = list(model.parameters().values())
    outputs, inputs = [loss, *ct.grad(loss, params)], [tokens, labels, *params]
    joined = planned_on_the_cpu(outputs, inputs)
    counts = joined.traces["recompute"].counts()
    assert counts["copy-into-row-kernel"] == counts["recompute-after-the-peak"] == 4
    apart = planned_on_the_cpu(outputs, inputs, join=False)
    # each weight gradient reading what a kernel of ours writes for it alone: two crops and a reshape, views of the
    ones = counts["gemm-bias-gradient-ones"]  # product of its input padded with ones (which copies apart are not)
    apart_ones = apart.traces["recompute"].counts()["gemm-bias-gradient-ones"]
    assert len(joined.kernels) - 3 * ones == len(apart.kernels) - 3 * apart_ones - 4
    assert not any(k.term.op.name == "fused" and k.term.attr("again") for k in joined.kernels)
    feeds = _feeds(inputs)
    for ours, theirs in zip(ct.evaluate(list(joined.roots), feeds), ct.evaluate(list(apart.roots), feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))


def test_a_copy_no_backward_row_kernel_reads_for_stays_a_kernel_of_its_own(planned_on_the_cpu):
    """A layer norm of an input that takes no gradient has no input-gradient kernel: its output made again for the
    weight gradient after it stays a copy."""
    x = ct.var("x", (8, 64, 64), "bfloat16")
    W1, W2 = ct.var("W1", (64, 256), "bfloat16"), ct.var("W2", (256, 64), "bfloat16")
    norm = nn.LayerNorm(64)
    y = ct.relu(norm(x) @ W1) @ W2
    loss = ct.sum(ct.cast(y * y, "float32"))
    params = [W1, W2, norm.weight, norm.bias]
    plan = planned_on_the_cpu([loss, *ct.grad(loss, params)], [x, *params])
    counts = plan.traces["recompute"].counts()
    assert counts["recompute-after-the-peak"] > 0 and "copy-into-row-kernel" not in counts


@settings(max_examples=25)
@given(_normalized_steps())
def test_a_layer_norms_step_computes_the_same_bits_with_copies_joined(case):
    """Layer norm steps in their written forms, planned with recomputation, with and without the copies joined:
    the same bits."""
    outputs, feeds = case
    inputs = [v for v in _variables(outputs) if v.name in feeds]
    with pytest.MonkeyPatch.context() as patched:
        joined = _planner(patched)(outputs, inputs)
        apart = _planner(patched)(outputs, inputs, join=False)
    for ours, theirs in zip(ct.evaluate(list(joined.roots), feeds), ct.evaluate(list(apart.roots), feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))


def _variables(outputs):
    from cortado.exprgraph.graph import post_order
    from cortado.exprgraph.ops import VAR

    return list(dict.fromkeys(t for t in post_order(outputs) if t.op is VAR))
