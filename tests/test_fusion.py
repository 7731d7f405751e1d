"""Fusion: which regions become one fused term, and that fusing never changes a value."""

import re

import numpy as np
import pytest
from hypothesis import given

import cortado as ct
from cortado.rules.fusion import ROW_KERNEL, KernelShapes, fuse
from cortado.rules.stability import stabiliser
from cortado.testing import graphs_with_feeds


def _fused_terms(roots):
    return [t for t in ct.schedule(list(roots)) if t.op.name == "fused"]


def _regions(roots):
    return {(t.args, t.attrs.outputs) for t in _fused_terms(roots)}


def test_an_elementwise_chain_becomes_one_fused_term():
    x, y = ct.var("x", (8, 4)), ct.var("y", (8, 4))
    out = ct.tanh(0.5 * x + y) * ct.sigmoid(x) + y * y
    (fused,), trace = fuse([out])
    assert fused.op.name == "fused" and set(fused.args) == {x, y}
    assert trace.counts() == {"fuse-elementwise": 1}
    assert len(ct.schedule(fused)) == 3  # x, y and the one fused term


def test_scalar_constants_are_inlined_and_other_operands_become_parameters():
    x, b = ct.var("x", (8, 4)), ct.var("b", (4,))
    table = ct.const(np.arange(4, dtype=np.float32))
    (fused,), _ = fuse([ct.exp(x * 2.0 + b) - table])
    body = fused.attrs[0][0]
    assert fused.args == (x, b, table)
    assert {t.attr("index") for t in ct.schedule(body) if t.op.name == "param"} == {0, 1, 2}


def test_a_reduction_fuses_with_its_prologue_and_epilogue():
    x, b = ct.var("x", (8, 4)), ct.var("b", (8,))
    out = ct.log(ct.sum(ct.exp(x), axis=1)) + b
    (fused,), trace = fuse([out])
    assert trace.counts() == {"fuse-reduction": 1}
    assert fused.args == (x, b)
    assert [t.op.name for t in ct.schedule(fused.attrs[0][0]) if t.args] == ["exp", "sum", "log", "add"]


def test_a_reduction_that_broadcasts_back_down_its_columns_stays_its_own_region():
    x = ct.var("x", (8, 4))
    out = ct.exp(x - ct.max(x, axis=0, keepdims=True))  # the max must be finished before any subtract
    (fused,), _ = fuse([out])
    assert fused.op.name == "fused"
    assert any(a.op.name == "max" for a in fused.args)


def test_reductions_of_rows_broadcast_back_over_them_make_one_row_kernel():
    """A softmax spelled out, a layer norm: each row reduced as often as needed, then the row computed."""
    x, g, b = ct.var("x", (8, 4)), ct.var("g", (4,)), ct.var("b", (4,))
    softmax = ct.exp(x - ct.max(x, axis=1, keepdims=True))
    softmax = softmax / ct.sum(softmax, axis=1, keepdims=True)
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    norm = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * g + b
    for out, reductions in ((softmax, ["max", "sum"]), (norm, ["mean", "mean"])):
        (fused,), trace = fuse([out])
        assert trace.counts() == {"fuse-rows": 1} and fused.args[0] is x
        assert [t.op.name for t in ct.schedule(fused.attrs[0][0]) if t.op.name in reductions] == reductions
        rng = np.random.default_rng(0)
        feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, g, b) if v in ct.schedule(out)}
        np.testing.assert_array_equal(ct.evaluate(fused, feeds), ct.evaluate(out, feeds))


def test_a_layer_norm_is_one_row_kernel_forward_and_one_for_its_inputs_gradient():
    """The forward pass writes the normalized rows and what the backward pass reads (per-row statistics among them);
    the input's gradient is one row kernel; the gain's and the bias's are column sums."""
    x, g, b, w = ct.var("x", (8, 4)), ct.var("g", (4,)), ct.var("b", (4,)), ct.var("w", (8, 4))
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    y = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * g + b
    gradients = ct.grad(ct.sum(y * w), [x, g, b])
    roots, _ = fuse(stabiliser.run([y, *gradients]))
    bodies = list(dict.fromkeys(t.attrs.outputs for t in _fused_terms(roots)))
    rows = [body for body in bodies if sum(s.op.name in ("mean", "sum") for s in ct.schedule(body)) == 2]
    assert len(rows) == 2 and roots[0].attrs[0] in rows and roots[1].attrs[0] in rows
    assert {o.shape for o in roots[0].attrs[0]} == {(8, 4), (8, 1)}


