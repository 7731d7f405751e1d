"""The cupy backend on an NVIDIA GPU, against the reference interpreter. Skipped where no GPU is visible.

Run on the device machine by ``benchmarks/run_gpu.sh`` (the GPU tests, then the benchmarks).
"""

import itertools
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends.cupy.lowering import gemm as gemm_target
from cortado.backends import gpu_visible
from cortado.backends.interface import PlannedStep
from cortado.exprgraph.dtypes import finfo, is_float
from cortado.exprgraph.graph import schedule
from cortado.exprgraph.ops import FUSED_OP
from cortado.rules.fusion import ROW_KERNEL
from cortado.testing import ALL_OPS, graphs_with_feeds

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from mlp_numpy import initial_values, mlp  # noqa: E402
from test_fusion import adam_step, normed_residual  # noqa: E402

TOLERANCE = {"bfloat16": (1e-1, 1e-1), "float16": (2e-2, 2e-2), "float32": (2e-4, 2e-5), "float64": (1e-9, 1e-12)}
FLOATS = ["bfloat16", "float16", "float32", "float64"]


def host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def assert_close(ours, expected, dtype=None):
    ours = host(ours)
    assert ours.shape == expected.shape
    dtype = np.dtype(dtype or ours.dtype)
    if is_float(dtype):
        rtol, atol = TOLERANCE[dtype.name]
        np.testing.assert_allclose(ours.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(ours, expected)


@settings(max_examples=60)
@given(graphs_with_feeds(ops=ALL_OPS, dtypes=tuple(FLOATS)), st.booleans())
def test_random_graphs_on_the_gpu_match_the_reference(case, on_device):
    import cupy

    graph, feeds = case
    program = ct.compile(list(graph.outputs), inputs=graph.inputs, backend="cupy", debug=True)
    given_feeds = {k: cupy.asarray(v) for k, v in feeds.items()} if on_device else feeds
    expected = ct.evaluate(graph.outputs, feeds, precision="float64")
    declared = ct.evaluate(graph.outputs, feeds)  # a comparison after a rounding: the float64 answer may differ
    for _ in range(3):  # eager, then captured, then replayed
        for ours, theirs, rounded, out in zip(program(**given_feeds), expected, declared, graph.outputs):
            if is_float(out.dtype):
                assert_close(ours, theirs, _least_precise(out))
            else:  # each element the exact answer or the one in the declared dtypes (x <= bfloat16(x) is either)
                assert ((host(ours) == theirs) | (host(ours) == rounded)).all(), (host(ours), theirs, rounded)


def _least_precise(out):
    """The dtype whose tolerance an output is held to: the least precise float it was computed through."""
    floats = [t.dtype for t in schedule(out) if is_float(t.dtype)]
    return max(floats, key=lambda d: finfo(d).eps) if is_float(out.dtype) else out.dtype


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(33, 65, 17), (2, 3, 1030), (4096, 3), (1030, 129), (520, 2, 64)])
def test_fused_reductions_over_every_subset_of_axes(shape, dtype):
    """Every reduction kernel: rows (a warp or a block an output), columns an element a thread or a 16-byte vector of
    adjacent columns a thread (the last shape, whose columns are also split into parts), one value."""
    x = ct.var("x", shape, dtype)
    y = ct.var("y", shape[-1:], dtype)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(shape).astype(dtype), "y": rng.standard_normal(shape[-1:]).astype(dtype)}
    outputs = []
    for r in range(1, len(shape) + 1):
        for axes in itertools.combinations(range(len(shape)), r):
            outputs.append(ct.log1p(ct.sum(ct.exp(ct.tanh(x) * y), axis=axes)) * 0.5)
            outputs.append(ct.max(x + y, axis=axes, keepdims=True) - 1.0)
            outputs.append(ct.mean(ct.sigmoid(x), axis=axes))
    program = ct.compile(outputs, inputs=[x, y], backend="cupy")
    expected = ct.evaluate(outputs, feeds, precision="float64")
    for ours, theirs in zip(program(**feeds), expected):
        assert_close(ours, theirs, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", [(2, 5, 384), (33, 7), (6, 768), (3, 2048), (9, 3000)])
def test_row_kernels_normalize_rows_and_take_their_gradients(shape, dtype):
    """A layer norm forward and its gradients, and a masked softmax: each row kernel (a warp to a row, or a block for
    rows of 3000; its rows held in registers, a whole or a ragged number of vectors a thread, or read again in each
    pass) against the reference in float64."""
    x, w = ct.var("x", shape, dtype), ct.var("w", shape, dtype)
    g, b = ct.var("g", shape[-1:], dtype), ct.var("b", shape[-1:], dtype)
    centered = x - ct.mean(x, axis=-1, keepdims=True)
    y = centered / ct.sqrt(ct.mean(centered * centered, axis=-1, keepdims=True) + 1e-5) * g + b
    gradients = ct.grad(ct.sum(ct.cast(y * w, "float32")), [x, g, b])
    keep = np.random.default_rng(1).random(shape) < 0.8
    keep[..., 0] = True
    softmax = ct.softmax(ct.where(keep, x, -np.inf), axis=-1)
    outputs = [y, softmax, *gradients]
    program = ct.compile(outputs, inputs=[x, w, g, b], backend="cupy")
    rows = {k.term.attr("outputs") for k in program.kernels
            if k.term.op is FUSED_OP and k.term.attr("kernel") == ROW_KERNEL}
    assert len(rows) >= 3  # the forward, the input's gradient, the softmax
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in (x, w, g, b)}
    for ours, theirs in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
        assert_close(ours, theirs, dtype)


