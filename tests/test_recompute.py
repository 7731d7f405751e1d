"""Recomputation: elementwise values the backward pass reads are made again where they are read, instead of
being held across the memory peak, only where that shrinks the arena, and never changing a value."""

import sys
from pathlib import Path

import numpy as np
import pytest

import cortado as ct
from cortado import nn, optim
from cortado.memplan import recompute
from cortado.memplan.recompute import Choice, choices, peak_step, recomputed
from cortado.exprgraph.graph import post_order
from cortado.rules.fusion import KernelShapes, fuse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def _block(batch=32, width=16):
    """A pre-norm MLP block's training step: layer norm, a gelu MLP, a residual, SGD on its weights."""
    x = ct.var("x", (batch, width))
    gain, bias = ct.var("gain", (width,)), ct.var("bias", (width,))
    w1, w2 = ct.var("w1", (width, 4 * width)), ct.var("w2", (4 * width, width))
    mean = ct.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    normed = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * gain + bias
    h = x + ct.gelu(ct.tanh(normed @ w1)) @ w2
    loss = ct.mean(h * h)
    params = [gain, bias, w1, w2]
    grads = ct.grad(loss, params)
    rng = np.random.default_rng(0)
    state = {p: rng.standard_normal(p.shape).astype(np.float32) * 0.3 for p in params}
    return loss, x, state, {p: p - 0.1 * g for p, g in zip(params, grads)}


def _compiled(recompute, block=None):
    loss, x, state, updates = block or _block()
    return ct.compile([loss], inputs=[x], state=state, updates=updates, recompute=recompute, debug=True)


def test_recomputing_shrinks_the_arena_and_changes_no_value():
    kept, again = _compiled(False), _compiled(True)
    assert again.memory.peak_bytes < kept.memory.peak_bytes
    assert len(again.kernels) > len(kept.kernels)  # the copies
    feed = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    for _ in range(3):  # the updated state too
        np.testing.assert_array_equal(again(x=feed)[0], kept(x=feed)[0])
    for name in ("gain", "bias", "w1", "w2"):
        np.testing.assert_array_equal(again.state[name], kept.state[name])


def test_the_copies_run_after_the_peak_just_before_their_readers():
    block = _block()
    program = _compiled(True, block)
    before = {t for k in _compiled(False, block).kernels for t in k.terms}
    copies = [i for i, k in enumerate(program.kernels) if k.term.op.name == "fused" and k.term not in before
              and all(a in before or a.op.name == "var" for a in k.term.args)]
    assert copies
    peak = peak_step(program.memory)
    for i in copies:
        readers = [j for j, k in enumerate(program.kernels) if set(program.kernels[i].terms) & set(k.term.args)]
        assert i > peak and readers and min(readers) - i <= 3


def _chosen(loss, inputs, state, updates):
    """The recomputations ``choices`` finds in the step, and the step as built."""
    from cortado import compiler
    from cortado.backends import backend_named

    signature = compiler._signature([loss], inputs, state, updates)
    engine = backend_named("numpy")
    built = compiler._built(signature, engine, compiler._options(engine, {}))
    return choices(built.kernels, built.steps, built.plan, built.nbytes, built.kept, built.live_out), built


def test_what_is_chosen_is_made_from_what_is_held_anyway():
    """The gelu's output again from its input, which gelu's gradient holds anyway, costs nothing extra: chosen."""
    loss, x, state, updates = _block()
    chosen, built = _chosen(loss, [x], state, updates)
    assert chosen
    for choice in chosen:
        again = [choice.terms[j] for j in choice.again]
        assert all(v.op.name == "fused" for v in again)
        assert not set(again) & set(choice.leaves)
        assert all(choice.late[j] for j in choice.again)
        assert not set(again) & set(built.live_out)


def _gpt_step(dtype):
    """The training step of examples/gpt.py's GPT (one small layer, AdamW)."""
    import gpt

    model = gpt.GPT(63, context=64, width=64, heads=4, layers=1).compute_in(dtype)
    tokens, labels = ct.var("tokens_in", (8, 64), "int32"), ct.var("labels", (8, 64), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-3).updates(params, ct.grad(loss, list(params.values())))
    return loss, [tokens, labels], {**model.initial_values(0), **state}, updates


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_what_is_made_again_together_has_one_shape(dtype):
    """A layer norm's reciprocal spread (one value a row, which its gradient reads) is elementwise over the spread
    the copy keeps, but made beside the normalized rows it would be an elementwise kernel of two shapes, whose loop
    writes each output over the rows' elements (on the GPU past the end of the small one): it is kept instead."""
    loss, inputs, state, updates = _gpt_step(dtype)
    chosen, _ = _chosen(loss, inputs, state, updates)
    assert any(choice.terms[j].shape[-1] == 1 for choice in chosen for j in range(len(choice.terms)))  # the spreads
    assert chosen and all(len({choice.terms[j].shape for j in choice.again}) == 1 for choice in chosen)
    rng = np.random.default_rng(0)
    feed = {"tokens_in": rng.integers(0, 63, (8, 64)).astype(np.int32),
            "labels": rng.integers(0, 63, (8, 64)).astype(np.int32)}
    kept, again = (ct.compile([loss], inputs=inputs, state=state, updates=updates, recompute=r) for r in (False, True))
    assert again.memory.peak_bytes < kept.memory.peak_bytes
    np.testing.assert_array_equal(again(**feed)[0], kept(**feed)[0])


