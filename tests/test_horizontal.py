"""Kernels side by side (rules.horizontal): small kernels at either end of the step (elementwise, or of one-value
results from whole reductions) become one kernel each; values are unchanged, nothing else is grouped, and a part
writes in place only what no other part reads."""

import numpy as np
import pytest
from hypothesis import given

import cortado as ct
from cortado import nn, optim
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.backends.cupy.horizontal_kernels import horizontal_source
from cortado.compiler import Kernel
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.rules import horizontal
from cortado.rules.engine import Trace
from cortado.rules.fusion import KernelShapes, fuse
from cortado.rules.horizontal import Horizontal, side_by_side
from cortado.testing import graphs_with_feeds
from reference_checks import host, skip_without_device

GPU = KernelShapes(one_op=True, sibling_columns=True, horizontal=True)


def _grouped(roots):
    fused, _ = fuse(roots, shapes=GPU)
    trace = Trace()
    return side_by_side(fused, trace), trace


def _side_by_side_kernels(roots):
    return {(t.args, t.attr("outputs")) for t in ct.schedule(list(roots))
            if t.op.name == "fused" and isinstance(t.attr("kernel"), Horizontal)}


def _adam_step():
    """A two-layer MLP's AdamW step: two weight matrices, two biases, a LayerNorm's gain and bias."""
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    x, y = ct.var("x", (4, 6)), ct.var("y", (4, 3))
    out = model(x)
    loss = ct.mean((out - y) * (out - y))
    params = {name: p.var for name, p in model.named_parameters()}
    state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, list(params.values())))
    values = {**model.initial_values(seed=0), **{v: np.asarray(value) for v, value in state.items()}}
    return loss, x, y, params, values, updates


def test_an_optimizers_small_updates_become_one_kernel_and_its_large_ones_stay():
    shapes = {"bias": (768,), "gain": (3,), "small": (16, 8), "large": (300, 300)}
    params = {name: ct.var(name, shape) for name, shape in shapes.items()}
    gradients = [ct.var(f"g_{name}", shape) for name, shape in shapes.items()]
    _, updates = optim.AdamW(lr=1e-2).updates(params, gradients)
    roots, trace = _grouped(list(updates.values()))
    ((_, body),) = _side_by_side_kernels(roots)
    assert sorted(o.shape for o in body) == sorted([(768,), (3,), (16, 8)] * 3)  # each parameter, its two moments
    assert trace.counts() == {"fuse-side-by-side": 9}


def test_large_weight_casts_read_twice_become_one_kernel_and_those_read_once_stay():
    """A training step reads a weight's bfloat16 cast in the forward pass and again in the backward pass (but the
    first layer's: no gradient flows to the input), so those casts, each from a state leaf, run as one grid at the
    start; a forward pass alone reads each cast once, and there the casts stay where their readers are."""
    x = ct.var("x", (4, 300), "bfloat16")
    weights = [ct.var(f"w{k}", (300, 300)) for k in range(3)]  # float32: each cast larger than MOST_ELEMENTS
    h = x
    for w in weights:
        h = ct.tanh(h @ ct.cast(w, "bfloat16"))
    loss = ct.sum(ct.cast(h, "float32"))
    updates = [w - 0.1 * ct.cast(g, "float32") for w, g in zip(weights, ct.grad(loss, weights))]
    for roots, grouped in (([loss, *updates], [weights[1], weights[2]]), ([h], [])):
        casts = [o for _, body in _side_by_side_kernels(_grouped(roots)[0]) for o in body if o.op.name == "cast"]
        assert len(casts) == len(grouped) and all(o.shape == (300, 300) for o in casts), casts


def test_side_by_side_the_step_computes_the_same_bits():
    loss, x, y, _, values, updates = _adam_step()
    roots = [loss, *updates.values()]
    grouped, _ = _grouped(roots)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32), "y": rng.standard_normal((4, 3)).astype(np.float32),
             **{v.name: value for v, value in values.items()}}
    for ours, expected in zip(ct.evaluate(list(grouped), feeds), ct.evaluate(roots, feeds)):
        np.testing.assert_array_equal(ours, expected)