def test_a_row_kernel_keeping_some_rows_in_registers_is_the_reference():
    """``test_fusion``'s layer norm gradient kernel that keeps two of its three rows in registers."""
    outputs, inputs = normed_residual()
    rng = np.random.default_rng(5)
    feeds = {v.name: (rng.standard_normal(v.shape) * (0.05 if v.name == "w" else 1)).astype(
        ml_dtypes.bfloat16 if v.dtype.name == "bfloat16" else np.float32) for v in inputs}
    program = ct.compile(outputs, inputs=inputs, backend="cupy")
    for ours, theirs in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
        assert_close(ours, theirs, "bfloat16")


def test_an_elementwise_kernel_of_many_arrays_at_4_elements_a_thread_is_the_reference():
    """``test_fusion``'s Adam step of seven arrays (4 elements a thread), with a ragged tail."""
    outputs, inputs = adam_step((301, 77))
    rng = np.random.default_rng(6)
    feeds = {v.name: np.abs(rng.standard_normal(v.shape)).astype(
        ml_dtypes.bfloat16 if v.dtype.name == "bfloat16" else np.float32) for v in inputs}
    program = ct.compile(outputs, inputs=inputs, backend="cupy")
    for ours, theirs in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
        assert_close(ours, theirs, "float32")


def _gemm_case(transpose_a, transpose_b, alpha, added, epilogue, dtype, batch=()):
    m, k, n = 37, 70, 45
    a = ct.var("a", batch + ((k, m) if transpose_a else (m, k)), dtype)
    b = ct.var("b", (n, k) if transpose_b else (k, n), dtype)
    c = ct.var("c", batch + (m, n), dtype)
    bias = ct.var("bias", (n,), dtype)
    product = ct.matmul(ct.transpose(a, tuple(range(len(batch))) + (len(batch) + 1, len(batch))) if transpose_a else a,
                        ct.transpose(b) if transpose_b else b)
    out = product * alpha if alpha != 1 else product
    out = {"none": out, "+c": out + c, "c-": c - out}[added]
    if "bias" in epilogue:
        out = out + bias
    if "relu" in epilogue:
        out = ct.relu(out)
    if "gelu" in epilogue:
        out = ct.gelu(out)
    return out, [a, b] + [c] * (added != "none") + [bias] * ("bias" in epilogue)


@pytest.mark.parametrize("epilogue, dtype", [(e, d) for e in ("none", "bias", "relu", "bias_relu", "gelu", "bias_gelu")
                                             for d in FLOATS if "gelu" not in e or d != "float64"])
