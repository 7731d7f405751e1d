"""int8 products on an NVIDIA GPU: every kernel configuration exact against NumPy's integer product, and
quantized programs equal to the CPU's bit for bit. Skipped where no GPU is visible; run on the device
machine by ``benchmarks/run_gpu.sh``."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from test_quantization import quantization_cases

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]

RANGES = {"int8": (-128, 128), "uint8": (0, 256)}


def _ints(rng, shape, dtype):
    low, high = RANGES[dtype]
    return rng.integers(low, high, shape).astype(dtype)


def _int8_kernels(program):
    return [k.term for k in program.kernels if k.term.op.name == "int8_gemm"]


def _shape(draw, largest=200):
    return draw(st.integers(1, largest)), draw(st.integers(1, largest)), draw(st.integers(1, 300))


@st.composite
def configurations(draw):
    """A product, the layouts of its operands, and an mma.sync tiling, any of which the candidates could be."""
    from cortado.backends.cupy.calls.int8.product import Tiling
    from cortado.backends.cupy.calls.int8.tilings import BLOCK_SHAPES

    m, n, k = _shape(draw)
    bm, bn, warps_m, warps_n = draw(st.sampled_from(BLOCK_SHAPES[:-3]))
    bk = draw(st.sampled_from([32, 64, 128, 256]))
    k_tiles = math.ceil(k / bk)
    splits = draw(st.integers(1, min(k_tiles, 8)))
    splits = math.ceil(k_tiles / math.ceil(k_tiles / splits))
    stages = draw(st.integers(2, 5))
    while stages > 2 and stages * (bm + bn) * (bk + 16) > 200 << 10:
        stages -= 1
    tiling = Tiling(bm, bn, bk, warps_m, warps_n, stages, splits)
    dtypes = draw(st.sampled_from(["int8", "uint8"])), draw(st.sampled_from(["int8", "uint8"]))
    a_layout = draw(st.sampled_from(["rows", "padded rows", "columns"]))
    b_layout = draw(st.sampled_from(["rows", "k contiguous"]))
    constants = draw(st.booleans()), draw(st.booleans())
    return (m, n, k), tiling, dtypes, a_layout, b_layout, constants, draw(st.integers(0, 2 ** 31))


@st.composite
def warpgroup_configurations(draw, instruction="wgmma"):
    """A product whose operands are both read 16 bytes at a time, and a wgmma tiling (fed by ``cp.async``, or by
    the tensor memory accelerator for ``instruction`` ``tma``)."""
    from cortado.backends.cupy.calls.int8.product import warpgroup_tiling
    from cortado.backends.cupy.calls.int8.tilings import WARPGROUP_SHAPES

    bm, bn = draw(st.sampled_from(WARPGROUP_SHAPES))
    bk = draw(st.sampled_from([32, 64, 128]))
    fewest = 3 if instruction == "wgmma" else 2
    stages = draw(st.integers(fewest, 6))
    while stages > fewest and stages * (bm + bn) * bk > 200 << 10:
        stages -= 1
    m, n, k = _shape(draw, 320 if instruction == "tma" else 200)  # a tile of 256 wholly inside the result
    k_tiles = math.ceil(k / bk)
    splits = draw(st.integers(1, min(k_tiles, 4)))
    splits = math.ceil(k_tiles / math.ceil(k_tiles / splits))
    dtypes = draw(st.sampled_from(["int8", "uint8"])), draw(st.sampled_from(["int8", "uint8"]))
    # results stored by the TMA, whose rows must be whole 16-byte chunks (``_check_kernel`` gives the tiling its
    # results' size, 1 a placeholder, and stores them thread by thread where they are not); a persistent grid of a
    # few blocks, each taking many output tiles in turn; clusters of two blocks sharing A
    stored = int(instruction == "tma" and splits == 1 and draw(st.booleans()))
    n = -(-n // 4) * 4 if stored else n
    lines = instruction == "tma" and not stored and draw(st.booleans())  # each warp's results in whole lines
    blocks = draw(st.sampled_from([0, 1, 2, 6])) if instruction == "tma" and splits == 1 else 0
    cluster = 2 if instruction == "tma" and splits == 1 and math.ceil(n / bn) % 2 == 0 and draw(st.booleans()) else 1
    blocks = blocks // cluster * cluster
    return ((m, n, k), warpgroup_tiling(bm, bn, bk, stages, splits, instruction, blocks, cluster, stored, lines),
            dtypes,
            "padded rows", "k contiguous",
            (draw(st.booleans()), draw(st.booleans())), draw(st.integers(0, 2 ** 31)))


def _placed(cupy, x, strides):
    """``x`` in a device buffer at element ``strides`` (the rest filled with 77, which a wrong read would sum)."""
    size = 1 + sum((d - 1) * s for d, s in zip(x.shape, strides)) + 64
    host = np.full(size, 77, x.dtype)
    host[np.add.outer(np.arange(x.shape[0]) * strides[0], np.arange(x.shape[1]) * strides[1])] = x
    return cupy.asarray(host)


# the epilogues drawn: the int32 sums, a requantization to int8, a rescaling with a bias to float32 or float16
EPILOGUES = st.sampled_from(["sums", "requantized", "float32", "float16"])


def _check_kernel(configuration, epilogue, shifted=False):
    """Run the kernel of ``configuration`` (twice: the second call finds the split counters the first left) and
    compare it with NumPy's int32 product, or with ``epilogue``'s float32 formula, bit for bit. An operand drawn
    constant is read before the kernel waits for the grid before it. Where the TMA or whole lines store the results,
    they lie in a larger buffer (16 bytes more a row, more rows after), the rest of which must stay as it was; with
    ``shifted`` whole lines find the result 8 bytes past a 16-byte boundary, and leave it to each thread's stores."""
    import cupy

    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.kernels import launcher
    from cortado.backends.cupy.calls.int8.product import Product, counters, partial_bytes, vector_readable
    from cortado.backends.cupy.calls.int8.source import gemm_source
    from cortado.backends.cupy.calls.int8.specialised import tensor_maps
    from cortado.backends.cupy.calls.int8.tilings import SHARED_LIMIT
    from cortado.backends.cupy.calls.int8.warpgroup import line_storable
    from cortado.exprgraph.ops import parameter

    (m, n, k), tiling, (a_dtype, b_dtype), a_layout, b_layout, constants, seed = configuration
    rng = np.random.default_rng(seed)
    a, b = _ints(rng, (m, k), a_dtype), _ints(rng, (k, n), b_dtype)
    pitch = -(-k // 16) * 16
    a_strides = {"rows": (k, 1), "padded rows": (pitch + 16, 1), "columns": (1, m)}[a_layout]
    b_strides = {"rows": (n, 1), "k contiguous": (1, pitch)}[b_layout]
    product = Product(m, n, k, a_strides, b_strides, np.dtype(a_dtype), np.dtype(b_dtype),
                      vector_readable(a_strides), vector_readable(b_strides[::-1]), *constants)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    exact = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    extras, arrays = [], []
    body, expected = sums, exact
    if epilogue != "sums":
        scale, bias = (rng.random(n) * 1e-3 + 1e-5).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        extras = [Operand((n,), np.dtype(np.float32), (1,))] * 2
        arrays = [cupy.asarray(scale), cupy.asarray(bias)]
        y = ct.cast(sums, "float32") * parameter(1, extras[0]) + parameter(2, extras[1])
        rescaled = exact.astype(np.float32) * scale + bias
        body, expected = (y, rescaled) if epilogue == "float32" else (ct.cast(y, "float16"), rescaled.astype(np.float16))
    if epilogue == "requantized":
        body = ct.cast(ct.minimum(ct.maximum(ct.rint(ct.relu(y) * np.float32(1 / 0.05)) - 7.0, -128.0), 127.0), "int8")
        levels = np.rint(np.maximum(rescaled, np.float32(0)) * np.float32(1 / 0.05))
        expected = np.clip(levels - np.float32(7), -128, 127).astype(np.int8)
    row = n
    size = expected.dtype.itemsize
    if tiling.stored and n * size % 16 == 0:  # with as many of its stages as fit beside its tile of results
        tiling = replace(tiling, stored=size)
        while tiling.shared_bytes > SHARED_LIMIT and tiling.stages > 2:
            tiling = replace(tiling, stages=tiling.stages - 1)
        row = n + 16 // size  # 16 bytes more
    else:
        tiling = replace(tiling, stored=0)
    if tiling.lines and line_storable(size, (-(-n * size // 16) * 16 // size, 1), tiling.bn):
        row = -(-n * size // 16) * 16 // size + 16 // size  # rows 16-byte aligned, 16 bytes more
        while tiling.shared_bytes > SHARED_LIMIT and tiling.stages > 2:  # the warps' lines beside the stages
            tiling = replace(tiling, stages=tiling.stages - 1)
    else:
        tiling = replace(tiling, lines=False)
    source = gemm_source(product, tiling, body, extras, (row, 1))
    shift = 8 // size if shifted and tiling.lines else 0
    out = cupy.full((m + 3) * row + shift, 99, expected.dtype)[shift:].reshape(m + 3, row)
    partials = cupy.zeros(max(1, partial_bytes(product, tiling) // 4), np.int32)
    tile_counters = cupy.zeros(max(1, counters(product, tiling)), np.uint32)
    pointers = (_placed(cupy, a, a_strides), _placed(cupy, b, b_strides), *arrays, out, partials, tile_counters)
    arguments = [p.data.ptr for p in pointers]
    if tiling.instruction == "tma":
        arguments += tensor_maps(product, tiling, arguments[0], arguments[1], out.data.ptr, (row, 1))
    for _ in range(2):
        launcher(source, arguments)()
        np.testing.assert_array_equal(out[:m, :n].get(), expected)
        assert (out[:, n:].get() == 99).all() and (out[m:].get() == 99).all()
    assert not tile_counters.get().any()


@settings(max_examples=80, deadline=None)
@given(configurations(), EPILOGUES)
def test_every_kernel_configuration_is_exact(configuration, epilogue):
    """The mma.sync kernel, at any tiling, split, pipeline depth, layout and signedness, equals NumPy's int32
    product (and, with an epilogue that rescales and adds a bias, in float32 or rounded to float16, or goes on to
    take a relu and requantize, NumPy's float32 formula for it) bit for bit."""
    _check_kernel(configuration, epilogue)


@settings(max_examples=60, deadline=None)
@given(warpgroup_configurations(), EPILOGUES)
def test_every_warpgroup_kernel_configuration_is_exact(configuration, epilogue):
    """The wgmma kernel (sm_90), at any tile, swizzle width, pipeline depth, split and signedness, on shapes that are
    no multiple of its tiles, equals NumPy's product bit for bit."""
    import cupy

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("wgmma runs on sm_90 only")
    _check_kernel(configuration, epilogue)


@settings(max_examples=60, deadline=None)
@given(warpgroup_configurations("tma"), EPILOGUES, st.booleans())
def test_every_warp_specialised_kernel_configuration_is_exact(configuration, epilogue, shifted):
    """The warp-specialised wgmma kernel fed by the tensor memory accelerator (sm_90), at any tile, swizzle width,
    pipeline depth, split, persistent grid, cluster and signedness, its results stored by each thread, in whole lines
    by each warp or by the TMA, on shapes that are no multiple of its tiles (the copies fill what lies beyond with
    zeros, the TMA stores nothing beyond the result), equals NumPy's product bit for bit."""
    import cupy

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("wgmma runs on sm_90 only")
    _check_kernel(configuration, epilogue, shifted)


@pytest.mark.parametrize("m, n, k", [(1000, 600, 784), (4100, 2048, 208)])
def test_a_large_product_is_exact_through_every_kernel_the_program_times(m, n, k):
    """Each candidate the runner times for a large product (wgmma on sm_90 among them; for one of more output tiles
    than SMs, persistent kernels; some storing their results by the TMA, some in whole lines) gives the exact
    sums."""
    import cupy

    from cortado.backends.cupy.calls.int8.runner import Int8Gemm

    rng = np.random.default_rng(5)
    a, b = _ints(rng, (m, k), "int8"), _ints(rng, (k, n), "int8")
    x, w = ct.var("a", (m, k), "int8"), ct.var("b", (n, k), "int8")
    program = ct.compile([ct.matmul(ct.cast(x, "int32"), ct.cast(ct.transpose(w), "int32"))], inputs=[x, w],
                         backend="cupy")
    expected = a.astype(np.int64) @ b.astype(np.int64)
    executor = program._executor
    runner, = (made.library for made in executor.choices.values() if isinstance(made.library, Int8Gemm))
    described = []
    for choice, candidate in enumerate(runner.candidates):
        runner.choice = choice
        executor.prepared.clear(), executor.graphs.clear()  # calls are bound to the choice when first prepared
        result = program(a=a, b=np.ascontiguousarray(b.T))[0].get()
        np.testing.assert_array_equal(result, expected, candidate.describe())
        described.append(candidate.describe())
    if cupy.cuda.Device().compute_capability == "90":
        assert any("wgmma" in d for d in described) and any("tma" in d for d in described)
        assert any("stored by the TMA" in d for d in described) and any("whole lines" in d for d in described)


def _quantized_layer(batch, k, n, rng, weights_as="constant"):
    """A quantized linear layer written as plain expressions, int8 in, int8 out: ``(output, inputs, feeds)``."""
    x, bias = ct.var("x", (batch, k), "int8"), ct.var("bias", (n,), "float32")
    w = _ints(rng, (k, n), "int8")
    scale = (rng.random(n) * 1e-3 + 1e-4).astype(np.float32)
    weight = ct.const(w) if weights_as == "constant" else ct.var("w", (k, n), "int8")
    sums = ct.matmul(ct.cast(x, "int32"), ct.cast(weight, "int32"))
    y = ct.relu(ct.cast(sums, "float32") * scale + bias)
    feeds = {"x": _ints(rng, (batch, k), "int8"), "bias": rng.standard_normal(n).astype(np.float32), "w": w}
    inputs = [x, bias] + ([weight] if weights_as == "variable" else [])
    return ct.quantize(y, 0.02), inputs, {v.name: feeds[v.name] for v in inputs}


@pytest.mark.parametrize("batch, k, n", [(128, 64, 32), (37, 100, 70), (512, 512, 16), (1, 32, 8)])
@pytest.mark.parametrize("weights_as", ["constant", "variable"])
def test_a_quantized_layer_is_one_kernel_equal_to_the_cpu(batch, k, n, weights_as):
    out, inputs, feeds = _quantized_layer(batch, k, n, np.random.default_rng(batch + k + n), weights_as)
    gpu = ct.compile([out], inputs=inputs, backend="cupy")
    cpu = ct.compile([out], inputs=inputs, backend="numpy")
    kernels = [k.term for k in gpu.kernels if not k.is_load and k.term.op.name != "transpose"]  # (a view)
    assert len(kernels) == 1 and kernels[0].op.name == "int8_gemm"
    (runner,) = [made.library for made in gpu._executor.choices.values()]
    assert runner.candidates[0].source.text.count("load_b(s, kt0 + s); }") == 1
    before_wait = runner.candidates[0].source.text.split("ct_wait_prior_grids();")[-2]
    assert ("load_b(s, kt0 + s)" in before_wait) == (weights_as == "constant")
    for _ in range(3):
        np.testing.assert_array_equal(gpu(**feeds)[0].get(), cpu(**feeds)[0])
    assert "int8_gemm" in gpu.explain()


@settings(max_examples=40, deadline=None)
@given(quantization_cases())
def test_quantization_on_the_gpu_equals_the_cpu_bit_for_bit(case):
    """quantize, dequantize and fake_quantize on the GPU equal the CPU's, on values half of which are exact ties, per
    tensor and per channel, and on infinities, the largest floats and ties of one half."""
    x, scale, zero_point, dtype, axis = case
    xv = ct.var("x", x.shape, "float32")
    q = ct.quantize(xv, scale, zero_point, dtype=dtype, axis=axis)
    outputs = [q, ct.dequantize(q, scale, zero_point, axis=axis), ct.fake_quantize(xv, scale, zero_point, dtype, axis)]
    gpu, cpu = (ct.compile(outputs, inputs=[xv], backend=b) for b in ("cupy", "numpy"))
    extremes = np.resize(np.array([np.inf, -np.inf, 3e38, -3e38, 0.5, -0.5, 2.5, -2.5], np.float32), x.shape)
    for feed in (x.astype(np.float32), np.where(np.arange(x.size).reshape(x.shape) % 3 == 0, extremes, x)):
        for ours, theirs in zip(gpu(x=feed), cpu(x=feed)):
            np.testing.assert_array_equal(ours.get(), theirs)


def test_dequantized_products_become_int8_gemms_close_to_the_float_product():
    rng = np.random.default_rng(1)
    qw = _ints(rng, (96, 48), "int8")
    scale_w = (rng.random(48) * 0.01 + 1e-3).astype(np.float32)
    x = ct.var("x", (64, 96), "float32")
    y = ct.dequantize(ct.quantize(x, 0.03), 0.03) @ ct.dequantize(ct.const(qw), scale_w, axis=1)
    gpu = ct.compile([y], inputs=[x], backend="cupy")
    assert len(_int8_kernels(gpu)) == 1
    xv = rng.standard_normal((64, 96)).astype(np.float32)
    expected = ct.evaluate(y, {"x": xv}, precision="float64")
    np.testing.assert_allclose(gpu(x=xv)[0].get(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("w_shape, options", [((16, 8, 1, 1), {}), ((16, 8, 3, 3), dict(padding=1)),
                                              ((12, 8, 3, 3), dict(stride=2))])
def test_quantized_convolutions_equal_the_cpu(w_shape, options):
    rng = np.random.default_rng(2)
    x = ct.var("x", (2, 8, 9, 9), "int8")
    w = _ints(rng, w_shape, "int8")
    sums = ct.conv2d(ct.cast(x, "int32"), ct.cast(ct.const(w), "int32"), **options)
    out = ct.quantize(ct.cast(sums, "float32") * np.float32(0.01), 0.5)
    gpu = ct.compile([out], inputs=[x], backend="cupy")
    cpu = ct.compile([out], inputs=[x], backend="numpy")
    assert len(_int8_kernels(gpu)) == 1
    xv = _ints(rng, (2, 8, 9, 9), "int8")
    np.testing.assert_array_equal(gpu(x=xv)[0].get(), cpu(x=xv)[0])


def test_an_unaligned_feed_read_in_place_gives_the_same_bits():
    """A CuPy feed that starts off a 16-byte boundary is read in place by the kernel that loads element by element."""
    import cupy

    out, inputs, feeds = _quantized_layer(64, 64, 32, np.random.default_rng(3))
    gpu = ct.compile([out], inputs=inputs, backend="cupy")
    shifted = cupy.zeros(64 * 64 + 1, np.int8)[1:].reshape(64, 64)
    shifted[...] = cupy.asarray(feeds["x"])
    assert shifted.data.ptr % 16
    np.testing.assert_array_equal(gpu(**{**feeds, "x": shifted})[0].get(), gpu(**feeds)[0].get())


@pytest.mark.parametrize("activation", ["gelu", "sigmoid", "softplus", "silu"])
def test_a_composite_activation_folds_into_the_int8_kernel_spelled_out(activation):
    """A composite after an int8 product is folded into the kernel's epilogue as its formula in primitives (the
    epilogue is an attribute, which the stage that spells composites out does not reach): one kernel, equal to the
    CPU's program."""
    rng = np.random.default_rng(11)
    x = ct.var("x", (64, 96), "int8")
    w = ct.const(_ints(rng, (96, 40), "int8"))
    sums = ct.matmul(ct.cast(x, "int32"), ct.cast(w, "int32"))
    out = getattr(ct, activation)(ct.cast(sums, "float32") * np.float32(0.01))
    feeds = {"x": _ints(rng, (64, 96), "int8")}
    gpu = ct.compile([out], inputs=[x], backend="cupy")
    kernels = [k.term for k in gpu.kernels if not k.is_load and k.term.op.name != "transpose"]
    assert [t.op.name for t in kernels] == ["int8_gemm"]
    expected = ct.compile([out], inputs=[x], backend="numpy")(**feeds)[0]
    np.testing.assert_allclose(gpu(**feeds)[0].get(), expected, rtol=1e-5, atol=1e-6)