def test_values_used_later_become_extra_outputs_of_one_kernel():
    # Adam: the new moments are both outputs (updates) and read by the parameter's update
    W, g, m, v = (ct.var(n, (16, 8)) for n in "Wgmv")
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    W2 = W - 0.01 * m2 / (ct.sqrt(v2) + 1e-8)
    roots, _ = fuse([W2, m2, v2])
    assert len(_regions(roots)) == 1
    assert sorted(t.attrs[1] for t in roots) == [0, 1, 2]
    assert all(t.args == roots[0].args for t in roots)


def test_a_value_read_before_the_root_by_an_outside_term_is_not_fused_into_it():
    # e feeds the matmul, which feeds the root: fusing e into the root's region would make a cycle
    x, W = ct.var("x", (4, 4)), ct.var("W", (4, 4))
    e = ct.exp(x)
    root = (e @ W) * ct.tanh(e)
    roots, _ = fuse([root])
    assert e in roots[0].args
    assert "exp" not in {t.op.name for t in ct.schedule(roots[0].attrs[0])}
    np.testing.assert_array_equal(*ct.evaluate([roots[0], root], {"x": np.eye(4, dtype=np.float32),
                                                                  "W": np.ones((4, 4), np.float32)}))


def test_a_concatenation_is_one_kernel_reading_each_part_once():
    parts = [ct.var(name, (4, 3, size)) for name, size in (("a", 2), ("b", 5), ("c", 1))]
    (fused,), trace = fuse([ct.concatenate(parts, axis=-1) * 2.0])
    body = fused.attr("outputs")
    assert fused.args == tuple(parts) and trace.counts() == {"fuse-elementwise": 1}
    assert sum(t.op.name == "pad" for t in ct.schedule(list(body))) == 3
    feeds = {p.name: np.random.default_rng(i).standard_normal(p.shape).astype(np.float32) for i, p in enumerate(parts)}
    np.testing.assert_array_equal(ct.evaluate([fused], feeds)[0], 2.0 * np.concatenate(list(feeds.values()), axis=-1))


def test_the_gradient_of_a_split_joins_its_parts_in_one_kernel_with_no_pad_of_its_own():
    qkv = ct.var("qkv", (2, 5, 12))
    q, k, v = ct.split(qkv, 3, axis=-1)
    (gradient,) = ct.grad(ct.sum(ct.tanh(q) * k * v), [qkv])
    roots, _ = fuse([gradient])
    assert not [t for t in ct.schedule(list(roots)) if t.op.name == "pad"]  # each is read inside a kernel
    feeds = {"qkv": np.random.default_rng(0).standard_normal(qkv.shape).astype(np.float32)}
    np.testing.assert_array_equal(*ct.evaluate([roots[0], gradient], feeds))


def test_a_pad_is_no_member_of_a_reduction_and_its_operand_no_member_of_its_region():
    x, y = ct.var("x", (4, 3)), ct.var("y", (4, 5))
    padded = ct.pad(ct.exp(x), ((0, 0), (1, 1)), constant_values=1.5)
    total = ct.sum(padded * y, axis=1)
    shifted = ct.exp(x) + ct.pad(ct.exp(x), ((0, 0), (1, -1)))  # exp(x) is read at two indices: an operand
    roots, _ = fuse([total, shifted])
    pads = [t for t in ct.schedule(list(roots)) if t.op.name == "pad"]
    assert [p.shape for p in pads] == [(4, 5)]  # the reduction's stays a term of its own
    second = roots[1]
    assert second.op.name == "fused" and [a.op.name for a in second.args] == ["exp"]
    feeds = {"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "y": np.ones((4, 5), np.float32)}
    for ours, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate([total, shifted], feeds)):
        np.testing.assert_array_equal(ours, expected)


def test_a_region_of_one_term_is_left_alone():
    x, W = ct.var("x", (4, 4)), ct.var("W", (4, 4))
    roots, trace = fuse([ct.exp(x @ W)])
    assert roots[0].op.name == "exp" and not trace


@given(graphs_with_feeds())
def test_fusing_keeps_every_value_bit_for_bit(case):
    graph, feeds = case
    roots, _ = fuse(graph.outputs)
    for term, fused, expected in zip(graph.outputs, ct.evaluate(list(roots), feeds), ct.evaluate(graph.outputs, feeds)):
        assert roots[graph.outputs.index(term)].shape == term.shape
        np.testing.assert_array_equal(fused, expected)