def test_gemm_lowering_for_every_transpose_scale_added_term_and_epilogue(epilogue, dtype):
    rng = np.random.default_rng(1)
    for transpose_a, transpose_b, alpha, added in itertools.product([False, True], [False, True], [1.0, -0.5],
                                                                    ["none", "+c", "c-"]):
        if "bias" in epilogue and added == "c-":
            continue  # c - (a @ b) + bias: the product is negated, which no bias epilogue follows
        out, variables = _gemm_case(transpose_a, transpose_b, alpha, added, epilogue, dtype)
        feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in variables}
        program = ct.compile(out, inputs=variables, backend="cupy")
        gemms = [k.term for k in program.kernels if k.term.op.name == "gemm"]
        assert len(gemms) == 1 and gemms[0].attrs[4] == epilogue, program.explain()
        assert [k.term.op.name for k in program.kernels if not k.is_load] == ["gemm"], program.explain()
        assert_close(program(**feeds), ct.evaluate(out, feeds, precision="float64"), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gelu_backward_is_the_dgelu_epilogue(dtype):
    x, W1, b1, W2 = ct.var("x", (50, 30), dtype), ct.var("W1", (30, 64), dtype), ct.var("b1", (64,), dtype), \
        ct.var("W2", (64, 7), dtype)
    gradients = ct.grad(ct.sum(ct.gelu(x @ W1 + b1) @ W2), [x, W1, b1])
    program = ct.compile(gradients, inputs=[x, W1, b1, W2], backend="cupy")
    # b1's gradient, the column sums of the dgelu product, comes out of the same GEMM
    assert "dgelu_bgrad" in [k.term.attrs[4] for k in program.kernels if k.term.op.name == "gemm"], program.explain()
    rng = np.random.default_rng(4)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in (x, W1, b1, W2)}
    for ours, expected in zip(program(**feeds), ct.evaluate(gradients, feeds, precision="float64")):
        scale = max(1.0, float(np.abs(expected).max()))  # sums of 50 rows: errors relative to the largest
        assert_close(host(ours).astype(np.float64) / scale, expected / scale, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_relus_gradient_is_zero_where_its_input_is_zero(dtype):
    """cuBLASLt's DRELU epilogue would pass the gradient there (its relu mask marks 0 and NaN): relu's backward
    stays a fused kernel reading the output, and agrees with the reference on exact zeros."""
    x, W1, b1 = ct.var("x", (50, 30), dtype), ct.var("W1", (30, 64), dtype), ct.var("b1", (64,), dtype)
    W2, y = ct.var("W2", (64, 7), dtype), ct.var("y", (50, 7), dtype)
    variables = [x, W1, b1, W2, y]
    gradients = ct.grad(ct.sum((ct.relu(x @ W1 + b1) @ W2) * y), [x, W1, b1])
    program = ct.compile(gradients, inputs=variables, backend="cupy")
    rng = np.random.default_rng(5)
    # quarters: every product and sum is exact, and many pre-activations are exactly 0
    feeds = {v.name: (rng.integers(-4, 5, v.shape) / 4).astype(dtype) for v in variables}
    assert (ct.evaluate(x @ W1 + b1, {v: feeds[v] for v in ('x', 'W1', 'b1')}) == 0).sum() > 10
    for _ in range(2):  # captured, then replayed
        for ours, expected in zip(program(**feeds), ct.evaluate(gradients, feeds, precision="float64")):
            scale = max(1.0, float(np.abs(expected).max()))  # sums of 50 rows: errors relative to the largest
            assert_close(host(ours).astype(np.float64) / scale, expected / scale, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_bias_gradients_come_out_of_the_gemm_that_reads_them(dtype):
    rng = np.random.default_rng(6)
    m, k, n = 40, 96, 24
    for transpose_a, transpose_b, side, update in itertools.product([False, True], [False, True], "ab", [False, True]):
        a = ct.var("a", (k, m) if transpose_a else (m, k), dtype)
        b = ct.var("b", (n, k) if transpose_b else (k, n), dtype)
        W = ct.var("W", (m, n), dtype)
        left, right = ct.transpose(a) if transpose_a else a, ct.transpose(b) if transpose_b else b
        product = W - 0.05 * (left @ right) if update else left @ right  # an SGD step (in place), or a product
        gradient = ct.sum(left, axis=1) if side == "a" else ct.sum(right, axis=0)
        variables = [a, b, W] if update else [a, b]
        program = ct.compile([product, gradient], inputs=variables, backend="cupy")
        summed_as_stored = transpose_a if side == "a" else not transpose_b  # what cuBLASLt can sum on the side
        gemms = [k.term.attrs[4] for k in program.kernels if k.term.op.name == "gemm"]
        assert gemms == [f"bgrad_{side}" if summed_as_stored else "none"], program.explain()
        feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in variables}
        for ours, expected in zip(program(**feeds), ct.evaluate([product, gradient], feeds, precision="float64")):
            scale = max(1.0, float(np.abs(expected).max()))  # sums of 96: errors relative to the largest
            assert_close(host(ours).astype(np.float64) / scale, expected / scale, dtype)


@pytest.mark.parametrize("batch_b", [False, True])
def test_batched_matmul_is_one_gemm(batch_b):
    """A batch of matrices times a batch of matrices is one strided batched gemm; times one matrix, the batch is
    folded into the rows of one plain gemm (reshapes that are views)."""
    a = ct.var("a", (6, 20, 30))
    b = ct.var("b", (6, 30, 10) if batch_b else (30, 10))
    out = ct.matmul(a, b) * 2.0
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal(a.shape).astype("float32"), "b": rng.standard_normal(b.shape).astype("float32")}
    program = ct.compile(out, inputs=[a, b], backend="cupy")
    assert [k.term.op.name for k in program.kernels if not k.is_load and k.term.op.name != "reshape"] == ["gemm"]
    assert all(k.term not in program.memory for k in program.kernels if k.term.op.name == "reshape")  # views
    assert_close(program(**feeds), ct.evaluate(out, feeds, precision="float64"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_linear_layer_over_sequences_keeps_its_gemm_epilogues(dtype):
    """``x @ W + b`` over (batch, time, width) is one gemm over batch * time rows: the bias is its epilogue, gelu's
    backward the dgelu epilogue, and the biases' gradients (sums over batch and time) come out of gemms too."""
    x, y = ct.var("x", (4, 24, 32), dtype), ct.var("y", (4, 24, 16), dtype)
    W1, b1, W2, b2 = (ct.var(n, s, dtype) for n, s in (("W1", (32, 64)), ("b1", (64,)), ("W2", (64, 16)), ("b2", (16,))))
    variables = [x, y, W1, b1, W2, b2]
    h = ct.gelu(x @ W1 + b1) @ W2 + b2
    outputs = [h, *ct.grad(ct.sum(ct.cast(h * y, "float32")), [x, W1, b1, W2, b2])]
    program = ct.compile(outputs, inputs=variables, backend="cupy")
    epilogues = {k.term.attr("epilogue") for k in program.kernels if k.term.op.name == "gemm"}
    assert {"bias", "dgelu_bgrad", "bgrad_b"} <= epilogues, program.explain()
    rng = np.random.default_rng(7)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in variables}
    for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
        scale = max(1.0, float(np.abs(expected).max()))  # sums of 96 rows: errors relative to the largest
        assert_close(host(ours).astype(np.float64) / scale, expected / scale, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_gelu_layers_gemm_writes_the_gelu_and_keeps_its_argument(dtype):
    """A gelu layer in a training step: its gemm writes the gelu and, beside it, the argument gelu's backward reads
    (cuBLASLt's GELU_AUX_BIAS); the weight gradient, in the backward pass, reads a gelu computed again from the kept
    argument, over bfloat16 and float16 by the kernel of gelu's backward (a plain product times gelu's slope), which
    reads that argument too. The step's results are the plain expressions'."""
    x, y = ct.var("x", (4, 24, 32), dtype), ct.var("y", (4, 24, 16), dtype)
    W1, b1, W2 = (ct.var(n, s, dtype) for n, s in (("W1", (32, 64)), ("b1", (64,)), ("W2", (64, 16))))
    variables = [x, y, W1, b1, W2]
    h = ct.gelu(x @ W1 + b1) @ W2
    outputs = [h, *ct.grad(ct.sum(ct.cast(h * h * y, "float32")), [x, W1, b1, W2])]
    program = ct.compile(outputs, inputs=variables, backend="cupy")
    epilogues = [k.term.attr("epilogue") for k in program.kernels if k.term.op.name == "gemm"]
    assert "bias_gelu_aux" in epilogues, program.explain()
    joined = program.traces["fusion"].counts()["elementwise-into-reader"]
    dgelu = any(e.startswith("dgelu") for e in epilogues)
    assert joined == (dtype != "float32") and dgelu == (dtype == "float32"), program.explain()
    rng = np.random.default_rng(8)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in variables}
    for _ in range(2):  # captured, then replayed
        for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
            scale = max(1.0, float(np.abs(expected).max()))
            assert_close(host(ours).astype(np.float64) / scale, expected / scale, dtype)


@pytest.mark.parametrize("width", [128, 97])
def test_a_layer_norms_gain_gradient_makes_the_normalized_rows_it_reads(width):
    """A bfloat16 layer norm between two products in a training step: its forward kernel stores no normalized rows,
    its gain's gradient makes them from the layer's input and statistics (``rules.row_values``), over rows of whole
    vectors and rows of single elements (97). The step's results are the plain expressions', captured and
    replayed."""
    x, W1 = ct.var("x", (4, 63, 96), "bfloat16"), ct.var("W1", (96, width), "bfloat16")
    W2 = ct.var("W2", (width, 32), "bfloat16")
    norm = ct.nn.LayerNorm(width)
    y = norm(x @ W1) @ W2
    loss = ct.sum(ct.cast(y * y, "float32"))
    variables = [x, W1, W2, norm.weight, norm.bias]
    outputs = [loss, *ct.grad(loss, variables)]
    program = ct.compile(outputs, inputs=variables, backend="cupy")
    assert program.traces["fusion"].counts()["row-value-made-by-reader"] == 1, program.explain()
    rng = np.random.default_rng(9)
    feeds = {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in variables}
    for _ in range(2):  # captured, then replayed
        for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
            scale = max(1.0, float(np.abs(expected).max()))
            assert_close(host(ours).astype(np.float64) / scale, expected / scale, "bfloat16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_slices_that_a_library_call_reads_are_views(dtype):
    """Splitting a projection in three (attention's q, k and v) costs no copy: each third is a view of the
    projection, its pointer moved to its first element, that the next gemm reads in place, as does the
    program's output copy."""
    a, w, w2 = ct.var("a", (2, 16, 128), dtype), ct.var("w", (128, 384), dtype), ct.var("w2", (128, 32), dtype)
    q, k, v = ct.split(a @ w, 3, axis=-1)
    outputs = [q @ w2, k @ w2, v]
    program = ct.compile(outputs, inputs=[a, w, w2], backend="cupy")
    crops = [k.term for k in program.kernels if k.term.op.name == "fused"]
    assert len(crops) == 3 and all(t not in program.memory for t in crops), program.explain()
    rng = np.random.default_rng(8)
    feeds = {x.name: rng.standard_normal(x.shape).astype(dtype) for x in (a, w, w2)}
    for _ in range(2):  # captured, then replayed
        for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
            scale = max(1.0, float(np.abs(expected).max()))
            assert_close(host(ours).astype(np.float64) / scale, expected / scale, dtype)


def _mlp_program(cuda_graph, batch=64, sizes=(20, 64, 64, 5), dtype="float32", **options):
    loss, _, x, y, parameters = mlp(batch, sizes)
    gradients = ct.grad(loss, parameters)
    values = initial_values(parameters, np.random.default_rng(0))
    updates = {p: p - 0.1 * g for p, g in zip(parameters, gradients)}
    program = ct.compile([loss], inputs=[x, y], state={p: values[p.name] for p in parameters}, updates=updates,
                         backend="cupy", cuda_graph=cuda_graph, **options)
    reference = ct.compile([loss], inputs=[x, y], state={p: values[p.name] for p in parameters}, updates=updates)
    rng = np.random.default_rng(3)
    data = [{"x": rng.standard_normal((batch, sizes[0])).astype(dtype),
             "y": np.eye(sizes[-1], dtype=dtype)[rng.integers(0, sizes[-1], batch)]} for _ in range(4)]
    return program, reference, data


def test_a_bias_gradient_at_the_memory_peak_is_summed_apart():
    """The GEMM that could make the last layer's bias gradient runs where four activation-sized buffers are live;
    summed by a kernel of its own (the bias's SGD step its epilogue, written over the bias), earlier, it is not.
    The steps still agree with the CPU's."""
    import mlp_gpu

    sizes, batch = (256, 256, 256, 256), 256
    loss, x, y, parameters = mlp_gpu.mlp(batch, sizes)
    gradients = ct.grad(loss, parameters)
    values = mlp_gpu.initial_values(sizes, np.random.default_rng(0))
    updates = {p: p - 0.05 * g for p, g in zip(parameters, gradients)}
    programs = [ct.compile(loss, inputs=[x, y], state={p: values[p.name] for p in parameters}, updates=updates,
                           backend=backend) for backend in ("cupy", "numpy")]
    explained = programs[0].explain()
    assert "fed, read where the caller keeps it" in explained and "in output 0" in explained, explained
    # no bias gradient a GEMM makes is live at the peak of the plan chosen
    assert not gemm_target.alternatives(PlannedStep(programs[0].memory, programs[0].traces)), explained
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((batch, 256)).astype(np.float32),
             "y": np.eye(256, dtype=np.float32)[rng.integers(0, 256, batch)]}
    for _ in range(3):
        ours, expected = (program(**feeds) for program in programs)
        assert_close(ours, expected)
    for p in parameters:
        assert_close(programs[0].state[p.name], programs[1].state[p.name])


def test_gemm_algorithms_are_timed_once_for_each_kind_of_call():
    def chosen(program):
        return [made.library.candidates[made.library.choice].tobytes() for made, _ in program._executor.tuned]

    first, reference, data = _mlp_program(cuda_graph=True, sizes=(24, 72, 40, 8))
    second, _, _ = _mlp_program(cuda_graph=False, sizes=(24, 72, 40, 8))
    heuristic, _, _ = _mlp_program(cuda_graph=True, sizes=(24, 72, 40, 8), autotune=False)
    assert len(chosen(first)) == 8 and chosen(first) == chosen(second)
    assert all(made.library.choice == 0 for made, _ in heuristic._executor.tuned)
    for feeds in data:
        (expected,) = reference(**feeds)
        for program in (first, heuristic):
            assert_close(program(**feeds)[0], expected, "float32")


def test_the_mlp_training_step_follows_the_cpu_program():
    program, reference, data = _mlp_program(cuda_graph=True)
    for feeds in data:
        (ours,) = program(**feeds)
        (theirs,) = reference(**feeds)
        assert_close(ours, theirs.astype(np.float64))
    for name in reference.state:
        assert_close(program.state[name], np.asarray(reference.state[name], np.float64))


def test_cuda_graph_replay_equals_eager_execution_bit_for_bit():
    import cupy

    replayed, _, data = _mlp_program(cuda_graph=True)
    eager, _, _ = _mlp_program(cuda_graph=False)
    for feeds in data:
        device_feeds = {k: cupy.asarray(v) for k, v in feeds.items()}
        assert host(replayed(**device_feeds)[0]) == host(eager(**device_feeds)[0])
    assert replayed._executor.graphs and not eager._executor.graphs
    for name in replayed.state:
        assert np.array_equal(host(replayed.state[name]), host(eager.state[name]))


def test_a_steady_state_call_allocates_nothing():
    import cupy
    from cupy.cuda import memory_hook

    class Count(memory_hook.MemoryHook):
        name = "count"

        def __init__(self):
            self.mallocs = 0

        def malloc_preprocess(self, **kwargs):
            self.mallocs += 1

    program, _, data = _mlp_program(cuda_graph=True)
    feeds = {k: cupy.asarray(v) for k, v in data[0].items()}
    for _ in range(3):
        program(**feeds)
        program(**data[0])  # the first NumPy feed makes the feed block, once
    cupy.cuda.Device().synchronize()
    with Count() as hook:
        program(**feeds)
        program(**data[1])  # NumPy feeds go through pinned staging: no allocation either
    assert hook.mallocs == 0


def test_numpy_and_cupy_feeds_give_the_same_step():
    import cupy

    on_host, _, data = _mlp_program(cuda_graph=True)
    on_device, _, _ = _mlp_program(cuda_graph=True)
    for feeds in data:
        assert host(on_host(**feeds)[0]) == host(on_device(**{k: cupy.asarray(v) for k, v in feeds.items()})[0])


def test_state_reads_and_writes_on_the_gpu():
    import cupy

    W = ct.var("W", (3, 4))
    x = ct.var("x", (3, 4))
    program = ct.compile([ct.sum(W * x)], inputs=[x], state={W: np.ones((3, 4), np.float32)}, updates={W: W * 2.0},
                         backend="cupy")
    ones = np.ones((3, 4), np.float32)
    assert float(program(x=ones)[0]) == 12.0
    assert isinstance(program.state["W"], cupy.ndarray) and float(program.state["W"].sum()) == 24.0
    program.state["W"] = np.zeros((3, 4), np.float32)
    assert float(program(x=ones)[0]) == 0.0
    with pytest.raises(ct.ShapeError):
        program.state["W"] = np.zeros((4, 3), np.float32)
    assert program.device_bytes >= program.memory.peak_bytes + 48


def test_scalar_state_on_the_gpu():
    count = ct.var("count", ())
    program = ct.compile([count * 2.0], state={count: np.float32(1)}, updates={count: count + 1}, backend="cupy")
    assert [float(program()[0]) for _ in range(3)] == [2.0, 4.0, 6.0]
    program.state["count"] = np.float32(10)
    assert float(program()[0]) == 20.0 and float(program.state["count"]) == 11.0


def test_swapped_updates_and_outputs_of_state_on_the_gpu():
    V, W = ct.var("V", (5,)), ct.var("W", (5,))
    program = ct.compile([V, W + 0.0], state={V: np.arange(5, dtype=np.float32), W: -np.arange(5, dtype=np.float32)},
                         updates={V: W, W: V}, backend="cupy")
    for call in range(3):
        v, w = (host(a) for a in program())
        sign = (-1) ** call
        assert np.array_equal(v, sign * np.arange(5)) and np.array_equal(w, -sign * np.arange(5))


def test_a_batch_of_copies_writes_every_byte_of_every_copy_and_nothing_else():
    """``CopyBatch``: sizes from a byte to its limit, addresses aligned to 16 bytes and not, one kernel launch."""
    import cupy

    from cortado.backends.cupy.targets.copies import BATCHED_BYTES, CopyBatch

    sizes, offsets = [1, 3, 16, 17, 4101, 65536, BATCHED_BYTES], [0, 1, 16, 5, 0, 3, 0]
    rng = np.random.default_rng(0)
    sources = [cupy.asarray(rng.integers(0, 256, n + 32, dtype=np.uint8)) for n in sizes]
    targets = [cupy.zeros(n + 32, np.uint8) for n in sizes]
    stream = cupy.cuda.Stream(non_blocking=True)
    batch = CopyBatch(sizes)
    call = batch.bind([(s.data.ptr + o, t.data.ptr + o) for s, t, o in zip(sources, targets, offsets)], stream)
    with stream:
        call()
    stream.synchronize()
    for s, t, n, o in zip(sources, targets, sizes, offsets):
        expected = np.zeros(n + 32, np.uint8)
        expected[o:o + n] = host(s)[o:o + n]
        np.testing.assert_array_equal(host(t), expected)
    with pytest.raises(ValueError, match="1 to"):
        CopyBatch([BATCHED_BYTES + 1])


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_many_small_state_updates_copied_at_the_end_of_the_step_follow_the_cpus(cuda_graph):
    """Rolled histories (each update reads its own variable, so it cannot be written in place) of several dtypes and
    lengths, and two variables swapped (staged first): the copies into the state, batched, give the CPU's values."""
    x = ct.var("x", (7,))
    histories = {ct.var(f"h{n}_{dtype}", (n,), dtype): dtype for n in (1, 3, 16, 33) for dtype in ("float32", "int8")}
    p, q = ct.var("p", (5,), "bfloat16"), ct.var("q", (5,), "bfloat16")
    updates = {h: ct.concatenate([ct.cast(ct.reshape(ct.max(x), (1,)), dtype), h[:-1]]) for h, dtype in
               histories.items()}
    updates.update({p: q, q: p})
    state = {h: np.arange(h.shape[0]).astype(dtype) for h, dtype in histories.items()}
    state.update({p: np.arange(5).astype(ml_dtypes.bfloat16), q: -np.arange(5).astype(ml_dtypes.bfloat16)})
    gpu = ct.compile([ct.sum(x)], inputs=[x], state=state, updates=updates, backend="cupy", cuda_graph=cuda_graph)
    cpu = ct.compile([ct.sum(x)], inputs=[x], state=state, updates=updates, backend="numpy")
    for step in range(4):
        feed = np.linspace(-3, 3 + step, 7).astype(np.float32)
        gpu(x=feed), cpu(x=feed)
        for v in list(histories) + [p, q]:
            np.testing.assert_array_equal(host(gpu.state[v.name]), cpu.state[v.name])


def test_an_update_that_slices_another_states_old_value_reads_it_before_it_changes():
    """``a`` takes the second half of ``b`` as it was, while ``b`` is updated: the half is a view inside ``b``'s
    buffer, so it is staged before ``b``'s new value is copied in (the CPU's program says what is right)."""
    a, b, x = ct.var("a", (64,)), ct.var("b", (128,)), ct.var("x", (128,))
    state = {a: np.zeros(64, np.float32), b: np.arange(128, dtype=np.float32)}
    updates = {b: b + x, a: ct.split(b, 2, axis=0)[1]}
    gpu, cpu = (ct.compile([ct.sum(x)], inputs=[x], state=state, updates=updates, backend=name)
                for name in ("cupy", "numpy"))
    feed = np.linspace(-1, 1, 128, dtype=np.float32)
    for _ in range(3):
        gpu(x=feed), cpu(x=feed)
        for name in ("a", "b"):
            np.testing.assert_array_equal(host(gpu.state[name]), cpu.state[name])


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_coupled_updates_on_the_gpu_each_read_the_old_values(cuda_graph):
    a, b = ct.var("a", (6,)), ct.var("b", (6,))
    start = {a: np.linspace(0.5, 1, 6).astype(np.float32), b: np.linspace(-1, 1, 6).astype(np.float32)}
    updates = {a: 0.8 * a - 0.6 * b, b: 0.6 * a + 0.8 * b}
    program = ct.compile([a * b], state=start, updates=updates, backend="cupy", cuda_graph=cuda_graph)
    current = {v.name: value for v, value in start.items()}
    for _ in range(3):
        expected = ct.evaluate([a * b] + list(updates.values()), current)
        assert_close(program()[0], expected[0])
        current = {"a": expected[1], "b": expected[2]}
        assert_close(program.state["a"], current["a"])
        assert_close(program.state["b"], current["b"])


def test_calls_from_several_threads_on_the_gpu_run_one_at_a_time():
    import threading

    count, x = ct.var("count", ()), ct.var("x", (256, 64))
    program = ct.compile([ct.sum(ct.tanh(x) * 2.0)], inputs=[x], state={count: np.float32(0)},
                         updates={count: count + 1}, backend="cupy")
    feeds = [np.full((256, 64), k / 8, np.float32) for k in range(8)]
    errors = []

    def work(k):  # the results are the output block, which the next call overwrites: only the state is checked
        for _ in range(25):
            try:
                program(x=feeds[k])
            except Exception as error:  # noqa: BLE001 (any failure in a thread is the test's failure)
                errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and float(program.state["count"]) == 200
    assert np.isclose(float(program(x=feeds[3])[0]), np.sum(np.tanh(feeds[3]) * 2.0), rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_einsums_run_as_gemms_or_fused_reductions(dtype):
    rng = np.random.default_rng(5)
    for subscripts, shapes in [("bij,bjk->bik", [(3, 40, 50), (3, 50, 60)]), ("ijk,jl->kli", [(20, 30, 40), (30, 50)]),
                               ("ii->i", [(30, 30)]), ("ij,jk,kl->il", [(20, 30), (30, 40), (40, 50)]),
                               ("abc,adc->d", [(6, 20, 8), (6, 30, 8)])]:  # b, of one operand alone, summed away
        operands = [ct.var(f"x{i}", shape, dtype) for i, shape in enumerate(shapes)]
        out = ct.einsum(subscripts, *operands)
        feeds = {v.name: (2 * rng.standard_normal(v.shape)).astype(dtype) for v in operands}
        program = ct.compile(out, inputs=operands, backend="cupy")
        assert_close(program(**feeds), ct.evaluate(out, feeds, precision="float64"), dtype)


def test_an_einsum_summing_a_label_of_one_operand_alone_keeps_its_value_at_infinities():
    """As on the CPU (test_lowering.py): its products are added, not its operands' sums multiplied."""
    x0 = ct.var("x0", (2, 3, 1))
    out = ct.einsum("abc,adc->", x0, x0)
    infinite = np.array([[[-np.inf], [1], [1]], [[1], [1], [1]]], np.float32)
    assert np.isnan(float(ct.compile([out], inputs=[x0], backend="cupy")(infinite)[0]))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint16", "uint64"])
def test_integer_powers_wrap_as_numpys_where_no_exponent_is_negative(dtype):
    x, k = ct.var("x", (1000,), dtype), ct.var("k", (1000,), "uint8")
    outputs = [x ** 2, x ** 3, x ** 0, x ** k, ct.const(np.array(3, dtype)) ** k]
    program = ct.compile(outputs, inputs=[x, k], backend="cupy")
    rng = np.random.default_rng(7)
    low = np.iinfo(dtype).min if np.dtype(dtype).kind == "i" else 0
    feeds = {"x": rng.integers(max(low, -300), 300, 1000).astype(dtype), "k": rng.integers(0, 70, 1000).astype(np.uint8)}
    for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds)):  # overflows wrap, in both
        assert_close(ours, expected)


