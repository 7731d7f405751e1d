"""Scalar kernels joining the reduction whose result they read (``rules.scalar_epilogues``): which join, that the
merged kernel makes no cycle, and that every value is as before."""

import numpy as np
from hypothesis import given

import cortado as ct
from cortado import compiler
from cortado.backends.cupy import backend as gpu_backend
from cortado.exprgraph.graph import post_order
from cortado.rules.engine import Trace
from cortado.rules.fusion import ELEMENTWISE_KERNEL, REDUCTION_KERNEL, KernelShapes, fuse
from cortado.rules.scalar_epilogues import into_reductions
from cortado.testing import graphs_with_feeds
from float8_plans import assert_same_bits, float8_mlp_step


def _kernels_of(roots, kind):
    return {(t.args, t.attr("outputs")) for t in post_order(roots) if t.op.name == "fused" and t.attr("kernel") == kind}


def _scalar_kernels(roots, kind):
    return [k for k in _kernels_of(roots, kind) if all(o.size == 1 for o in k[1])]


def test_a_scale_from_two_reductions_joins_the_later_one():
    """``1 / (sx * sw)``, each of ``sx`` and ``sw`` a reduction of a vector to one value: one kernel for all three,
    the two reductions folded in one pass (same op, shape and axes) and the product's scale computed after them."""
    hx, hw, x = ct.var("hx", (16,)), ct.var("hw", (16,)), ct.var("x", (8, 8))
    sx, sw = 1 / ct.max(hx), 1 / ct.max(hw)
    outputs = [x * sx, x * sw, 1 / (sx * sw)]
    fused, _ = fuse(outputs, None, KernelShapes(one_op=True))
    trace = Trace()
    merged = into_reductions(fused, trace)
    assert len(_scalar_kernels(fused, ELEMENTWISE_KERNEL)) == 1 and not _scalar_kernels(merged, ELEMENTWISE_KERNEL)
    assert len(_kernels_of(merged, REDUCTION_KERNEL)) == 1 and {r.rule for r in trace} == {"scalar-into-reduction"}
    feeds = {"hx": np.arange(16, dtype=np.float32) + 1, "hw": np.float32(3) * np.ones(16, np.float32),
             "x": np.ones((8, 8), np.float32)}
    for ours, theirs in zip(ct.evaluate(list(merged), feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours, theirs)


def test_a_scalar_kernel_reading_what_is_made_after_the_reduction_stays_its_own():
    """``m / s`` with ``m`` a reduction and ``s`` a product of a value made from ``m``: merging it into ``m``'s kernel
    would have that kernel read what is made from its own result, so it stays a kernel of its own."""
    h, a, b = ct.var("h", (16,)), ct.var("a", (1, 4)), ct.var("b", (4, 1))
    m = ct.max(h)
    s = ct.reshape((a * m) @ b, ())
    outputs = [m / s + 1]
    fused, _ = fuse(outputs, None, KernelShapes(one_op=True))
    merged = into_reductions(fused, Trace())
    assert len(_scalar_kernels(merged, ELEMENTWISE_KERNEL)) == len(_scalar_kernels(fused, ELEMENTWISE_KERNEL)) == 1


def test_a_pad_of_a_reduction_to_one_value_stays_its_own_kernel():
    """A ``pad`` reads its operand at other indices than it writes, so the kernel that pads a reduction to one value
    (a convolution's negative padding of it) cannot compute that value in the reduction's epilogue: it stays a kernel
    reading the reduction's result, and the GPU's code generator is given no pad of a computed value."""
    x = ct.var("x", (1, 1, 1), "float16")
    padded = ct.conv(ct.max(x, axis=()), x, padding=((1, -1),))
    trace = {}
    roots = compiler._rewrite([padded], gpu_backend, trace)
    pads = [t for t in post_order(roots) if t.op.name == "fused" for b in post_order(t.attr("outputs"))
            if b.op.name == "pad"]
    assert pads and all(b.args[0].op.name == "param" for t in pads for b in post_order(t.attr("outputs"))
                        if b.op.name == "pad")
    assert "scalar-into-reduction" not in {r.rule for r in trace["fusion"]}


def test_a_reduction_of_what_another_reduction_makes_is_not_folded_in_its_pass():
    """Two sums to one value alike (same op, shape and axes), the second summing what the first makes: one pass
    cannot fold both (the first's result is only known at the end of it), so the second stays a kernel of its own."""
    x = ct.var("x", ())
    first = ct.sum(x, axis=())
    outputs = [first, ct.sum(first * 2.0, axis=())]
    fused, _ = fuse(outputs, None, KernelShapes(one_op=True))
    merged = into_reductions(fused, Trace())
    for _, body in _kernels_of(merged, REDUCTION_KERNEL):
        reductions = [t for t in post_order(body) if t.op.kind == "reduction"]
        assert not any(r in post_order([s.args[0]]) for s in reductions for r in reductions if r is not s)
    for ours, theirs in zip(ct.evaluate(list(merged), {"x": np.float32(3)}), ct.evaluate(outputs, {"x": np.float32(3)})):
        np.testing.assert_array_equal(ours, theirs)


def test_a_float8_training_steps_product_scales_join_their_reductions_values_unchanged(monkeypatch):
    """The float8 MLP's step as the GPU plans it: each product's scale joins a reduction, and the loss and every
    update are the bits of the same program planned without merging."""
    outputs, values, x, y = float8_mlp_step((64, 128, 64), (4, 16))
    traces = {}
    roots = compiler._rewrite(outputs, gpu_backend, traces)
    monkeypatch.setattr(compiler, "into_reductions", lambda roots, trace: roots)
    plain = compiler._rewrite(outputs, gpu_backend, {})
    assert sum(r.rule == "scalar-into-reduction" for r in traces["fusion"]) >= 6  # 1 / (sx sw), sx / sg, sw / sg
    assert_same_bits(roots, plain, values, x, y)


@given(graphs_with_feeds(ops=["add", "multiply", "divide", "exp", "sum", "mean", "max", "where", "greater", "matmul"],
                         max_steps=12))
def test_merging_scalar_kernels_into_reductions_never_changes_a_value(case):
    graph, feeds = case
    fused, _ = fuse(graph.outputs, shapes=KernelShapes(one_op=True))
    merged = into_reductions(fused, Trace())
    for got, expected in zip(ct.evaluate(list(merged), feeds), ct.evaluate(graph.outputs, feeds)):
        np.testing.assert_array_equal(got, expected)
