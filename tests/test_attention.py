"""Attention recognised by the rules: the plain ``softmax(q @ k^T * scale + mask) @ v`` becomes one ``attention`` op
in each form it is written in, and in no form that means something else; the op equals the plain expressions (the
reference, the CPU backend blockwise, and on a GPU cuDNN's flash attention in float16 and bfloat16, the plain
expressions in float32), its gradients too, to second order; and a compiled training step stores no score matrix.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.exprgraph.graph import schedule
from cortado.gradcheck import check_grads
from cortado.rules.stability import stabiliser


def _swap(t):
    return ct.transpose(t, tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2))


def _tril(tq, tk):
    return np.tril(np.ones((tq, tk), bool))


def _operands(lead, tq, tk, d, dv, dtype="float64"):
    return (ct.var("q", lead + (tq, d), dtype), ct.var("k", lead + (tk, d), dtype), ct.var("v", lead + (tk, dv), dtype))


def _feeds(rng, *terms):
    return {t.name: rng.standard_normal(t.shape).astype(np.float32).astype(t.dtype) for t in terms}


def _ops(outputs):
    return [t.op.name for t in schedule(stabiliser.run(list(outputs)))]


# the forms a user writes causal attention in: each takes (q, k, v, scale) and returns the plain expression
def _where_after_scaling(q, k, v, c):
    return ct.softmax(ct.where(_tril(q.shape[-2], k.shape[-2]), q @ _swap(k) * c, -np.inf), axis=-1) @ v


def _where_before_scaling(q, k, v, c):
    return ct.softmax(ct.where(_tril(q.shape[-2], k.shape[-2]), q @ _swap(k), -np.inf) * c, axis=-1) @ v


def _complement_mask_divided(q, k, v, c):
    above = np.triu(np.ones((q.shape[-2], k.shape[-2]), bool), 1)
    return ct.softmax(ct.where(above, -np.inf, (q @ _swap(k)) / (1 / c)), axis=-1) @ v


def _added_mask_scale_first(q, k, v, c):
    mask = np.where(_tril(q.shape[-2], k.shape[-2]), 0, -np.inf).astype(q.dtype)
    return ct.softmax(mask + c * (q @ _swap(k)), axis=-1) @ v


def _unmasked(q, k, v, c):
    return ct.softmax(q @ _swap(k) * c, axis=-1) @ v


CAUSAL_FORMS = [_where_after_scaling, _where_before_scaling, _complement_mask_divided, _added_mask_scale_first]

shapes = st.tuples(st.lists(st.integers(1, 3), max_size=2).map(tuple), st.integers(1, 6), st.integers(1, 6),
                   st.integers(1, 5), st.integers(1, 5))


@settings(max_examples=60, deadline=None)
@given(shapes, st.sampled_from(CAUSAL_FORMS + ["plain", "keys-given-transposed"]), st.sampled_from([0.125, 0.7, 2.0]))
def test_attention_is_recognised_in_each_form_and_equals_the_plain_expressions(shape, form, scale):
    lead, tq, tk, d, dv = shape
    q, k, v = _operands(lead, tq, tk, d, dv)
    if form == "plain":
        plain = _unmasked(q, k, v, scale)
    elif form == "keys-given-transposed":  # k^T is itself a variable: attention reads its transpose
        kt = ct.var("k", lead + (d, tk), "float64")
        plain = ct.softmax(q @ kt * scale, axis=-1) @ v
        k = kt
    else:
        plain = form(q, k, v, scale)
    (recognised,) = stabiliser.run([plain])
    assert recognised.op.name == "attention"
    assert recognised.attr("causal") == (form in CAUSAL_FORMS)
    assert math.isclose(recognised.attr("scale"), scale)
    feeds = _feeds(np.random.default_rng(tq * 7 + tk), q, k, v)
    np.testing.assert_allclose(ct.evaluate(recognised, feeds), ct.evaluate(plain, feeds), rtol=1e-12, atol=1e-12)


def _padding_mask(q, k, v):
    keep = np.ones((q.shape[-2], k.shape[-2]), bool)
    keep[:, -1] = False
    return ct.softmax(ct.where(keep, q @ _swap(k), -np.inf), axis=-1) @ v


def _bottom_right_mask(q, k, v):
    keep = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool), k.shape[-2] - q.shape[-2])
    return ct.softmax(ct.where(keep, q @ _swap(k), -np.inf), axis=-1) @ v


def _finite_mask(q, k, v):
    mask = np.where(_tril(q.shape[-2], k.shape[-2]), 0, -1e9)
    return ct.softmax(q @ _swap(k) + mask, axis=-1) @ v


def _probabilities_read_elsewhere(q, k, v):
    p = ct.softmax(q @ _swap(k), axis=-1)
    return p @ v + ct.sum(p)


def _softmax_over_queries(q, k, v):
    return ct.softmax(q @ _swap(k), axis=-2) @ v


def _negative_scale(q, k, v):
    return ct.softmax(q @ _swap(k) * -0.5, axis=-1) @ v


def _keys_shared_by_heads(q, k, v):
    shared = ct.const(np.random.default_rng(2).standard_normal(k.shape[-2:]))
    return ct.softmax(q @ _swap(shared), axis=-1) @ v


def _scores_cast(q, k, v):
    return ct.softmax(ct.cast(ct.cast(q @ _swap(k), "float32"), "float64"), axis=-1) @ v


@pytest.mark.parametrize("form", [_padding_mask, _bottom_right_mask, _finite_mask, _probabilities_read_elsewhere,
                                  _softmax_over_queries, _negative_scale, _keys_shared_by_heads, _scores_cast])
def test_what_is_not_attention_stays_plain_and_correct(form):
    """Masks that are not causal, a softmax over another axis, probabilities also read elsewhere (they are stored
    anyway), a negative scale, broadcast keys, a rounding cast: the plain expressions run as written."""
    q, k, v = _operands((2,), 5, 7, 3, 4)
    plain = form(q, k, v)
    assert "attention" not in _ops([plain])
    feeds = _feeds(np.random.default_rng(0), q, k, v)
    read = [x for x in (q, k, v) if x in schedule([plain])]
    got = ct.compile([plain], inputs=read, backend="numpy")(**{x.name: feeds[x.name] for x in read})[0]
    np.testing.assert_allclose(got, ct.evaluate(plain, {x.name: feeds[x.name] for x in read}), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("order", [1, 2])
def test_gradients_agree_with_finite_differences(causal, order):
    """The attention op's gradient (``attention_grad``) and, to second order, that gradient's own, from its meaning
    spelled out in plain ops."""
    q, k, v = _operands((2,), 4, 5, 3, 2)
    out = (_where_after_scaling if causal else _unmasked)(
        q, k, v, 0.6)
    check_grads(out, [q, k, v], _feeds(np.random.default_rng(order), q, k, v), order=order)


def test_self_attention_on_one_tensor_gives_each_use_its_vjp():
    """``q``, ``k`` and ``v`` one term: the gradient sums the three VJPs, to second order."""
    x = ct.var("x", (2, 5, 3), "float64")
    out = ct.softmax(ct.where(_tril(5, 5), x @ _swap(x) * 0.5, -np.inf), axis=-1) @ x
    assert "attention" in _ops([out])
    check_grads(out, [x], _feeds(np.random.default_rng(1), x), order=2)


HEADS = 2


def _model(dtype, tq, d, causal):
    """``(x, w, [loss, out, gradient])``: causal or unmasked self-attention of ``HEADS`` heads of size ``d`` over a
    projection of ``x`` (2, ``tq``, width), heads split as a GPT splits them (a transposed view), and the loss's
    gradient for ``w`` (float32, read in ``dtype``)."""
    width = HEADS * d
    x = ct.var("x", (2, tq, width), dtype)
    w = ct.var("w", (width, 3 * width), "float32")
    projected = x @ (ct.cast(w, dtype) if dtype != "float32" else w)

    def heads(t):
        return ct.transpose(ct.reshape(t, (2, tq, HEADS, d)), (0, 2, 1, 3))

    q, k, v = map(heads, ct.split(projected, 3, axis=-1))
    out = (_where_after_scaling if causal else _unmasked)(q, k, v, 1 / math.sqrt(d))
    loss = ct.sum(ct.cast(out, "float32") ** 2)
    return x, w, [loss, out, ct.grad(loss, [w])[0]]


def _training_step(dtype, tq, d, backend, causal=True):
    """``_model`` compiled, and feeds for it."""
    x, w, outputs = _model(dtype, tq, d, causal)
    rng = np.random.default_rng(5)
    weights = rng.standard_normal(w.shape).astype(np.float32) / math.sqrt(w.shape[0])
    return ct.compile(outputs, inputs=[x], state={w: weights}, backend=backend), _feeds(rng, x)


def _reference_step(dtype, tq, d, feeds, step, causal=True):
    """``_model``'s outputs from the reference interpreter: the forward as written, the gradient as ``ct.grad`` wrote
    it."""
    _, _, outputs = _model(dtype, tq, d, causal)
    return ct.evaluate(outputs, {**feeds, "w": step.state["w"]})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("blocks", [1, 3])
def test_the_cpu_step_equals_the_reference_and_keeps_scores_only_of_one_block(dtype, blocks, monkeypatch):
    """Queries of one block keep the forward's probabilities (``lead + (Tq, Tk)``, at most a block's scores) for the
    gradient, in float32 and float64 (bfloat16 computes in float32: nothing kept); in blocks, no score matrix is
    stored. The same values either way: the gradient's probabilities are made as the forward makes them."""
    from cortado.exprgraph import attending

    if dtype == "bfloat16" and BFLOAT16 is None:
        pytest.skip("ml_dtypes is not installed")
    if blocks > 1:
        monkeypatch.setattr(attending, "BLOCK_ELEMENTS", 16 * 48 * 4)  # 16 queries a block of 4 heads
    step, feeds = _training_step(dtype, 48, 8, "numpy")
    names = [k.term.op.name for k in step.kernels]
    kept = blocks == 1 and dtype != "bfloat16"
    forward, gradient = ("attention_keeping", "attention_grad_given") if kept else ("attention", "attention_grad")
    assert names.count(forward) == 1 and names.count(gradient) == 1
    scores = [t for k in step.kernels for t in k.terms if t.ndim == 4 and t.shape[-2:] == (48, 48)]
    assert len(scores) == kept
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5
    for got, want in zip(step(**feeds), _reference_step(dtype, 48, 8, feeds, step)):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tolerance,
                                   atol=tolerance)


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_gradient_from_kept_probabilities_has_the_bits_of_one_that_makes_them_again(native, monkeypatch):
    """The kept probabilities are the very values the gradient would make: the gradients have the reference's bits
    (its attention makes them again), from the C and from NumPy's calls (``CORTADO_NATIVE=0``), NaNs and infinities
    included."""
    from cortado.backends.numpy import native as native_code

    monkeypatch.setenv("CORTADO_NATIVE", native)
    native_code.toolchain.cache_clear()
    try:
        q, k, v = _operands((2, 3), 12, 12, 8, 8, "float32")
        out = _where_after_scaling(q, k, v, 0.35)
        dout = ct.var("dout", out.shape)
        grads = ct.grad(ct.sum(out * dout), [q, k, v])
        feeds = _feeds(np.random.default_rng(1), q, k, v, dout)
        feeds["v"][0, 1, 4, 2] = np.inf
        feeds["q"][1, 0, 3, 1] = np.nan
        program = ct.compile([out, *grads], inputs=[q, k, v, dout])
        assert (program._executor.native is None) == (native == "0")
        assert {"attention_keeping", "attention_grad_given"} <= {k.term.op.name for k in program.kernels}
        ours, reference = program(**feeds), ct.evaluate([out, *grads], feeds)
        for got, want in zip(ours[1:], reference[1:]):
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        np.testing.assert_allclose(ours[0], reference[0], rtol=1e-6, atol=1e-6)  # the written form, rounded otherwise
    finally:
        native_code.toolchain.cache_clear()