def test_what_the_gpu_cannot_run_is_refused_clearly():
    x = ct.var("x", (3, 3))
    n, m = ct.var("n", (3,), "int32"), ct.var("m", (3,), "int32")
    with pytest.raises(ct.BackendError, match="exponent may be negative"):
        ct.compile(n ** m, inputs=[n, m], backend="cupy")
    with pytest.raises(ct.BackendError, match="no option"):
        ct.compile(x * 2, inputs=[x], backend="cupy", graphs=False)


def test_profile_times_every_kernel_of_a_step():
    program, _, data = _mlp_program(cuda_graph=True)
    report = program.profile(**data[0])
    assert report.startswith(f"{program.kernels_run} kernels") and "gemm" in report and "fused" in report
    assert len(report.splitlines()) - 1 == len(program._executor.labels)  # each kernel, and each wait for updates
    assert f"; {program.kernels_run} do work each step" in program.explain()


def test_a_hold_keeps_a_stream_waiting_until_the_host_lets_go():
    """What makes a profile time kernels rather than the Python launching them: work queued behind a hold runs
    when it is let go, back to back, however long the host took to queue it."""
    import time

    import cupy

    from cortado.backends.cupy.runtime.holding import Hold

    stream = cupy.cuda.Stream(non_blocking=True)
    hold = Hold(stream)
    with stream:  # loading a kernel's module waits for the GPU: these load before the hold
        cupy.arange(1024, dtype=cupy.float32).sum()
    hold.hold()
    hold.release()
    stream.synchronize()
    before = stream.record()
    hold.hold()
    start = stream.record()
    with stream:
        for _ in range(3):
            cupy.arange(1024, dtype=cupy.float32).sum()
            time.sleep(0.02)
    end = stream.record()
    time.sleep(0.05)
    hold.release()
    end.synchronize()
    assert cupy.cuda.get_elapsed_time(before, end) >= 100  # held while the host slept
    assert cupy.cuda.get_elapsed_time(start, end) < 5  # then ran at once