@given(graphs_with_feeds(ops=["cast", "add", "multiply", "exp", "tanh", "sum", "max", "where", "greater"],
                         dtypes=("bfloat16", "float32"), max_steps=12))
def test_fusing_mixed_precision_graphs_for_the_gpu_keeps_every_value_bit_for_bit(case):
    """Half-precision values widened by casts and promotions: a wider form computed again in each region that reads
    it (``widened``) is the same value wherever it is computed."""
    graph, feeds = case
    roots, _ = fuse(graph.outputs, shapes=KernelShapes(one_op=True, sibling_columns=True))
    for fused, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate(graph.outputs, feeds)):
        np.testing.assert_array_equal(fused, expected)


@given(graphs_with_feeds(ops=["add", "multiply", "exp", "tanh", "sum", "mean", "max", "broadcast_to", "where",
                              "greater", "matmul", "logsumexp"]))
def test_no_elementwise_term_survives_next_to_a_fusible_user(case):
    """Maximality: an elementwise term left outside every region has a reason to be."""
    graph, _ = case
    roots, _ = fuse(graph.outputs)
    order = ct.schedule(list(roots))
    users = ct.exprgraph.users(order)
    for t in order:
        if t.op.kind == "elementwise" and len(users[t]) == 1 and t not in roots:
            (user, _), = users[t]
            assert user.op.kind not in ("elementwise", "fused")


def test_alone_every_elementwise_op_and_reduction_becomes_a_kernel_body_of_its_own():
    x, W = ct.var("x", (8, 4)), ct.var("W", (4, 3))
    h = ct.matmul(x, W)  # no fused region takes a matmul: its users are regions of one op each
    out = ct.sum(ct.exp(h), axis=0)
    roots, trace = fuse([out, ct.transpose(h)], shapes=KernelShapes(one_op=True))
    assert trace.counts() == {"fuse-reduction": 1}
    (alone,), trace = fuse([ct.negative(h)], shapes=KernelShapes(one_op=True))
    assert alone.op.name == "fused" and alone.args == (h,) and trace.counts() == {"one-op-kernel": 1}
    assert fuse([ct.negative(h)])[0] == (ct.negative(h),)  # without alone it stays as it was
    assert fuse([ct.transpose(h)], shapes=KernelShapes(one_op=True))[0] == (ct.transpose(h),)  # a view is no kernel


@given(graphs_with_feeds())
def test_fusing_ops_alone_never_changes_a_value(case):
    graph, feeds = case
    fused, _ = fuse(list(graph.outputs), shapes=KernelShapes(one_op=True))
    assert not any(t.op.kind in ("elementwise", "reduction") for t in ct.schedule(list(fused)))
    for got, expected in zip(ct.evaluate(list(fused), feeds), ct.evaluate(list(graph.outputs), feeds)):
        np.testing.assert_array_equal(got, expected)