def _host(value):
    return np.asarray(value.get() if hasattr(value, "get") else value, np.float64)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
def test_on_the_gpu_fused_attention_equals_the_plain_expressions(dtype, causal):
    """float16 and bfloat16: cuDNN's flash attention, forward and backward, and no score matrix in the plan;
    float32: the plain expressions, as GEMMs and a softmax. Both against the CPU's step and the reference's plain
    expressions, relative to the largest value."""
    step, feeds = _training_step(dtype, 128, 64, "cupy", causal)
    names = [k.term.op.name for k in step.kernels]
    stored = [t for k in step.kernels for t in k.terms if t.ndim == 4 and t.shape[-2:] == (128, 128)]
    if dtype == "float32":
        assert "dnn_attention" not in names and stored
    else:
        assert names.count("dnn_attention") == 1 and names.count("dnn_attention_grad") == 1 and not stored
    cpu, _ = _training_step(dtype, 128, 64, "numpy", causal)
    tolerance = 1e-4 if dtype == "float32" else 3e-2
    for got, want, plain in zip(step(**feeds), cpu(**feeds), _reference_step(dtype, 128, 64, feeds, cpu, causal)):
        scale = max(np.abs(_host(want)).max(), 1e-6)
        np.testing.assert_allclose(_host(got) / scale, _host(want) / scale, atol=tolerance, rtol=0)
        np.testing.assert_allclose(_host(got) / scale, _host(plain) / scale, atol=tolerance, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("head", [64, 12])
def test_on_the_gpu_cross_attention_of_any_head_size_is_right(head):
    """Queries and keys of different lengths, fed directly (cuDNN reads them in place); a head size cuDNN does not
    take (12) runs as the plain expressions."""
    q, k, v = _operands((2, 4), 100, 77, head, head, "bfloat16")
    out = _where_after_scaling(q, k, v, 0.3)
    gradients = ct.vjp(out, [q, k, v], ct.const(np.ones(out.shape, BFLOAT16)))
    feeds = _feeds(np.random.default_rng(4), q, k, v)
    gpu = ct.compile([out, *gradients], inputs=[q, k, v], backend="cupy")
    assert ("dnn_attention" in [k.term.op.name for k in gpu.kernels]) == (head == 64)
    cpu = ct.compile([out, *gradients], inputs=[q, k, v], backend="numpy")
    for got, want in zip(gpu(**feeds), cpu(**feeds)):
        scale = max(np.abs(_host(want)).max(), 1e-6)
        np.testing.assert_allclose(_host(got) / scale, _host(want) / scale, atol=3e-2, rtol=0)


def test_cudnn_reads_every_operand_with_the_same_dims_in_place():
    """The heads of a projection (a transposed view), the results (packed) and the statistics describe alike; a
    batch whose axes do not merge is copied."""
    from cortado.backends.cupy.calls.cudnn_attention import four_dims

    view = four_dims((8, 12, 1024, 64), (1024 * 3 * 768, 64, 3 * 768, 1))
    packed = four_dims((8, 12, 1024, 64), (12 * 1024 * 64, 1024 * 64, 64, 1))
    statistics = four_dims((8, 12, 1024, 1), (12 * 1024, 1024, 1, 1))
    assert view[0] == packed[0] == statistics[0][:3] + [64] and view[1] == [1024 * 3 * 768, 64, 3 * 768, 1]
    assert four_dims((2, 3, 5, 16, 64), (5 * 16 * 64 * 3, 64 * 16, 3 * 16 * 64, 64, 1)) is None
    assert four_dims((16, 64), (64, 1)) == ([1, 1, 16, 64], [1024, 1024, 64, 1])


def test_a_value_that_is_not_finite_reaches_the_rows_it_reaches_in_the_plain_expressions(monkeypatch):
    """Every block reads every key: an infinite value of a key that only later queries see makes the rows before
    them NaN (0 * inf) and theirs infinite, as the plain expressions do, whatever the blocks (here of 3 queries)."""
    from cortado.exprgraph import attending

    monkeypatch.setattr(attending, "BLOCK_ELEMENTS", 3 * 10)
    q, k, v = _operands((), 10, 10, 2, 2)
    plain = _where_after_scaling(q, k, v, 0.5)
    feeds = _feeds(np.random.default_rng(0), q, k, v)
    feeds["v"][7, 0] = np.inf
    compiled = ct.compile([plain], inputs=[q, k, v], backend="numpy")(**feeds)[0]
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(ct.evaluate(plain, feeds)))
    assert np.isnan(compiled[:7, 0]).all() and np.isinf(compiled[7:, 0]).all()