def test_cupy_feeds_are_read_where_they_are():
    import cupy

    program, reference, data = _mlp_program(cuda_graph=True)
    held = program.device_bytes
    arrays = [{k: cupy.asarray(v) for k, v in feeds.items()} for feeds in data]
    for feeds, device in zip(data, arrays):
        for _ in range(2):  # eager, then captured (and replayed by the next feeds at these addresses)
            (expected,) = reference(**feeds)
            assert_close(program(**device)[0], expected, "float32")
    assert program.device_bytes == held  # no feed block: nothing staged
    assert len(program._executor.graphs) == len(data)


def test_a_replayed_step_runs_after_the_work_its_callers_stream_queued_before_it():
    """A replay is launched on the caller's stream: a feed that stream writes just before the call (behind a slow
    product) is read as written, and the output read on that stream after the call is the step's."""
    import cupy

    n = 4096
    x = ct.var("x", (n,))
    program = ct.compile(ct.sum(x), inputs=[x], backend="cupy")
    feed = cupy.zeros(n, cupy.float32)
    program(x=feed), program(x=feed)  # eager, then captured: the next calls replay
    ones = cupy.ones((4096, 4096), cupy.float32)
    stream, sums = cupy.cuda.Stream(non_blocking=True), []
    with stream:
        for value in (1.0, 2.0, 3.0):
            feed[...] = (ones @ ones)[0] * (value / n)  # some milliseconds of work before the feed is written
            sums.append(program(x=feed).copy())
    stream.synchronize()
    assert [float(host(s)) for s in sums] == [n * 1.0, n * 2.0, n * 3.0]