def test_a_value_each_fused_reader_computes_again_is_stored_for_a_reader_that_reads_it_as_an_operand():
    """``cast(x)`` is read by ``negative``'s region, which computes it again, and by a pad, whose region reads its
    operand at other indices: alone, the cast is a region of its own, not a bare elementwise op left between kernels."""
    x = ct.var("x0", (1,), "float32")
    wide = ct.cast(x, "float64")
    outputs = [ct.pad(wide, ((0, 0),), constant_values=0), ct.negative(x), ct.negative(wide)]
    fused, _ = fuse(outputs, shapes=KernelShapes(one_op=True))
    assert not any(t.op.kind in ("elementwise", "reduction") for t in ct.schedule(list(fused)))
    feeds = {"x0": np.array([0.5], np.float32)}
    for got, expected in zip(ct.evaluate(list(fused), feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(got, expected)


def test_a_row_kernel_takes_no_reduction_but_of_its_rows():
    """``exp(sum(y, -1) + x - mean(x, -1))``: the row kernel of x's rows takes the mean, and the sum over y's last
    axis is a kernel of its own (a row kernel's body holding a reduction of other rows has no kernel form)."""
    from cortado import compiler
    from cortado.backends.cupy import backend as engine
    from cortado.backends.cupy.codegen import Operand, contiguous_strides
    from cortado.backends.cupy.sources import kernel_sources

    x, y = ct.var("x", (8, 5)), ct.var("y", (8, 5, 3))
    r = ct.exp(ct.sum(y, axis=-1) + x - ct.mean(x, axis=-1, keepdims=True))
    roots = compiler._rewrite([r], engine, {})
    kernels = compiler._kernels(roots, compiler._signature(roots, [x, y], None, None))
    fused = [k.term for k in kernels if k.term.op.name == "fused"]
    assert len(fused) == 2
    for t in fused:
        kernel_sources(t.attr("outputs"), [Operand(a.shape, a.dtype, contiguous_strides(a.shape)) for a in t.args])
    feeds = {"x": np.arange(40, dtype=np.float32).reshape(8, 5) / 9, "y": np.ones((8, 5, 3), np.float32)}
    np.testing.assert_allclose(ct.evaluate(roots, feeds)[0], ct.evaluate([r], feeds)[0], rtol=1e-6)
def _gpu_kernels(outputs, inputs):
    """The cupy backend's rewritten roots and kernels of ``outputs``, built on the CPU (no GPU is asked)."""
    from cortado import compiler
    from cortado.backends.cupy import backend as engine

    roots = compiler._rewrite(outputs, engine, {})
    return roots, compiler._kernels(roots, compiler._signature(roots, inputs, None, None))


def normed_residual(rows=64, n=768):
    """``x + layer_norm(x) @ W``, and the gradient of its sum weighted by ``dy``: the layer norm's gradient kernel
    reads three rows (the input, the product's gradient and the residual's), three vectors of each a lane."""
    x, dy = ct.var("x", (rows, n), "bfloat16"), ct.var("dy", (rows, n), "bfloat16")
    g, b, w = ct.var("g", (n,)), ct.var("b", (n,)), ct.var("w", (n, n), "bfloat16")
    xf = ct.cast(x, "float32")
    centered = xf - ct.mean(xf, axis=-1, keepdims=True)
    y = ct.cast(centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * g + b, "bfloat16")
    out = x + ct.matmul(y, w)
    (dx,) = ct.grad(ct.sum(ct.cast(out * dy, "float32")), [x])
    return [out, dx], [x, dy, g, b, w]


def test_a_row_kernel_keeps_in_registers_the_rows_its_reductions_read_where_all_would_not_fit():
    """The layer norm's gradient kernel of ``_normed_residual``: nine vectors a lane would spill, so it keeps the two
    rows its reductions read (and its last pass reads again), and reads the residual's gradient in its last pass."""
    from cortado.backends.cupy.codegen import Operand, contiguous_strides
    from cortado.backends.cupy.sources import kernel_sources

    outputs, inputs = normed_residual()
    _, kernels = _gpu_kernels(outputs, inputs)
    rows = [k.term for k in kernels if k.term.op.name == "fused" and k.term.attr("kernel") == ROW_KERNEL
            and sum(a.shape == (64, 768) for a in k.term.args) == 3]
    assert len(rows) == 1
    t = rows[0]
    (source,) = kernel_sources(t.attr("outputs"), [Operand(a.shape, a.dtype, contiguous_strides(a.shape))
                                                   for a in t.args], (), None, t.attr("kernel"))
    kept = {int(k) for k in re.findall(r"ct_vec<__nv_bfloat16, 8> row(\d+)\[3\];", source.text)}
    read = {k for k, a in enumerate(t.args) if a.shape == (64, 768)}
    assert len(kept) == 2 and kept < read
    (other,) = read - kept
    assert source.text.count(f"(in{other})[o * 96 + c]") == 1  # once, in the last pass


def adam_step(shape=(256, 64)):
    """An Adam step of float32 state with a bfloat16 gradient: one elementwise kernel of seven arrays."""
    p, m, v, g = ct.var("p", shape), ct.var("m", shape), ct.var("v", shape), ct.var("g", shape, "bfloat16")
    gf = ct.cast(g, "float32")
    m2, v2 = 0.9 * m + 0.1 * gf, 0.999 * v + 0.001 * gf * gf
    return [p - 1e-3 * m2 / (ct.sqrt(v2) + 1e-8), m2, v2], [p, m, v, g]


@pytest.mark.parametrize("case", ["adam", "bfloat16 sum"])
def test_an_elementwise_kernel_of_many_arrays_takes_16_bytes_of_its_widest_type_a_thread(case):
    """Eight elements a thread (16 bytes of bfloat16) would hold 208 bytes of Adam's seven arrays: a thread takes 4
    (16 bytes of float32); a sum of two bfloat16 arrays keeps 8."""
    from cortado.backends.cupy.codegen import Operand, contiguous_strides
    from cortado.backends.cupy.sources import kernel_sources

    if case == "adam":
        outputs, inputs = adam_step()
    else:
        x, y = ct.var("x", (256, 64), "bfloat16"), ct.var("y", (256, 64), "bfloat16")
        outputs, inputs = [ct.exp(x) + y], [x, y]
    _, kernels = _gpu_kernels(outputs, inputs)
    (t,) = [k.term for k in kernels if k.term.op.name == "fused"]
    (source,) = kernel_sources(t.attr("outputs"), [Operand(a.shape, a.dtype, contiguous_strides(a.shape))
                                                   for a in t.args], (), None, t.attr("kernel"))
    width = 4 if case == "adam" else 8
    assert f"ct_vec<__nv_bfloat16, {width}>*>(in" in source.text
    assert ("ct_vec<float, 4>*>(in" in source.text) == (case == "adam")


def test_a_softmax_cross_entropy_is_one_row_kernel_forward_and_one_backward_on_the_gpu():
    """``logsumexp(logits) - take_along_axis(logits, labels)`` as the GPU plans it: each row's max, its sum of
    exponentials and its label's logit are reductions of one row kernel, which also writes what the backward pass
    reads; the backward pass is one kernel; beside them, the mean. The labels' places (a negative label counted from
    the end) and the label mask (each row's label against every place) are computed again in each kernel that
    reads them, not stored. Every value as the plain expressions give it, labels counted from the end included."""
    from cortado.rules.fusion import row_shape

    rows, classes = 16, 37
    logits, labels = ct.var("logits", (rows, classes), "bfloat16"), ct.var("labels", (rows,), "int32")
    wide = ct.cast(logits, "float32")
    picked = ct.take_along_axis(wide, labels[:, None], axis=-1)[:, 0]
    loss = ct.mean(ct.logsumexp(wide, axis=-1) - picked)
    outputs = [loss, ct.grad(loss, [logits])[0]]
    roots, kernels = _gpu_kernels(outputs, [logits, labels])
    fused = [k.term for k in kernels if k.term.op.name == "fused"]
    rows_kernels = [t for t in fused if row_shape(t.attr("outputs")) == (rows, classes)]
    assert len(rows_kernels) == 1 and {s.op.name for s in _reductions(rows_kernels[0])} == {"max", "sum"}
    assert len(_reductions(rows_kernels[0])) == 3
    assert len(fused) == 3  # the row kernel, the mean, the backward pass
    stored = [t for k in kernels if k.term.op.name == "fused" for t in k.terms]
    assert not [t for t in stored if t.dtype in (bool, labels.dtype)]  # places and mask: computed where read
    assert not [k for k in kernels if k.term.op.name in ("take", "take_along_axis")]
    rng = np.random.default_rng(4)
    feeds = {"logits": (3 * rng.standard_normal((rows, classes))).astype("float32").astype(logits.dtype),
             "labels": rng.integers(-classes, classes, rows).astype(np.int32)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_allclose(np.asarray(ours, np.float64), np.asarray(theirs, np.float64), rtol=1e-6, atol=1e-7)


def test_a_small_value_of_leaves_is_computed_in_each_wider_kernel_that_reads_it():
    """A layer norm's float32 gain cast to bfloat16 is read by its forward and its backward kernels: each casts it
    itself (no kernel of its own, whose launch costs more than the cast), and the values are the plain expressions'."""
    x = ct.var("x", (16, 64), "bfloat16")
    g, b = ct.var("g", (64,), "float32"), ct.var("b", (64,), "float32")
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    y = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * ct.cast(g, "bfloat16") \
        + ct.cast(b, "bfloat16")
    w = ct.var("w", (64, 32), "bfloat16")
    outputs = ct.grad(ct.sum(ct.cast((y @ w) ** 2, "float32")), [x])  # a gemm between the forward and the backward
    roots, kernels = _gpu_kernels(outputs, [x, g, b, w])
    rows = [k.term for k in kernels if k.term.op.name == "fused" and k.term.shape == x.shape]
    assert len(rows) == 2 and all(g in t.args for t in rows)  # each reads the gain itself
    assert not [k for k in kernels if k.term.op.name == "fused" and k.term.shape == g.shape]
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((16, 64)).astype(x.dtype), "g": rng.standard_normal(64).astype(np.float32),
             "b": rng.standard_normal(64).astype(np.float32), "w": rng.standard_normal((64, 32)).astype(w.dtype)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(np.asarray(ours, np.float64), np.asarray(theirs, np.float64))


def test_a_layer_norms_gain_and_bias_gradients_are_one_column_kernel_on_the_gpu():
    """The gain's and the bias's gradients both sum the output's gradient over the rows: the GPU's fusion makes them
    one kernel (each with its update as epilogue), which reads that gradient once. The values are the plain
    expressions'."""
    x, dy = ct.var("x", (64, 48), "float32"), ct.var("dy", (64, 48), "float32")
    g, b = ct.var("g", (48,), "float32"), ct.var("b", (48,), "float32")
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    y = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * g + b
    dx, dg, db = ct.grad(ct.sum(y * dy), [x, g, b])
    outputs = [dx, g - 0.1 * dg, b - 0.1 * db]
    roots, kernels = _gpu_kernels(outputs, [x, dy, g, b])
    columns = [k.term for k in kernels if k.term.op.name == "fused" and k.term.shape == g.shape]
    assert len({t.args for t in columns}) == 1 and len(columns[0].attr("outputs")) == 2
    assert len(_reductions(columns[0])) == 2 and dy in columns[0].args
    rng = np.random.default_rng(5)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in (x, dy, g, b)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_column_sums_merge_only_where_neither_reads_the_other_and_they_share_a_value():
    """``sum(x * sum(x, 0), 0)`` reads the first sum: two kernels. Sums over the same rows of values that share
    nothing stay apart too (a merged kernel would read no less)."""
    x, z = ct.var("x", (64, 48)), ct.var("z", (64, 48))
    first = ct.sum(x, axis=0)
    dependent = [first, ct.sum(x * first, axis=0)]
    _, kernels = _gpu_kernels(dependent, [x])
    assert len([k for k in kernels if k.term.op.name == "fused"]) == 2
    _, kernels = _gpu_kernels([ct.sum(x, axis=0), ct.sum(ct.exp(z), axis=0)], [x, z])
    assert len([k for k in kernels if k.term.op.name == "fused"]) == 2
    _, kernels = _gpu_kernels([ct.sum(x, axis=0), ct.sum(ct.exp(x), axis=0)], [x])
    (merged,) = {k.term.attr("outputs") for k in kernels if k.term.op.name == "fused"}
    assert len(merged) == 2


@pytest.mark.parametrize("dtype, classes, gathers", [("int8", 300, 1), ("uint64", 37, 0), ("uint32", 37, 0)])
def test_labels_the_wrap_cannot_spell_stay_a_gather(dtype, classes, gathers):
    """An int8 label cannot hold the 300 places of its row: it keeps the gather instead of a reduction of the row.
    Unsigned labels, a uint64 past 2**63 too, are compared as unsigned, by the reduction as by the gather."""
    logits, labels = ct.var("logits", (16, classes), "float32"), ct.var("labels", (16,), dtype)
    picked = ct.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    _, kernels = _gpu_kernels([ct.logsumexp(logits, axis=-1) - picked], [logits, labels])
    assert len([k for k in kernels if k.term.op.name == "take_along_axis"]) == gathers


def test_the_gpus_gather_compares_an_unsigned_index_as_unsigned():
    """A uint64 index past 2**63 is past the end, clamped to the last place, not read as negative and counted from
    the end; a signed one counts from the end where negative."""
    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.index_kernels import take_source

    table = Operand((37, 4), np.dtype(np.float32), (4, 1))
    texts = {dtype: take_source(table, Operand((8,), np.dtype(dtype), (1,)), Operand((8, 4), np.dtype(np.float32),
                                                                                       (4, 1)), 0).text
             for dtype in ("uint64", "int64")}
    assert "unsigned long long u = (unsigned long long)(in1[" in texts["uint64"] and "p + 37" not in texts["uint64"]
    assert "u > 36ull ? 36 : (long long)u" in texts["uint64"]
    assert "p = p < 0 ? p + 37 : p;" in texts["int64"]


def test_the_gpus_places_of_indices_are_those_its_gathers_read():
    """``taken_places`` on the GPU is elementwise: a negative index counts from the end and one still out of range is
    clamped into the axis, as the GPU's gather kernels read (``index_kernels``), where the CPU's take raises."""
    from cortado.rules.decompositions import wrapped_places

    size = 7
    indices = np.arange(-3 * size, 3 * size, dtype=np.int32)
    (ours,) = ct.evaluate([wrapped_places(ct.var("i", indices.shape, "int32"), size)], {"i": indices})
    np.testing.assert_array_equal(ours, np.clip(np.where(indices < 0, indices + size, indices), 0, size - 1))


def _reductions(t):
    from cortado.exprgraph.graph import post_order

    return [s for s in post_order(t.attr("outputs")) if s.op.name in ("sum", "mean", "max")]


def test_a_value_spread_from_narrower_ones_is_computed_in_each_kernel_that_reads_it():
    """``equal(labels, places)`` compares each row's label with every place: two regions reading it each compute it
    rather than one storing it for the other."""
    labels = ct.var("labels", (8, 1), "int32")
    x, y = ct.var("x", (8, 5)), ct.var("y", (8, 5))
    mask = ct.equal(labels, ct.const(np.arange(5, dtype=np.int32)))
    first, second = ct.where(mask, ct.exp(x), 0.0), ct.where(mask, ct.tanh(y), 1.0)
    fused = _fused_terms(fuse([first, second])[0])
    assert len(fused) == 2 and all(t.op.name != "equal" for t in fuse([first, second])[0])
    assert all("equal" in {s.op.name for s in _body_terms(t)} for t in fused)


def _body_terms(t):
    from cortado.exprgraph.graph import post_order

    return post_order(t.attr("outputs"))


def test_what_a_spread_term_reads_is_stored_once_for_every_region_computing_it():
    """``rstd * g`` spreads a value a row and a value a column over the rows: each region reading it computes it,
    so ``rstd`` (and what it is made of) is a region's output, not hidden inside the first region that took it.
    Every term the GPU runs is a fused kernel or a library call."""
    x, g, b = ct.var("x", (8, 16)), ct.var("g", (16,)), ct.var("b", (16,))
    mean = ct.mean(x, axis=-1, keepdims=True)
    rstd = 1.0 / ct.sqrt(ct.mean((x - mean) ** 2, axis=-1, keepdims=True) + 1e-5)
    loss = ct.sum(ct.tanh((x - mean) * (rstd * g) + b))
    outputs = [loss, *ct.grad(loss, [x, g, b])]
    roots, kernels = _gpu_kernels(outputs, [x, g, b])
    assert {k.term.op.name for k in kernels} <= {"var", "const", "fused", "reshape", "transpose", "broadcast_to"}
    feeds = {v.name: np.random.default_rng(6).standard_normal(v.shape).astype(np.float32) for v in (x, g, b)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_row_kernel_takes_no_reduction_of_rows_of_another_width():
    """A value a row from two reductions of one width and one of another: the row kernel takes the first two, the
    third is a kernel of its own (every fused body has a kernel the GPU can generate)."""
    from cortado.backends.cupy.codegen import Operand, contiguous_strides
    from cortado.backends.cupy.sources import kernel_sources

    x, y = ct.var("x", (8, 5)), ct.var("y", (8, 7))
    r = ct.sum(ct.exp(y), axis=-1, keepdims=True) + (ct.mean(x, axis=-1, keepdims=True) + ct.max(x, axis=-1, keepdims=True))
    roots, kernels = _gpu_kernels([r], [x, y])
    for k in kernels:
        if k.term.op.name == "fused":
            kernel_sources(k.term.attr("outputs"), [Operand(a.shape, a.dtype, contiguous_strides(a.shape)) for a in k.term.args])
    feeds = {"x": np.arange(40, dtype=np.float32).reshape(8, 5) / 7, "y": np.ones((8, 7), np.float32)}
    np.testing.assert_allclose(ct.evaluate(roots, feeds)[0], ct.evaluate([r], feeds)[0], rtol=1e-6)


def test_a_lone_pick_of_one_place_a_row_stays_a_gather_on_the_gpu():
    """Where nothing else reads the rows, picking each row's label reads one element a row, not the whole row."""
    x, labels = ct.var("x", (16, 300)), ct.var("labels", (16, 1), "int32")
    _, kernels = _gpu_kernels([ct.take_along_axis(ct.exp(x), labels, axis=-1)], [x, labels])
    assert "take_along_axis" in [k.term.op.name for k in kernels]


def test_fusion_makes_only_the_kernels_a_backend_declares_and_each_says_which_it_is():
    """A layer norm's forward pass is one row kernel where the backend takes row kernels, and reductions and
    elementwise kernels where it does not; each fused term carries the kernel it is, which the backends read."""
    from cortado.rules.fusion import REDUCTION_KERNEL, kernel_shape

    x = ct.var("x", (8, 16))
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    normed = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5)
    kernels = {}
    for rows in (True, False):
        (root,), _ = fuse([normed], shapes=KernelShapes(rows=rows))
        fused = _fused_terms([root])
        assert all(t.attr("kernel") == kernel_shape(t.attr("outputs")) for t in fused)
        kernels[rows] = sorted(t.attr("kernel") for t in fused)
    assert kernels[True] == [ROW_KERNEL]
    assert ROW_KERNEL not in kernels[False] and REDUCTION_KERNEL in kernels[False]
    (alone,), _ = fuse([ct.exp(x)])
    assert alone is ct.exp(x)  # a region of one op stays as it was unless the backend takes one-op kernels


def _stored(kernels):
    """Each value a fused kernel writes, as (shape, dtype name)."""
    return [(t.shape, t.dtype.name) for k in kernels if k.term.op.name == "fused" for t in k.terms]


def test_a_narrow_values_wider_forms_are_computed_in_each_kernel_that_reads_them_never_stored():
    """A bfloat16 activation's float32 form times a scale, read by its cast to float8 and by the maximum of its
    magnitudes: each of the two kernels reads the bfloat16 value and widens it itself, rather than one writing the
    float32 form (twice the bytes) for the other to read back. Values as the plain expressions give them."""
    x, s = ct.var("x", (16, 64), "bfloat16"), ct.var("s", ())
    wide = ct.cast(ct.tanh(x), "float32") * s
    x8, amax = ct.cast(wide, "float8_e4m3fn"), ct.max(ct.abs(wide), axis=1)
    roots, kernels = _gpu_kernels([x8, amax], [x, s])
    assert ((16, 64), "float32") not in _stored(kernels)
    assert ((16, 64), "bfloat16") in _stored(kernels)  # tanh(x): as narrow as x, stored once for both
    feeds = {"x": np.linspace(-3, 3, 16 * 64).reshape(16, 64).astype(x.dtype), "s": np.float32(8)}
    for ours, theirs in zip(ct.evaluate(roots, feeds), ct.evaluate([x8, amax], feeds)):
        np.testing.assert_array_equal(ours.astype(np.float32), theirs.astype(np.float32))


def test_gelus_float32_intermediates_are_computed_again_from_its_bfloat16_argument_in_the_backward_pass():
    """gelu of a bfloat16 value computes in float32; its backward pass reads the same sigmoid and polynomial. Each
    is a float32 value of the activation's shape computed from the bfloat16 argument alone, so the backward kernel
    computes them again from the argument (and gelu's comparison of it with 0) instead of the forward kernel storing
    six float32 intermediates and a mask for it. What is stored is bfloat16: ``x * y``, gelu, its scaled form, the
    maximum's gradient and the gradient."""
    x, y, w = ct.var("x", (32, 64), "bfloat16"), ct.var("y", (32, 64), "bfloat16"), ct.var("w", (64, 64), "bfloat16")
    h = ct.gelu(x * y)  # no GEMM's epilogue: h is also read by a maximum
    loss = ct.sum(ct.cast((h * 0.5) @ w, "float32")) + ct.max(ct.cast(h, "float32"))
    _, kernels = _gpu_kernels([loss, *ct.grad(loss, [x])], [x, y, w])
    assert [typ for typ in _stored(kernels) if typ[0] == (32, 64)] == [((32, 64), "bfloat16")] * 5


def test_a_half_precision_value_a_kernel_computed_is_rounded_to_its_dtype_before_it_is_judged():
    """A GPU kernel keeps float16 and bfloat16 values in float; a comparison or a conversion (to an integer or a wider
    float) of one it computed takes the value rounded to its dtype, as the program says it (a float16
    ``expm1(x) <= x`` at 6.1e-5, float16's smallest normal, is True; in float32 it is False); a loaded value needs no
    rounding."""
    from cortado.backends.cupy.codegen import Operand, contiguous_strides
    from cortado.backends.cupy.sources import kernel_sources

    x, y = ct.var("x", (64,), "float16"), ct.var("y", (64,), "bfloat16")
    outputs = [ct.less_equal(ct.expm1(x), x), ct.cast(ct.exp(y), "int32"), ct.greater(y, ct.cast(x, "bfloat16")),
               ct.cast(ct.tanh(x), "float32")]
    _, kernels = _gpu_kernels(outputs, [x, y])
    texts = [kernel_sources(k.term.attr("outputs"), [Operand(a.shape, a.dtype, contiguous_strides(a.shape))
                                                     for a in k.term.args])[0].text
             for k in kernels if k.term.op.name == "fused"]
    text = "\n".join(texts)
    assert text.count("ct_load(__float2half_rn(") == 2  # expm1(x) and tanh(x), not the loaded x
    assert text.count("ct_load(__float2bfloat16_rn(") == 2  # exp(y); the cast of x, rounded as it is made