def test_a_kernel_whose_result_another_reads_or_that_is_large_stays_alone():
    v, w, big = ct.var("v", (8,)), ct.var("w", (8,)), ct.var("big", (300, 300))
    read_later = ct.exp(v)
    roots, _ = _grouped([read_later, ct.sum(read_later * 2.0), ct.tanh(w), big * 2.0])
    assert not _side_by_side_kernels(roots)
    roots, _ = _grouped([ct.exp(v), ct.tanh(w), big * 2.0])
    ((_, body),) = _side_by_side_kernels(roots)
    assert [o.shape for o in body] == [(8,), (8,)]


def test_groups_keep_within_the_pointers_a_kernel_may_take(monkeypatch):
    monkeypatch.setattr(horizontal, "MOST_POINTERS", 5)
    vs = [ct.var(f"v{i}", (4,)) for i in range(6)]
    roots, _ = _grouped([ct.exp(v) for v in vs])
    kernels = _side_by_side_kernels(roots)
    assert sorted(len(body) for _, body in kernels) == [2, 2, 2]  # (two operands, two results) a group


@given(graphs_with_feeds())
def test_grouping_never_changes_a_value(case):
    graph, feeds = case
    roots, _ = _grouped(list(graph.outputs))
    for ours, expected in zip(ct.evaluate(list(roots), feeds), ct.evaluate(list(graph.outputs), feeds)):
        np.testing.assert_array_equal(ours, expected)


def test_a_part_writes_in_place_only_an_operand_no_other_part_reads():
    from cortado.backends.cupy.layout import _inplace

    s, v = ct.var("s", ()), ct.var("v", (8,))
    roots, _ = _grouped([s + 1.0, v * s])
    results = tuple(sorted(roots, key=lambda t: t.attr("index")))
    strides = {t: contiguous_strides(t.shape) for t in (s, v, *results)}
    pairs = _inplace(Kernel(results, tuple(dict.fromkeys(results[0].args))), strides, {})
    assert pairs == ((results[1], v),)  # the scalar is read by both parts: no part writes over it


def test_each_part_has_blocks_of_its_own():
    a, b = ct.var("a", (1000,)), ct.var("b", (3, 5), "bfloat16")
    roots, _ = _grouped([ct.exp(a), b * 2.0])
    t = roots[0]
    operands = [Operand(x.shape, x.dtype, contiguous_strides(x.shape)) for x in t.args]
    source = horizontal_source(t.attr("outputs"), operands, (), t.attr("kernel").spans())
    assert source.blocks == 2  # 250 vectors of four floats, then 15 bfloat16 values
    assert "if (blockIdx.x < 1u) ct_part0(in0, out0, 0u);" in source.text
    assert "else if (blockIdx.x < 2u) ct_part1(in1, out1, 1u);" in source.text
    assert "(blockIdx.x - first)" in source.text


def test_equal_parts_are_one_device_function():
    """The same update of two same-sized biases is compiled once and called twice, with each one's pointers."""
    a, b, c = ct.var("a", (768,)), ct.var("b", (768,)), ct.var("c", (5,))
    roots, _ = _grouped([a * 0.9 + 1.0, b * 0.9 + 1.0, c * 0.9 + 1.0])
    t = roots[0]
    operands = [Operand(x.shape, x.dtype, contiguous_strides(x.shape)) for x in t.args]
    source = horizontal_source(t.attr("outputs"), operands, (), t.attr("kernel").spans())
    assert source.text.count("__noinline__") == 2
    assert "ct_part0(in0, out0, 0u);" in source.text and "ct_part0(in1, out1, 1u);" in source.text
    assert "ct_part1(in2, out2, 2u);" in source.text