def test_merging_the_heads_back_reads_the_attention_in_place_on_the_gpu_plan():
    """Where a transpose merges the heads back, cuDNN writes the output and the gradients time-major, so the
    transposes and their reshapes are views, not copies (the plan is made on the CPU: no GPU is asked)."""
    from cortado import compiler
    from cortado.backends.cupy import backend as engine
    from cortado.backends.cupy.layout import layouts, time_major_strides

    batch, time, heads, size = 2, 16, 4, 8
    x = ct.var("x", (batch, time, heads * size), "bfloat16")
    w = ct.var("w", (heads * size, 3 * heads * size), "bfloat16")
    q, k, v = ct.split(x @ w, 3, axis=-1)
    split = [ct.transpose(ct.reshape(t, (batch, time, heads, size)), (0, 2, 1, 3)) for t in (q, k, v)]
    mixed = ct.softmax(split[0] @ ct.transpose(split[1], (0, 1, 3, 2)) * 0.35, axis=-1) @ split[2]
    merged = ct.reshape(ct.transpose(mixed, (0, 2, 1, 3)), (batch, time, heads * size))
    loss = ct.sum(ct.cast(merged * merged, "float32"))
    roots = compiler._rewrite([loss, *ct.grad(loss, [x, w])], engine, {})
    kernels = compiler._kernels(roots, compiler._signature(roots, [x, w], None, None))
    strides, views = layouts(kernels, compiler._options(engine, {}))
    results = [t for kernel in kernels if kernel.term.op.name.startswith("dnn_attention") for t in kernel.terms
               if t.shape[-1] == size]
    assert len(results) == 4  # the output, dq, dk, dv
    assert all(strides[t] == time_major_strides(t.shape) for t in results)
    merges = [kernel.term for kernel in kernels if kernel.term.op.name == "reshape" and kernel.term.args[0].op.name
              == "transpose" and kernel.term.args[0].args[0] in results]
    assert merges and all(t in views for t in merges)