def test_a_step_called_from_another_stream_waits_for_the_last_step():
    """Steps share the arena and the state, so one called from another stream than the last waits for it: the last
    step is held on its stream (``holding.Hold``) while the next is called from a second, idle one, which must not
    run until the hold is let go. Replay after replay (two fed arrays, two graphs: launches of one graph are ordered
    anyway), replay before and after a step staging a NumPy feed on the program's own stream, and a state write
    before a replay; every update then builds on the one before, as the CPU's steps do."""
    import time

    import cupy

    from cortado.backends.cupy.runtime.holding import Hold

    rng = np.random.default_rng(0)
    w, x = ct.var("w", (256, 256)), ct.var("x", (256,))
    chain = w
    for _ in range(4):
        chain = ct.tanh(chain @ w + x)
    state = {w: (rng.standard_normal((256, 256)) / 16).astype(np.float32)}
    gpu = ct.compile([ct.sum(w)], inputs=[x], state=state, updates={w: 0.5 * w + chain}, backend="cupy")
    cpu = ct.compile([ct.sum(w)], inputs=[x], state=state, updates={w: 0.5 * w + chain}, backend="numpy")
    feeds = [rng.standard_normal(256).astype(np.float32) for _ in range(3)]
    on_gpu = {0: cupy.asarray(feeds[0]), 1: cupy.asarray(feeds[1]), 2: feeds[2]}  # 2: a NumPy feed, staged

    def call(program, k, fed):
        """Step ``k`` of ``program``: a call on feed ``fed[k]``, or halving its state."""
        if k == "halve":
            program.state["w"] = program.state["w"] * 0.5
        else:
            program(x=fed[k])

    for k in (0, 1, 0, 2, 2, "halve"):  # every graph captured, every kernel's module loaded before any hold
        call(gpu, k, on_gpu)
        call(cpu, k, feeds)
    held, free = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    hold = Hold(held)
    for first, then in ((0, 1), (1, 2), (2, 0), ("halve", 1)):
        cupy.cuda.Device().synchronize()
        hold.hold()
        with held:
            call(gpu, first, on_gpu)
        with free:
            call(gpu, then, on_gpu)
        time.sleep(0.05)
        waited = not free.done
        hold.release()
        assert waited, f"a call after {first!r} from another stream ran before it"
        for k in (first, then):
            call(cpu, k, feeds)
    cupy.cuda.Device().synchronize()
    np.testing.assert_allclose(host(gpu.state["w"]), cpu.state["w"], rtol=1e-4, atol=1e-5)