@pytest.mark.gpu
def test_on_the_gpu_an_adamw_step_with_its_updates_side_by_side_equals_the_reference():
    skip_without_device("cupy")
    loss, x, y, _, values, updates = _adam_step()
    rng = np.random.default_rng(1)
    state = {v: value for v, value in values.items()}
    steps = {backend: ct.compile([loss], inputs=[x, y], state=state, updates=updates, backend=backend)
             for backend in ("numpy", "cupy")}
    assert "fuse-side-by-side" in steps["cupy"].explain()
    for _ in range(3):
        feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32), "y": rng.standard_normal((4, 3)).astype(np.float32)}
        for step in steps.values():
            step(**feeds)
    for v in updates:
        np.testing.assert_allclose(host(steps["cupy"].state[v.name]), steps["numpy"].state[v.name], rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("kept", [False, True])
def test_on_the_gpu_a_steps_weight_casts_side_by_side_equal_the_reference(kept, monkeypatch):
    """The weights' casts run as one kernel, and each step's loss (which reads them) is the CPU's, step after step
    (the bfloat16 products round apart, so within bfloat16's rounding); or, as the GPU keeps them by default, the
    casts are state that the updates write (``rules.kept_casts``), with the same losses."""
    skip_without_device("cupy")
    from cortado.backends.cupy import CupyBackend

    monkeypatch.setattr(CupyBackend, "keeps_casts", kept)
    x = ct.var("x", (16, 300), "bfloat16")
    weights = [ct.var(f"w{k}", (300, 300)) for k in range(3)]
    h = x
    for w in weights:
        h = ct.tanh(h @ ct.cast(w, "bfloat16"))
    loss = ct.mean(ct.cast(h, "float32"))
    updates = {w: w - 0.01 * ct.cast(g, "float32") for w, g in zip(weights, ct.grad(loss, weights))}
    rng = np.random.default_rng(2)
    state = {w: (rng.standard_normal(w.shape) / 17).astype(np.float32) for w in weights}
    steps = {backend: ct.compile([loss], inputs=[x], state=state, updates=updates, backend=backend)
             for backend in ("numpy", "cupy")}
    sides = [k for k in steps["cupy"].kernels if k.term.op.name == "fused" and isinstance(k.term.attr("kernel"), Horizontal)]
    casts_side_by_side = any(sum(o.shape == (300, 300) for o in k.term.attr("outputs")) == 2 for k in sides)
    assert casts_side_by_side is not kept, steps["cupy"].explain()
    assert steps["cupy"].traces.get("state", Trace()).counts()["keep-cast-as-state"] == (3 if kept else 0)
    for _ in range(3):
        feed = {"x": rng.standard_normal((16, 300)).astype(BFLOAT16)}
        ours, expected = (float(host(step(**feed)[0])) for step in (steps["cupy"], steps["numpy"]))
        assert abs(ours - expected) <= 2e-2 * max(abs(expected), 1e-2), (ours, expected)


def test_small_kernels_of_the_programs_leaves_become_one_kernel_before_their_readers():
    """The casts of a weight and of two vectors, which read only the program's leaves, become one kernel; the sums
    of one value the program returns read the casts, which other kernels read too, so they stay alone."""
    w, b, c, x = ct.var("w", (64, 32)), ct.var("b", (64,)), ct.var("c", (64,)), ct.var("x", (8, 32), "bfloat16")
    h = ct.matmul(x, ct.transpose(ct.cast(w, "bfloat16")))
    out = ct.sum(ct.cast(h * ct.cast(b, "bfloat16") + ct.cast(c, "bfloat16"), "float32"))
    casts = [ct.cast(b, "bfloat16"), ct.cast(c, "bfloat16")]
    roots, _ = _grouped([out, *(ct.sum(ct.cast(t, "float32")) for t in casts)])
    bodies = [body for _, body in _side_by_side_kernels(roots)]
    assert [sorted(o.shape for o in body) for body in bodies] == [[(64,), (64,), (64, 32)]]
    feeds = {"w": np.ones((64, 32), np.float32), "b": np.arange(64, dtype=np.float32),
             "c": np.full(64, 0.5, np.float32), "x": np.ones((8, 32), BFLOAT16)}
    for ours, expected in zip(ct.evaluate(list(roots), feeds),
                              ct.evaluate([out, *(ct.sum(ct.cast(t, "float32")) for t in casts)], feeds)):
        np.testing.assert_array_equal(ours, expected)


def test_grouping_both_ends_keeps_one_copy_of_everything_between():
    w, v, x = ct.var("w", (16, 8)), ct.var("v", (16, 8)), ct.var("x", (4, 8), "bfloat16")
    c, d = ct.var("c", (3,)), ct.var("d", (5,))
    h = ct.matmul(x, ct.transpose(ct.cast(w, "bfloat16"))) * ct.matmul(x, ct.transpose(ct.cast(v, "bfloat16")))
    total = ct.sum(ct.cast(h, "float32"))
    roots = [total, c - 0.1 * total, d * 2.0]  # the final kernels read what the initial ones feed
    grouped, _ = _grouped(roots)
    assert len(_side_by_side_kernels(grouped)) == 2  # the casts of w and v; the kernels of c and d
    before, _ = fuse(roots, shapes=GPU)
    count = lambda rs: sum(t.op.name == "matmul" for t in ct.schedule(list(rs)))  # noqa: E731
    assert count(grouped) == count(before) == 2


def test_a_float8_steps_one_value_kernels_join_groups_at_either_end():
    """A float8 MLP step's one-value kernels join groups: the scales computed from the amax histories (state) at the
    step's start, the initial group; the amaxes the histories take in (a max of a tensor's row maxima each), which
    only the histories' updates read, one closing kernel. Only the gradients' scales, which the backward pass waits
    for, and those whose operands other kernels read too (the loss: the backward pass reads its squares' operand;
    an amax of a small tensor taken whole), stay alone; the step computes the bits of the plan without."""
    from cortado import compiler
    from cortado.backends.cupy import backend as gpu_backend
    from float8_plans import assert_same_bits, float8_mlp_step

    outputs, values, x, y = float8_mlp_step((64, 256, 64), (4, 64))  # the hidden rows' amax in two stages
    ours = compiler._rewrite(outputs, gpu_backend, {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(horizontal, "_one_value", lambda body: False)
        apart = compiler._rewrite(outputs, gpu_backend, {})

    def kernels(roots):
        return {(t.args, t.attr("outputs")): t for t in ct.schedule(list(roots)) if t.op.name == "fused"}

    def alone(roots):
        return [t for t in kernels(roots).values() if t.shape == () and t.attr("kernel") == "reduction"]

    assert len(alone(ours)) == 3 and len(alone(apart)) == 9  # a gradient's scale a layer, the loss; and 6 more
    closing = [sorted(o.op.name for o in t.attr("outputs")) for t in kernels(ours).values()
               if isinstance(t.attr("kernel"), Horizontal) and all(o.shape == () for o in t.attr("outputs"))]
    assert closing == [["max", "max", "max"]]  # of the hidden rows' maxima and both weights' (the first layer's
    # input is fed: its amax reads a leaf, and starts the step)
    assert_same_bits(ours, apart, values, x, y)


def test_with_delayed_gradient_scales_every_scale_joins_the_initial_group():
    """With its gradients' scales delayed too, a float8 layer's three scales are one kernel reading only its amax
    histories (``scalar_epilogues``: the values a joined kernel read from the reduction's results are dropped from
    the merged kernel's outputs, not left unread), which joins the initial group; the gradients' amaxes join the
    closing one. Only the loss stays alone; the step computes the bits of the plan without."""
    from cortado import compiler
    from cortado.backends.cupy import backend as gpu_backend
    from float8_plans import assert_same_bits, float8_mlp_step

    outputs, values, x, y = float8_mlp_step((64, 256, 64), (4, 64), gradient_scaling="delayed")
    ours = compiler._rewrite(outputs, gpu_backend, {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(horizontal, "_one_value", lambda body: False)
        apart = compiler._rewrite(outputs, gpu_backend, {})
    kernels = {(t.args, t.attr("outputs")): t for t in ct.schedule(list(ours)) if t.op.name == "fused"}
    alone = [t for t in kernels.values() if t.shape == () and t.attr("kernel") == "reduction"]
    assert [[o.op.name for o in t.attr("outputs")] for t in alone] == [["mean"]]
    closing = [sorted(o.op.name for o in t.attr("outputs")) for t in kernels.values()
               if isinstance(t.attr("kernel"), Horizontal) and all(o.shape == () for o in t.attr("outputs"))]
    assert closing == [["max"] * 5]  # the hidden rows', both weights' and both gradients'
    assert_same_bits(ours, apart, values, x, y)


def test_a_float8_steps_weight_casts_run_side_by_side_after_their_scales():
    """A float8 MLP step casts each weight at the scale its amax history gives (a one-value kernel of the initial
    group), folding the weight's row maxima for the history (a row kernel): the casts run as one kernel after the
    initial group, each part a row kernel; the step computes the bits of the plan without."""
    from cortado import compiler
    from cortado.backends.cupy import backend as gpu_backend
    from float8_plans import assert_same_bits, float8_mlp_step

    outputs, values, x, y = float8_mlp_step((256, 512, 256), (4, 128))
    ours = compiler._rewrite(outputs, gpu_backend, {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(horizontal, "_made_from_leaves", lambda t: False)
        apart = compiler._rewrite(outputs, gpu_backend, {})
    casts = [body for _, body in _side_by_side_kernels(ours) if any(o.dtype.name == "float8_e4m3fn" for o in body)]
    assert len(casts) == 1 and {(256, 512), (256, 1)} <= {o.shape for o in casts[0]}  # the second weight's, its maxima
    assert not any(o.dtype.name == "float8_e4m3fn" for _, body in _side_by_side_kernels(apart) for o in body)
    assert_same_bits(ours, apart, values, x, y)


def test_a_row_kernel_reading_only_inputs_stays_a_row_kernel():
    """Small row kernels reading only the program's inputs (a layer norm, a softmax) keep their own kernels: only a
    float8 weight's cast, after its scale, is a row kernel that runs side by side."""
    x, g = ct.var("x", (33, 7)), ct.var("g", (7,))
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    y = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * g
    roots, _ = _grouped([y, ct.softmax(x * 2.0, axis=-1), g * 3.0, x.sum()])
    assert not any(o.shape == (33, 7) for _, body in _side_by_side_kernels(roots) for o in body)
    assert any(t.op.name == "fused" and t.attr("kernel") == "row" for t in ct.schedule(list(roots)))


@pytest.mark.gpu
def test_on_the_gpu_a_float8_steps_weight_casts_side_by_side_are_the_same_bits(monkeypatch):
    """A one-layer float8 GPT with its weights' casts (row kernels folding their rows' maxima) side by side, against
    the same step with each cast a kernel of its own: three steps give the same losses and state, bit for bit."""
    from float8_plans import assert_same_training, float8_gpt_trained

    def casts_side_by_side(kernels):
        return [t for t in kernels if t.op.name == "fused" and isinstance(t.attr("kernel"), Horizontal)
                and any(o.dtype.name == "float8_e4m3fn" for o in t.attr("outputs"))]

    skip_without_device("cupy")
    grouped = float8_gpt_trained()
    monkeypatch.setattr(horizontal, "_made_from_leaves", lambda t: False)
    apart = float8_gpt_trained()
    assert casts_side_by_side(grouped[0]) and not casts_side_by_side(apart[0])
    assert_same_training(grouped, apart)


def test_a_part_of_one_value_takes_a_block_of_its_own():
    """One-value reductions side by side: each part a block (reducing with a warp for a short one), its block's index
    counted from the part's first."""
    a, b = ct.var("a", (64,)), ct.var("b", (8192,))
    roots, _ = _grouped([ct.max(a) * 2.0, ct.sum(b * 2.0)])
    (t,) = {(r.args, r.attr("outputs")): r for r in ct.schedule(list(roots)) if r.op.name == "fused"}.values()
    assert isinstance(t.attr("kernel"), Horizontal) and len(t.attr("kernel").parts) == 2
    source = horizontal_source(t.attr("outputs"), [Operand(p.shape, p.dtype, contiguous_strides(p.shape))
                                                   for p in t.args], (), t.attr("kernel").spans())
    assert source.text.count("(blockIdx.x - first)") == 2 and source.blocks == 2
    assert ", 0u);" in source.text and ", 1u);" in source.text  # the second part's blocks start at 1
    assert "threadIdx.x % 32" in source.text and "threadIdx.x % 256" in source.text  # a warp reduces 64, a block 8192


@pytest.mark.gpu
def test_on_the_gpu_one_value_reductions_side_by_side_equal_the_reference():
    """Maxima, sums and means of a warp's length, a block's and more, one kernel: the CPU's values (the maxima's
    bits, NaN included)."""
    skip_without_device("cupy")
    a, b, c = ct.var("a", (64,)), ct.var("b", (8192,)), ct.var("c", (65536,))
    outputs = [ct.max(a) * 2.0, ct.sum(b * 2.0), ct.mean(c), ct.max(ct.abs(c))]
    programs = [ct.compile(outputs, inputs=[a, b, c], backend=backend) for backend in ("numpy", "cupy")]
    assert "fuse-side-by-side" in programs[1].explain()
    rng = np.random.default_rng(4)
    feeds = {"a": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(8192).astype(np.float32),
             "c": rng.standard_normal(65536).astype(np.float32)}
    nan = {"a": np.where(np.arange(64) == 9, np.nan, feeds["a"]).astype(np.float32),
           "c": np.where(np.arange(65536) == 40000, np.nan, feeds["c"]).astype(np.float32)}
    for fed in (feeds, {**feeds, **nan}):
        cpu, gpu = ([np.asarray(host(v)) for v in program(**fed)] for program in programs)
        np.testing.assert_array_equal(gpu[0], cpu[0])
        np.testing.assert_array_equal(gpu[3], cpu[3])
        np.testing.assert_allclose(gpu[1:3], cpu[1:3], rtol=1e-5, atol=1e-6)  # NaN in the mean, too


def test_a_kernel_side_by_side_may_read_values_made_again(monkeypatch):
    """Planning for the GPU (on the CPU: no device is asked, and no call needs scratch), a float8 MLP step whose
    one-value kernels are grouped even where they read what the backward pass reads too (which ``side_by_side``
    does not do, so that it keeps no such value alive to the step's end) has recomputation make those values again
    for the group, and the plan computes the bits of the plan without."""
    from cortado import compiler
    from cortado.backends.cupy import backend as gpu_backend
    from gpu_rewrites import planning_without_a_device
    from test_float8 import _float8_mlp

    planning_without_a_device(monkeypatch)
    monkeypatch.setattr(horizontal, "_read_only_by", lambda *args: True)
    loss, inputs, values, updates, feeds = _float8_mlp()
    signature = compiler._signature([loss], inputs, values, updates)
    options = compiler._options(gpu_backend, {})
    built = compiler._built(signature, gpu_backend, options)
    again = compiler._recomputing(built, signature, gpu_backend, options)
    assert any(k.term.op.name == "fused" and k.term.attr("again") for k in again.kernels)
    assert again.plan.peak_bytes < built.plan.peak_bytes
    given = {**{v.name: np.asarray(a) for v, a in values.items()}, **feeds}
    for ours, theirs in zip(ct.evaluate(list(again.roots), given), ct.evaluate(list(built.roots), given)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))
