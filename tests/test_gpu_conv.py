"""Convolutions and pooling on an NVIDIA GPU (cuDNN, the window kernels), against the reference interpreter.
Skipped where no GPU is visible; run on the device machine by ``benchmarks/run_gpu.sh``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from cortado.testing import graphs_with_feeds
from test_gpu import FLOATS, _least_precise, assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]

WINDOW_OPS = ["conv", "windows", "overlap_add", "pad", "flip", "add", "multiply", "relu", "max", "sum"]


def _convolutions(program):
    """The cuDNN convolution calls of ``program``, as its executor tuned them."""
    from cortado.backends.cupy.calls import cudnn_conv

    return [made.library for made, _ in program._executor.tuned if isinstance(made.library, cudnn_conv.Conv)]


def _modes(program):
    return sorted(k.term.attr("mode") for k in program.kernels if k.term.op.name == "dnn_conv")


@settings(max_examples=60, deadline=None)
@given(graphs_with_feeds(ops=WINDOW_OPS, dtypes=tuple(FLOATS), max_rank=4), st.booleans())
def test_random_window_graphs_on_the_gpu_match_the_reference(case, cuda_graph):
    graph, feeds = case
    program = ct.compile(list(graph.outputs), inputs=graph.inputs, backend="cupy", cuda_graph=cuda_graph)
    expected = ct.evaluate(graph.outputs, feeds, precision="float64")
    for _ in range(2):
        for ours, theirs, out in zip(program(**feeds), expected, graph.outputs):
            assert_close(ours, theirs, _least_precise(out))


GEOMETRIES = [  # (x shape, w shape, conv2d keywords)
    ((4, 8, 12, 12), (16, 8, 3, 3), dict(padding=1)),
    ((2, 6, 11, 9), (4, 6, 3, 2), dict(stride=2, padding=(1, 0))),
    ((2, 8, 10, 10), (8, 2, 3, 3), dict(padding="same", groups=4)),
    ((3, 4, 13, 13), (6, 4, 3, 3), dict(stride=(2, 3), dilation=2, padding=2)),
    ((2, 16, 7, 7), (32, 16, 1, 1), {}),
    ((2, 16, 8, 8), (32, 16, 1, 1), dict(stride=2)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("x_shape, w_shape, options", GEOMETRIES)
def test_conv2d_and_its_gradients_run_as_cudnn_calls(x_shape, w_shape, options, dtype):
    x, w = ct.var("x", x_shape, dtype), ct.var("w", w_shape, dtype)
    b = ct.var("b", (w_shape[0],), dtype)
    y = ct.relu(ct.conv2d(x, w, **options) + ct.reshape(b, (-1, 1, 1)))
    loss = ct.sum(y * y)
    outputs = [y] + ct.grad(loss, [x, w, b])
    program = ct.compile(outputs, inputs=[x, w, b], backend="cupy")
    names = {k.term.op.name for k in program.kernels}
    assert "conv" not in names and "dnn_conv" in names, program.explain()
    rng = np.random.default_rng(0)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(dtype) for v in (x, w, b)}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    scale = [max(1.0, float(np.abs(e).max())) for e in expected]
    for ours, theirs, s in zip(program(**feeds), expected, scale):
        assert_close(np.asarray(ours.get(), np.float64) / s, theirs / s, dtype)
    assert "cuDNN" in program.explain()


def test_each_gradient_is_the_cudnn_call_made_for_it():
    x, w = ct.var("x", (8, 16, 14, 14)), ct.var("w", (32, 16, 3, 3))
    y = ct.conv2d(x, w, stride=2, padding=1)
    program = ct.compile(ct.grad(ct.sum(y * y), [x, w]), inputs=[x, w], backend="cupy")
    assert _modes(program) == ["dgrad", "fprop", "wgrad"], program.explain()
    assert not any(k.term.op.name in ("flip", "pad", "transpose") for k in program.kernels), program.explain()


@pytest.mark.parametrize("deterministic", [True, False])
def test_every_cudnn_plan_computes_the_same_convolution(deterministic):

    x, w = ct.var("x", (4, 8, 10, 10)), ct.var("w", (12, 8, 3, 3))
    y = ct.conv2d(x, w, stride=2, padding=1)
    outputs = [y] + ct.grad(ct.sum(y * y), [x, w])
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal(x.shape).astype(np.float32), "w": rng.standard_normal(w.shape).astype(np.float32)}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    program = ct.compile(outputs, inputs=[x, w], backend="cupy", cuda_graph=False, deterministic=deterministic)
    runners = _convolutions(program)
    assert {r.mode for r in runners} == {"fprop", "dgrad", "wgrad"}
    tried = 0
    for runner in runners:
        chosen = runner.choice
        for plan in runner.plans:
            runner.choice = plan
            for ours, theirs in zip(program(**feeds), expected):
                try:
                    assert_close(ours, theirs, "float32")
                except AssertionError as error:
                    raise AssertionError(f"{runner.describe()}: {error}") from None
            tried += 1
        runner.choice = chosen
    assert tried > len(runners)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_pooling_and_its_gradients_on_the_gpu(dtype):
    x = ct.var("x", (4, 3, 9, 10), dtype)
    pooled = [ct.max_pool2d(x, 3, stride=2, padding=1), ct.avg_pool2d(x, 2), ct.avg_pool2d(x, 3, 1, 1)]
    loss = sum(ct.sum(p * p) for p in pooled)
    outputs = pooled + ct.grad(loss, [x])
    rng = np.random.default_rng(2)
    feeds = {"x": rng.permutation(x.size).reshape(x.shape).astype(dtype) / x.size}  # no ties for max
    program = ct.compile(outputs, inputs=[x], backend="cupy")
    for ours, theirs in zip(program(**feeds), ct.evaluate(outputs, feeds, precision="float64")):
        assert_close(ours, theirs, dtype)


def test_a_cnn_training_step_on_the_gpu_follows_the_cpu_program():
    rng = np.random.default_rng(3)
    x, labels = ct.var("x", (8, 3, 16, 16)), ct.var("labels", (8, 10))
    w1, w2, head = ct.var("w1", (8, 3, 3, 3)), ct.var("w2", (16, 8, 3, 3)), ct.var("head", (16, 10))
    h = ct.max_pool2d(ct.relu(ct.conv2d(x, w1, padding=1)), 2)
    h = ct.mean(ct.relu(ct.conv2d(h, w2, padding=1, stride=2)), axis=(2, 3))
    logits = h @ head
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * labels, axis=1))
    parameters = [w1, w2, head]
    state = {p: (rng.standard_normal(p.shape) * 0.3).astype(np.float32) for p in parameters}
    updates = {p: p - 0.1 * g for p, g in zip(parameters, ct.grad(loss, parameters))}
    programs = [ct.compile([loss], inputs=[x, labels], state=state, updates=updates, backend=backend)
                for backend in ("cupy", "numpy")]
    for _ in range(3):
        feeds = {"x": rng.standard_normal(x.shape).astype(np.float32),
                 "labels": np.eye(10, dtype=np.float32)[rng.integers(0, 10, 8)]}
        ours, expected = (program(**feeds)[0] for program in programs)
        assert_close(ours, np.asarray(expected), "float32")
    for p in parameters:
        assert_close(programs[0].state[p.name], np.asarray(programs[1].state[p.name]), "float32")


@pytest.mark.parametrize("nhwc", [False, True])  # one GEMM per image (NCHW), or one over every pixel (NHWC)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_1x1_convolution_runs_as_a_gemm_candidate_too(dtype, nhwc):
    from cortado.backends.cupy.calls import cudnn_conv

    x, w = ct.var("x", (3, 16, 7, 5), dtype), ct.var("w", (24, 16, 1, 1), dtype)
    y = ct.conv2d(x, w)
    outputs = [y] + ct.grad(ct.sum(y * y), [x])
    rng = np.random.default_rng(4)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in (x, w)}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    program = ct.compile(outputs, inputs=[x, w], backend="cupy", cuda_graph=False, nhwc=nhwc)
    runners = _convolutions(program)
    assert sorted(r.mode for r in runners if r.gemm is not None) == ["dgrad", "fprop"]
    assert {r.image_first for r in runners if r.gemm is not None} == {nhwc}
    assert "GEMM" in program.explain() and " us" in program.explain()
    for runner in runners:
        runner.choice = cudnn_conv.GEMM if runner.gemm is not None else runner.choice
    for ours, theirs in zip(program(**feeds), expected):
        assert_close(ours, theirs, dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_chain_of_convolutions_stays_channels_last_from_one_to_the_next(dtype):
    from cortado.backends.cupy.codegen import channels_last_strides

    x = ct.var("x", (4, 8, 10, 10), dtype)
    ws = [ct.var(f"w{i}", (8, 8, 3, 3), dtype) for i in range(3)]
    bs = [ct.var(f"b{i}", (8,), dtype) for i in range(3)]
    h = x
    for w, b in zip(ws, bs):
        h = ct.relu(ct.conv2d(h, w, padding=1) + ct.reshape(b, (-1, 1, 1))) + h  # a residual block
    loss = ct.sum(h * h)
    outputs = [h, loss] + ct.grad(loss, ws)
    rng = np.random.default_rng(5)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.3).astype(dtype) for v in [x] + ws + bs}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    for nhwc in (True, False, "auto"):  # auto: channels last for the dtypes cuDNN runs on tensor cores
        program = ct.compile(outputs, inputs=[x] + ws + bs, backend="cupy", nhwc=nhwc)
        assert "transpose" not in [k.term.op.name for k in program.kernels], program.explain()
        convolutions = [k.term for k in program.kernels if k.term.op.name == "dnn_conv" and k.term.attr("mode") == "fprop"]
        layouts = program._executor.strides
        last = [layouts[t] == channels_last_strides(t.shape) for t in convolutions]
        expected_last = nhwc is True or (nhwc == "auto" and dtype == "float16")
        assert last == [expected_last] * 3
        assert (f"{dtype}[4,8,10,10] channels-last @" in program.explain()) == expected_last
        for ours, theirs in zip(program(**feeds), expected):
            scale = max(1.0, float(np.abs(theirs).max()))
            assert_close(np.asarray(ours.get(), np.float64) / scale, theirs / scale, dtype)
    lone = ct.compile([ct.conv2d(x, ws[0], padding=1)], inputs=[x, ws[0]], backend="cupy")  # auto: no chain to keep
    assert "channels-last" not in lone.explain()


IM2COL_GEOMETRIES = [  # x shape, w shape, ct.conv keywords
    ((3, 5, 9, 8), (6, 5, 3, 3), dict(strides=(2, 2), padding=((1, 1), (1, 1)))),
    ((2, 4, 10, 7), (3, 4, 3, 2), dict(padding=((2, 2), (0, 1)), rhs_dilation=(2, 1))),
    ((4, 3, 6, 6), (8, 3, 1, 1), dict(strides=(1, 2))),
    ((2, 3, 11), (4, 3, 3), dict(strides=(2,), padding=((1, 0),))),  # one spatial axis
]


@pytest.mark.parametrize("one_image_at_a_time", [False, True])
@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("x_shape, w_shape, options", IM2COL_GEOMETRIES)
def test_im2col_and_gemms_compute_the_convolution_and_its_weight_gradient(x_shape, w_shape, options, dtype, nhwc,
                                                                          one_image_at_a_time, monkeypatch):
    from cortado.backends.cupy.calls import conv_im2col, cudnn_conv

    if one_image_at_a_time:  # the weight gradient added image by image
        monkeypatch.setattr(conv_im2col, "_chunk", lambda batch, per_image_bytes: 1)
    x, w = ct.var("x", x_shape, dtype), ct.var("w", w_shape, dtype)
    y = ct.conv(ct.relu(x), w, **options)  # relu: the image is computed, so nhwc=True stores it channels last
    outputs = [y] + ct.grad(ct.sum(y * y), [w])
    rng = np.random.default_rng(7)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(dtype) for v in (x, w)}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    program = ct.compile(outputs, inputs=[x, w], backend="cupy", nhwc=nhwc)
    runners = _convolutions(program)
    windowed = [r for r in runners if r.windows is not None]
    if dtype in ("float16", "bfloat16"):  # cuDNN's tensor-core kernels: im2col is not a candidate
        assert not windowed and "im2col" not in program.explain()
        return
    assert {r.mode for r in windowed} == {"fprop", "wgrad"}, [r.describe() for r in runners]
    assert "im2col and GEMMs" in program.explain()
    for runner in windowed:
        runner.choice = cudnn_conv.WINDOWS
    scale = [max(1.0, float(np.abs(e).max())) for e in expected]
    for ours, theirs, s in zip(program(**feeds), expected, scale):
        assert_close(np.asarray(ours.get(), np.float64) / s, theirs / s, dtype)
    assert all(r.describe().startswith("im2col") for r in windowed)


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_residual_blocks_epilogues_run_fused_by_cudnn_or_after_the_convolution(dtype, nhwc):
    from cortado.backends.cupy.calls import cudnn_conv

    x, b = ct.var("x", (4, 8, 10, 10), dtype), ct.var("b", (8,), dtype)
    w, w2, b2 = ct.var("w", (8, 8, 3, 3), dtype), ct.var("w2", (8, 8, 3, 3), dtype), ct.var("b2", (8,), dtype)
    h = ct.relu(ct.conv2d(x, w, padding=1) + ct.reshape(b, (-1, 1, 1)))
    y = ct.relu(ct.conv2d(h, w2, padding=1) + ct.reshape(b2, (-1, 1, 1)) + h)
    variables = [x, w, b, w2, b2]
    outputs = [y] + ct.grad(ct.sum(y * y), variables[1:])
    rng = np.random.default_rng(3)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.3).astype(dtype) for v in variables}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    scale = [max(1.0, float(np.abs(e).max())) for e in expected]
    program = ct.compile(outputs, inputs=variables, backend="cupy", cuda_graph=False, nhwc=nhwc)
    runners = [r for r in _convolutions(program) if r.epilogue != "none"]
    assert sorted(r.epilogue for r in runners) == ["bias_add_relu", "bias_relu"], program.explain()
    assert "fused" in program.explain() or "generated kernel for its" in program.explain()
    for runner in runners:
        chosen = runner.choice
        assert runner.choice not in runner.dropped
        for choice in [p for p in runner.plans if p not in runner.dropped][:3] + [cudnn_conv.UNFUSED]:
            runner.choice = choice
            for ours, theirs, s in zip(program(**feeds), expected, scale):
                try:
                    assert_close(np.asarray(ours.get(), np.float64) / s, theirs / s, dtype)
                except AssertionError as error:
                    raise AssertionError(f"{runner.describe()}: {error}") from None
        runner.choice = chosen


SPLIT_GEOMETRIES = IM2COL_GEOMETRIES + [  # and groups, a wide kernel, a tile cut short by the image's edge
    ((2, 8, 10, 10), (8, 2, 3, 3), dict(padding=((1, 1), (1, 1)), groups=4)),
    ((2, 5, 40, 70), (7, 5, 5, 5), dict(padding=((2, 2), (2, 2)))),
    ((3, 6, 37, 9), (4, 6, 3, 3), dict(strides=(3, 1), padding=((0, 2), (1, 1)), rhs_dilation=(1, 2))),
]


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape, w_shape, options", SPLIT_GEOMETRIES)
def test_our_weight_gradient_kernel_computes_it_the_same_bits_every_run(x_shape, w_shape, options, dtype, nhwc):
    from cortado.backends.cupy.calls import cudnn_conv

    x, w = ct.var("x", x_shape, dtype), ct.var("w", w_shape, dtype)
    y = ct.conv(ct.relu(x), w, **options)  # relu: the image is computed, so nhwc=True stores it channels last
    outputs = ct.grad(ct.sum(y * y), [w])
    rng = np.random.default_rng(11)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(dtype) for v in (x, w)}
    expected = ct.evaluate(outputs, feeds, precision="float64")[0]
    program = ct.compile(outputs, inputs=[x, w], backend="cupy", nhwc=nhwc)
    runners = [r for r in _convolutions(program) if r.mode == "wgrad"]
    if w_shape[2:] == (1, 1):  # a plain GEMM: not a candidate
        assert all(r.split is None for r in runners)
        return
    assert runners and all(r.split is not None for r in runners), [r.describe() for r in runners]
    assert "partial sums added in order" in program.explain()
    for runner in runners:
        runner.choice = cudnn_conv.SPLIT
    first, second = (np.asarray(program(**feeds)[0].get(), np.float64) for _ in range(2))
    scale = max(1.0, float(np.abs(expected).max()))
    assert_close(first / scale, expected / scale, dtype)
    assert np.array_equal(first, second)
    assert all(r.describe().startswith("our weight-gradient kernel") for r in runners)


@pytest.mark.parametrize("channels_last_io", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_1x1_weight_gradient_is_a_gemm_over_the_pixels_or_per_image_added_in_order(dtype, channels_last_io):
    from cortado.backends.cupy.calls import conv_wgrad, cudnn_conv

    x, w = ct.var("x", (5, 6, 7, 9), dtype), ct.var("w", (4, 6, 1, 1), dtype)
    y = ct.conv2d(x, w)
    outputs = ct.grad(ct.sum(y * y), [w])
    rng = np.random.default_rng(12)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in (x, w)}
    expected = ct.evaluate(outputs, feeds, precision="float64")[0]
    program = ct.compile(outputs, inputs=[x, w], backend="cupy", channels_last_io=channels_last_io)
    (runner,) = [r for r in _convolutions(program) if r.mode == "wgrad"]
    kind = conv_wgrad.PixelGemm if channels_last_io else conv_wgrad.ImageGemms
    assert isinstance(runner.split, kind), runner.describe()
    runner.choice = cudnn_conv.SPLIT
    first, second = (np.asarray(program(**feeds)[0].get(), np.float64) for _ in range(2))
    scale = max(1.0, float(np.abs(expected).max()))
    assert_close(first / scale, expected / scale, dtype)
    assert np.array_equal(first, second)
    assert runner.describe().startswith("one cuBLASLt GEMM over every pixel" if channels_last_io else
                                        "one batched cuBLASLt GEMM per image")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_weight_gradients_are_left_to_cudnn(dtype):

    x, w = ct.var("x", (2, 4, 8, 8), dtype), ct.var("w", (4, 4, 3, 3), dtype)
    y = ct.conv2d(x, w, padding=1)
    program = ct.compile(ct.grad(ct.sum(y * y), [w]), inputs=[x, w], backend="cupy")
    runners = _convolutions(program)
    assert "wgrad" in {r.mode for r in runners} and all(r.split is None for r in runners)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_channels_last_feeds_are_read_in_place_and_results_returned_channels_last(dtype):
    import cupy

    x, w, dy = ct.var("x", (4, 8, 10, 10), dtype), ct.var("w", (16, 8, 3, 3), dtype), ct.var("dy", (4, 16, 10, 10), dtype)
    y = ct.conv2d(x, w, padding=1)
    outputs = [y] + ct.grad(ct.sum(y * dy), [x, w])
    program = ct.compile(outputs, inputs=[x, w, dy], backend="cupy", channels_last_io=True)
    assert f"{dtype}[4,8,10,10] channels-last" in program.explain()
    rng = np.random.default_rng(13)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(dtype) for v in (x, w, dy)}
    expected = ct.evaluate(outputs, feeds, precision="float64")

    def channels_last(a):  # an NCHW shape over NHWC memory, as torch's channels_last tensors
        return cupy.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)

    in_place = {name: channels_last(a) for name, a in feeds.items()}
    staged = {name: cupy.asarray(a) for name, a in feeds.items()}
    assert all(kind == "in place" for kind, _ in program._executor._sources(in_place))
    assert not any(kind == "in place" for kind, _ in program._executor._sources(staged))
    for fed in (feeds, in_place, staged, in_place):
        results = program(**fed)
        for ours, theirs in zip(results, expected):
            assert ours.strides == channels_last(np.zeros(ours.shape, dtype)).strides
            scale = max(1.0, float(np.abs(theirs).max()))
            assert_close(np.asarray(ours.get(), np.float64) / scale, theirs / scale, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_channels_last_convolution_may_run_in_nchw_between_copies(dtype):
    import cupy

    from cortado.backends.cupy.calls import cudnn_conv

    x, w, dy = ct.var("x", (3, 5, 9, 8), dtype), ct.var("w", (6, 5, 3, 3), dtype), ct.var("dy", (3, 6, 5, 4), dtype)
    y = ct.conv2d(x, w, stride=2, padding=1)
    outputs = [y] + ct.grad(ct.sum(y * dy), [x, w])
    program = ct.compile(outputs, inputs=[x, w, dy], backend="cupy", channels_last_io=True)
    runners = [r for r in _convolutions(program) if r.nchw is not None]
    assert sorted(r.mode for r in runners) == ["dgrad", "fprop", "wgrad"], program.explain()
    for runner in runners:
        runner.choice = cudnn_conv.NCHW
    rng = np.random.default_rng(14)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(dtype) for v in (x, w, dy)}
    expected = ct.evaluate(outputs, feeds, precision="float64")
    fed = {name: cupy.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
           for name, a in feeds.items()}
    for ours, theirs in zip(program(**fed), expected):
        scale = max(1.0, float(np.abs(theirs).max()))
        assert_close(np.asarray(ours.get(), np.float64) / scale, theirs / scale, dtype)
    assert all("in NCHW between copies" in r.describe() for r in runners)


def test_every_convolution_runs_the_algorithms_the_first_one_chose_at_every_level(monkeypatch, fresh_choices):
    """A convolution's choice and the cuBLASLt algorithm of the GEMM inside it are timed by the first call of their
    shapes in a process and remembered: a second convolution of the same shapes, in the same program or another,
    runs both (each level's tuning taking its remembered choice), so every program adds its sums in one order. The
    timing is forced here (im2col and GEMMs, and the GEMM's last algorithm); a remembered convolution once left its
    GEMM at the heuristic's first algorithm, and two builds of the CNN step gave other bits. A program compiled with
    ``autotune=False`` after them runs the first choice at every level."""
    from cortado.backends.cupy.calls import cublaslt, cudnn_conv

    conv_time, gemm_time = cudnn_conv.Conv._time, cublaslt.Gemm._time

    def im2col_first(self, choice, pointers, stream):
        took = conv_time(self, choice, pointers, stream)
        return took if np.isinf(took) or choice != cudnn_conv.WINDOWS else took * 1e-3

    def last_algorithm_first(self, k, pointers, stream):
        took = gemm_time(self, k, pointers, stream)
        return took if np.isinf(took) else 1.0 / (1 + k)

    monkeypatch.setattr(cudnn_conv.Conv, "_time", im2col_first)
    monkeypatch.setattr(cublaslt.Gemm, "_time", last_algorithm_first)
    x_shape, w_shape, options = IM2COL_GEOMETRIES[0]
    x, w, w2 = ct.var("x", x_shape), ct.var("w", w_shape), ct.var("w2", w_shape)
    y, y2 = ct.conv(ct.relu(x), w, **options), ct.conv(ct.relu(2.0 * x), w2, **options)  # two of the same shapes
    outputs = [y, y2] + ct.grad(ct.sum(y * y) + ct.sum(y2 * y2), [w, w2])
    programs = [ct.compile(outputs, inputs=[x, w, w2], backend="cupy") for _ in range(2)]

    def levels(conv):
        gemm = conv.others[conv.choice].gemm
        return conv.choice, gemm.candidates[gemm.choice].tobytes()

    off_the_first = []
    for mode in ("fprop", "wgrad"):
        convs = [c for p in programs for c in _convolutions(p) if c.mode == mode]
        assert len(convs) == 4 and {c.choice for c in convs} == {cudnn_conv.WINDOWS}, [c.describe() for c in convs]
        assert len({levels(c) for c in convs}) == 1, mode
        gemm = convs[0].others[cudnn_conv.WINDOWS].gemm
        off_the_first.append(levels(convs[0])[1] != cublaslt._heuristics[gemm.key][0].tobytes())
    assert any(off_the_first)  # the heuristic offered another algorithm, which the first convolution kept
    rng = np.random.default_rng(3)
    feeds = {v.name: (rng.standard_normal(v.shape) * 0.5).astype(np.float32) for v in (x, w, w2)}
    first, second = ([r.get() for r in p(**feeds)] for p in programs)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    # untuned after them, a program runs the first choice at every level, whatever the process remembers
    untuned = ct.compile(outputs, inputs=[x, w, w2], backend="cupy", autotune=False)
    convs = _convolutions(untuned)
    assert len(convs) == 4
    for conv in convs:
        assert conv.times is None and conv.choice == (conv.plans[0] if conv.plans else next(iter(conv.others)))
        gemms = [runner.gemm for runner in conv.others.values() if getattr(runner, "gemm", None) is not None]
        assert all(g.choice == 0 and g.candidates is cublaslt._heuristics[g.key] for g in gemms), conv.describe()
    third = [r.get() for r in untuned(**feeds)]
    rtol = 1e-4
    assert all(np.allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(b).max())) for a, b in zip(third, first))