def test_a_program_without_a_backward_pass_is_left_as_it_was():
    x = ct.var("x", (64, 64))
    y = ct.gelu(x * 2.0)
    program = ct.compile([ct.sum(y @ y.T), y], inputs=[x])
    assert [k.term.op.name for k in program.kernels].count("fused") == len(
        [k for k in ct.compile([ct.sum(y @ y.T), y], inputs=[x], recompute=False).kernels if k.term.op.name == "fused"])


def test_a_kernel_made_again_from_its_own_operand_is_a_kernel_of_its_own():
    """gelu's output again from gelu's input (which its gradient holds): the copy reads what the kernel read and
    computes what it computed, and is still a second kernel (``again``), not the first one found twice."""
    x = ct.var("x", (8, 8))
    (gelu,), _ = fuse([ct.gelu(x)], shapes=KernelShapes(one_op=True))
    late = ct.sum(gelu)
    (rewritten,), copies, made = recomputed([late], [Choice((gelu,), (0,), (x,), {0: (late,)})])
    copy = made[gelu]
    assert copy is not gelu and copy.args == gelu.args and copy.attr("again") and not gelu.attr("again")
    assert rewritten.args == (copy,) and copies == {copy: (rewritten,)}


@pytest.mark.parametrize("late_first", [False, True])
def test_a_kernel_stops_computing_what_only_its_copy_is_read_for(late_first):
    """A layer norm's normalized rows, read after the peak alone, made again there from the centered rows and their
    spread: the first kernel no longer computes them, and its other outputs are renumbered for their readers and
    for the copy, whichever of them the program reaches first."""
    x = ct.var("x", (8, 8))
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    spread = ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True))
    (normed, kept_centered, kept_spread), _ = fuse([centered / spread, centered, spread], shapes=KernelShapes(one_op=True))
    early, late = ct.exp(kept_centered) + kept_spread, ct.sum(normed)
    choice = Choice((normed, kept_centered, kept_spread), (0,), (kept_centered, kept_spread), {0: (late,)}, (0,))
    roots = [late, early] if late_first else [early, late]
    rewritten = dict(zip(roots, recomputed(roots, [choice])[0]))
    made = recomputed(roots, [choice])[2]
    early_again, late_again = rewritten[early], rewritten[late]
    slim = early_again.args[0].args[0]  # exp's operand: the kernel's centered rows
    assert len(slim.attr("outputs")) == 2 and slim.attr("index") == 0
    assert late_again.args == (made[normed],) and made[normed].args == (slim, early_again.args[1])
    bodies = {t.attr("outputs") for t in post_order([early_again, late_again]) if t.op.name == "fused"}
    assert len(bodies) == 2  # the slim kernel and the copy: the first kernel is gone
    x_value = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    for ours, theirs in zip(ct.evaluate([early_again, late_again], {"x": x_value}),
                            ct.evaluate([early, late], {"x": x_value})):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_a_narrow_copy_of_a_wide_value_is_not_made_again():
    """A float8 copy of a bfloat16 activation reads two bytes for each byte it makes: more time than the bytes it
    frees are worth. A gelu's output from its input, or a layer norm's rows from its rows and their statistics,
    read about a byte a byte: cheap."""
    rows, stats = ct.var("rows", (8192, 768), "bfloat16"), ct.var("stats", (8192, 1))
    assert not recompute.cheap([rows], 8192 * 768)  # float8 from bfloat16
    assert recompute.cheap([rows, stats], 8192 * 768 * 2)  # bfloat16 from bfloat16 and a float32 a row
    assert recompute.cheap([ct.var("h", (64, 64))], 64 * 64 * 4)


def test_an_elementwise_kernel_of_two_shapes_is_refused_where_it_is_generated():
    """The GPU's elementwise loop writes every output over the first one's elements: a body of two shapes is an
    error when its source is made, never a kernel writing past a buffer."""
    from cortado.backends.cupy.codegen import Operand, contiguous_strides, elementwise_source
    from cortado.errors import BackendError
    from cortado.exprgraph.ops import parameter

    rows, spread = ct.var("rows", (8, 4)), ct.var("spread", (8, 1))
    body = (parameter(0, rows) * 2.0, 1 / parameter(1, spread))
    with pytest.raises(BackendError, match="outputs of one shape"):
        elementwise_source(body, [Operand(v.shape, v.dtype, contiguous_strides(v.shape)) for v in (rows, spread)])