def test_feeds_that_cannot_be_read_in_place_are_staged():
    import cupy

    from cortado.backends.cupy.runtime.feeds import ADDRESS_SETS

    x = ct.var("x", (64, 32))
    out = ct.tanh(x) * 2.0
    program = ct.compile(out, inputs=[x], backend="cupy")
    rng = np.random.default_rng(9)
    value = rng.standard_normal((32, 64)).astype(np.float32)
    strided = cupy.asarray(value).T  # not contiguous: copied into the feed block
    assert_close(program(x=strided), ct.evaluate(out, {"x": value.T}, precision="float64"))
    flat = rng.standard_normal(64 * 32 + 1).astype(np.float32)
    shifted = cupy.asarray(flat)[1:].reshape(64, 32)  # contiguous, 4 bytes past an alignment: copied too
    assert_close(program(x=shifted), ct.evaluate(out, {"x": flat[1:].reshape(64, 32)}, precision="float64"))
    fed_back = program(x=rng.standard_normal((64, 32)).astype(np.float32))
    expected = ct.evaluate(out, {"x": host(fed_back)}, precision="float64")
    for _ in range(2):  # the program's own output as its input: staged, else written while it is read
        assert_close(program(x=fed_back), expected)
        expected = ct.evaluate(out, {"x": host(expected.astype(np.float32))}, precision="float64")
    kept = []  # every array held, so that each call sees a new address
    for _ in range(ADDRESS_SETS + 3):  # past ADDRESS_SETS sets of addresses, feeds are staged
        value = rng.standard_normal((64, 32)).astype(np.float32)
        kept.append(cupy.asarray(value))
        assert_close(program(x=kept[-1]), ct.evaluate(out, {"x": value}, precision="float64"))
    assert sum(any(kind == "in place" for kind, _ in key) for key in program._executor.prepared) <= ADDRESS_SETS


def test_arithmetic_on_bools_in_a_kernel_is_numpys():
    """True + True is True (NumPy's ``or``) and True / False infinity, as the CPU's C regions were found not to
    compute them: each kernel holds a bool in C++'s ``bool``, and a division's operands are converted first."""
    from test_native import bool_arithmetic

    outputs, inputs, feeds, expected = bool_arithmetic()
    program = ct.compile(outputs, inputs=inputs, backend="cupy")
    for ours, want in zip(program(**feeds), expected):
        np.testing.assert_array_equal(host(ours), want)