def test_the_gradients_of_q_k_and_v_are_written_into_their_columns_of_the_projections_gradient():
    """Where each third of a projection's gradient (the split's gradient, a concatenation) lies 256 bytes apart,
    cuDNN writes dq, dk and dv straight into their columns: the concatenation writes nothing, and the forward's
    q, k and v are views of the projection (the plan is made on the CPU: no GPU is asked)."""
    from cortado import compiler
    from cortado.backends.cupy import backend as engine
    from cortado.backends.cupy.layout import concatenated_in_place, layouts

    batch, time, heads, size = 2, 16, 2, 64
    x = ct.var("x", (batch, time, heads * size), "bfloat16")
    w = ct.var("w", (heads * size, 3 * heads * size), "bfloat16")
    q, k, v = (ct.transpose(ct.reshape(t, (batch, time, heads, size)), (0, 2, 1, 3)) for t in ct.split(x @ w, 3, -1))
    mixed = ct.softmax(q @ ct.transpose(k, (0, 1, 3, 2)) * 0.125, axis=-1) @ v
    loss = ct.sum(ct.cast(mixed * mixed, "float32"))
    roots = compiler._rewrite([loss, *ct.grad(loss, [x, w])], engine, {})
    kernels = compiler._kernels(roots, compiler._signature(roots, [x, w], None, None))
    parts, wholes = concatenated_in_place(kernels)
    (whole,) = wholes
    assert whole.shape == (batch, time, 3 * heads * size) and whole.op.name == "fused"
    assert sorted(offset for _, offset in parts.values()) == [0, heads * size, 2 * heads * size]
    strides, views = layouts(kernels, compiler._options(engine, {}))
    assert all(strides[d] == (time * 3 * heads * size, size, 3 * heads * size, 1) for d in parts)
    crops = [kernel.term for kernel in kernels if kernel.term.op.name == "fused" and kernel.term.shape == x.shape
             and kernel.term.attr("outputs")[0].op.name == "pad"]
    assert len(crops) == 3 and sorted(views[t] for t in crops) == [0, heads * size, 2 * heads * size]
