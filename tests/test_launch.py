"""Generated kernels launched to overlap the kernel before them (programmatic dependent launch): every kernel the
backend waits for the grids before it before it touches what they write, the launch structures match the driver's,
and on the GPU a chain of kernels each reading the last one's result sees it whole."""

import ctypes
import re

import numpy as np
import pytest

import cortado as ct
from cortado.backends import gpu_visible
from cortado.backends.cupy import launch, reduction_kernels, sources
from cortado.backends.cupy.codegen import Operand, Source, contiguous_strides
from cortado.backends.cupy.kernels import compiled
from cortado.errors import BackendError
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.exprgraph.ops import parameter
from cortado.rules.fusion import row_shape

SHAPE = (64, 48)


def _first_statement(text):
    """The first statement of the ``__global__`` function in ``text``."""
    body = text[re.search(r'extern "C" __global__[^{]*\{\n', text).end():]
    return body.lstrip().split("\n", 1)[0].strip()


def _operand(dtype="float32"):
    return Operand(SHAPE, np.dtype(dtype), contiguous_strides(SHAPE))


def _int8_sources():
    from cortado.backends.cupy.calls.int8.product import Product, Tiling, warpgroup_tiling
    from cortado.backends.cupy.calls.int8.source import gemm_source

    m, n, k = 100, 40, 96
    product = Product(m, n, k, (k, 1), (1, k), np.dtype(np.int8), np.dtype(np.int8), True, True)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    return [gemm_source(product, tiling, sums, [], (n, 1))
            for tiling in (Tiling(32, 32, 64, 2, 2, 3, 2), warpgroup_tiling(64, 32, 64, 3))]


def _sources():
    x = parameter(0, ct.var("x", SHAPE, "float32"))
    yield sources.kernel_source((ct.exp(x) * 2.0,), [_operand()])
    yield sources.kernel_source((ct.sum(x, axis=1),), [_operand()])
    yield sources.kernel_source((ct.max(x, axis=0),), [_operand()])
    yield sources.copy_source(_operand(), (1, 0))
    yield from _int8_sources()
    yield from _split_and_row_sources()


def _split_and_row_sources():
    """A column sum too long for its one tile (two kernels), and a softmax spelled out (one row kernel)."""
    tall = Operand((4096, 8), np.dtype(np.float32), (8, 1))
    y = parameter(0, tall)
    yield from sources.kernel_sources((ct.sum(y, axis=0),), [tall])
    e = ct.exp(y - ct.max(y, axis=1, keepdims=True))
    yield from sources.kernel_sources((e / ct.sum(e, axis=1, keepdims=True),), [tall])


def test_split_columns_and_row_kernels_are_chosen_where_they_pay():
    tall = Operand((4096, 8), np.dtype(np.float32), (8, 1))
    y = parameter(0, tall)
    column = (ct.sum(y, axis=0),)
    assert reduction_kernels.column_splits(column, [tall]) == 32 and sources.reduction_scratch_bytes(column, [tall]) == 32 * 8 * 4
    parts, total = sources.kernel_sources(column, [tall])
    assert parts.blocks == (1, 32, 1) and "partials[" in parts.text and "partials[(0 + s) * 8 + o]" in total.text
    short = (ct.sum(parameter(0, _operand()), axis=0),)
    assert reduction_kernels.column_splits(short, [_operand()]) == 1  # too few rows to split
    wide = Operand((4096, 8), np.dtype(np.int64), (8, 1))  # an int64 sum keeps 8 bytes a part
    assert sources.reduction_scratch_bytes((ct.sum(parameter(0, wide), axis=0),), [wide]) == 32 * 8 * 8
    both = (ct.sum(y, axis=0), ct.max(y, axis=0))  # sibling reductions: each its own parts
    assert sources.reduction_scratch_bytes(both, [tall]) == 2 * 32 * 8 * 4
    parts, total = sources.kernel_sources(both, [tall])
    assert "partials[(unsigned int)(32 + blockIdx.y) * 8 + o] = acc1;" in parts.text and "acc1 = ct_max" in total.text
    e = ct.exp(y - ct.max(y, axis=1, keepdims=True))
    assert row_shape((e / ct.sum(e, axis=1, keepdims=True),)) == (4096, 8)
    assert row_shape((ct.sum(y, axis=1, keepdims=True),)) is None  # one reduction, no row output
    assert sources.reduction_scratch_bytes((e / ct.sum(e, axis=1, keepdims=True),), [tall]) == 0


def test_columns_whose_rows_are_whole_vectors_are_loaded_a_vector_a_thread():
    """A bias gradient's column sums of 8192 rows of 768 bfloat16 load 16 bytes of adjacent columns a thread; rows of
    770 columns, not whole vectors, an element a thread."""
    for width, vector in ((768, True), (770, False)):
        rows = Operand((8192, width), np.dtype(BFLOAT16), (width, 1))
        body = (ct.sum(ct.cast(parameter(0, rows), "float32"), axis=0),)
        parts, _ = sources.kernel_sources(body, [rows])
        assert ("ct_vec<__nv_bfloat16, 8>" in parts.text) == vector
        assert parts.block == ((reduction_kernels.COLUMN_VECTOR_ACROSS, 256 // reduction_kernels.COLUMN_VECTOR_ACROSS, 1)
                               if vector else (32, 8, 1))
    # a float32 operand beside a bfloat16 one takes vectors of as many elements (32 bytes); a value per row is read
    # an element a row; sibling reductions (a sum, a max) each keep their own column of partials
    halves, singles = (Operand((8192, 768), np.dtype(t), (768, 1)) for t in (BFLOAT16, np.float32))
    per_row = Operand((8192, 1), np.dtype(np.float32), (1, 1))
    x, y, z = parameter(0, halves), parameter(1, singles), parameter(2, per_row)
    parts, _ = sources.kernel_sources((ct.sum(ct.cast(x, "float32") * y * z, axis=0), ct.max(y, axis=0)),
                                      [halves, singles, per_row])
    across = reduction_kernels.COLUMN_VECTOR_ACROSS
    assert "ct_vec<__nv_bfloat16, 8>" in parts.text and "ct_vec<float, 8>" in parts.text and "in2[r]" in parts.text
    assert f"partial[2][{256 // across}][{across * 8}]" in parts.text and "ct_max<float>(sums[1]" in parts.text


def test_an_image_stored_channels_last_sums_its_channels_as_columns():
    """Summed over all but its channels, an image stored channels last is read as rows of channels (a tile of
    columns a block, the rows split into parts), not an output a block striding a channel's width."""
    shape = (128, 32, 32, 32)
    channels_last = Operand(shape, np.dtype(np.float32), (32 * 32 * 32, 1, 32 * 32, 32))
    channels_first = Operand(shape, np.dtype(np.float32), (32 * 32 * 32, 32 * 32, 32, 1))
    body = (ct.sum(parameter(0, channels_last), axis=(0, 2, 3)),)
    assert reduction_kernels.column_splits(body, [channels_last]) == 1024
    assert reduction_kernels.column_splits(body, [channels_first]) == 1
    parts, total = sources.kernel_sources(body, [channels_last])
    assert parts.block == (32, 8, 1) and parts.blocks == (1, 1024, 1)
    assert "in0[(r / 1024) * 32768 + o + (r % 1024) * 32]" in parts.text  # a row r of channels: r * 32 + o
    (rows,) = sources.kernel_sources(body, [channels_first])
    assert rows.block == (256, 1, 1) and rows.blocks == 32


@pytest.mark.parametrize("source", list(_sources()), ids=lambda s: s.name)
def test_every_generated_kernel_waits_for_the_grids_before_it_touches_their_values(source):
    """Elementwise kernels and copies wait first thing; an int8 GEMM whose operands are not constants defines its
    loads first, and stages no tile and stores nothing before the wait (``test_int8_tilings`` has the constants)."""
    if "auto load_a" not in source.text:
        assert _first_statement(source.text) == launch.WAIT_PRIOR_GRIDS
    before = source.text.split(launch.WAIT_PRIOR_GRIDS)[0]
    assert not re.search(r"\bload(_[ab])?\(s,|out0\[|partials\[|counters\[|store_all\(", before)


def test_a_kernel_that_would_not_wait_is_refused():
    text = 'extern "C" __global__ void k(float* out0) {\n  out0[0] = 1.f;\n}\n'
    with pytest.raises(BackendError, match="does not wait for the grids before it"):
        compiled(Source("k", text, 1, (1, 1, 1)))


def test_the_launch_structures_have_the_drivers_layout():
    """``CUlaunchAttribute`` and ``CUlaunchConfig`` as cuda.h lays them out on 64-bit hosts."""
    assert ctypes.sizeof(launch._Attribute) == 72 and launch._Attribute.value.offset == 8
    assert ctypes.sizeof(launch._Config) == 56
    assert (launch._Config.shared.offset, launch._Config.stream.offset, launch._Config.attributes.offset,
            launch._Config.count.offset) == (24, 32, 40, 48)


def test_a_launch_passes_pointers_and_structures_by_value(monkeypatch):
    """Each argument's bytes lie where the driver is told to read them: a pointer's 8, a tensor map's 128 at a
    64-byte boundary; a kernel without arguments has none to pass."""
    monkeypatch.setattr(launch, "overlapping", lambda: True)
    structure = bytes(range(128))
    made = launch.Launch(None, 4, 32, [0x1234, structure, 7])
    read = [ctypes.string_at(address, size) for address, size in zip(made.parameters, (8, 128, 8))]
    assert read == [(0x1234).to_bytes(8, "little"), structure, (7).to_bytes(8, "little")]
    assert all(address % 64 == 0 for address in made.parameters)
    assert len(launch.Launch(None, 1, 1, []).parameters) == 0


@pytest.mark.parametrize("captured", [False, True], ids=["stream", "cuda graph"])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_chained_overlapping_launches_each_see_the_whole_result_before_them(captured):
    """Kernels that each read every element the one before wrote, transposed (a block reads what other blocks
    wrote), launched back to back: each waits for the whole grid before it, so every element counts every step."""
    import cupy

    from cortado.backends.cupy.kernels import launcher

    if int(cupy.cuda.Device().compute_capability) >= 90:
        assert launch.overlapping()
    n, steps = 2048, 40
    x = parameter(0, ct.var("x", (n, n), "float32"))
    source = sources.kernel_source((x + 1.0,), [Operand((n, n), np.dtype(np.float32), (1, n))])
    buffers = [cupy.zeros((n, n), np.float32), cupy.zeros((n, n), np.float32)]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        calls = [launcher(source, (buffers[i % 2].data.ptr, buffers[(i + 1) % 2].data.ptr)) for i in range(steps)]
        if captured:
            stream.begin_capture()
        for call in calls:
            call()
        if captured:
            stream.end_capture().launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(buffers[steps % 2].get(), np.full((n, n), steps, np.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_kernels_keep_subnormals_and_a_second_run_reads_them_from_disk(tmp_path, monkeypatch):
    """A generated kernel halving the smallest float32 normal gives NumPy's subnormal, not a flushed 0; its image is
    written to the cache folder, and a process that has not compiled it (the memory cache emptied) loads it from
    there without calling NVRTC."""
    import cupy
    from cupy.cuda import compiler

    from cortado.backends.cupy import kernels

    monkeypatch.setenv("CORTADO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_cache", {})
    x = parameter(0, ct.var("x", SHAPE, "float32"))
    source = sources.kernel_source((x * 0.5,), [_operand()])
    tiny = np.full(SHAPE, np.finfo(np.float32).tiny, np.float32)

    def halved():
        given, result = cupy.asarray(tiny), cupy.zeros(SHAPE, np.float32)
        kernels.launcher(source, (given.data.ptr, result.data.ptr))()
        return result.get()

    np.testing.assert_array_equal(halved(), tiny * np.float32(0.5))
    assert len(list((tmp_path / "kernels").glob("*.cubin"))) == 1
    monkeypatch.setattr(kernels, "_cache", {})
    kernels._launch.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("compiled again although the image was on disk")

    monkeypatch.setattr(compiler, "compile_using_nvrtc", refuse)
    np.testing.assert_array_equal(halved(), tiny * np.float32(0.5))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_kernels_compile_side_by_side_and_one_nvrtc_rejects_fails_the_build(tmp_path, monkeypatch):
    """Sources handed to the compiling threads (``prepare``) are compiled on them, not on the building thread, and
    loaded by ``finish``; a kernel NVRTC rejects raises there, and leaves nothing waiting."""
    import dataclasses
    import threading

    from cupy.cuda import compiler

    from cortado.backends.cupy import kernels

    monkeypatch.setenv("CORTADO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_cache", {})
    compiling = compiler.compile_using_nvrtc
    threads = set()

    def noted(*args, **kwargs):
        threads.add(threading.get_ident())
        return compiling(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_using_nvrtc", noted)
    x = parameter(0, ct.var("x", SHAPE, "float32"))
    made = [sources.kernel_source((x * float(k + 2),), [_operand()]) for k in range(6)]
    for source in made:
        kernels.prepare(source)
    kernels.finish()
    assert not kernels._pending and all((s.name, s.options) in kernels._cache for s in made)
    assert threads and threading.get_ident() not in threads
    broken = dataclasses.replace(made[0], name="ct_broken", text=made[0].text + "\nthis is not C++;\n")
    kernels.prepare(broken)
    with pytest.raises(Exception, match="(?i)compil|error"):
        kernels.finish()
    assert not kernels._pending


def test_the_compiling_threads_are_as_many_as_asked(monkeypatch):
    """``CORTADO_COMPILE_THREADS`` sets how many kernels NVRTC compiles at once; without it, one a processor up to
    16; a count that is no whole number of threads is refused in words."""
    from cortado.backends.cupy import kernels

    monkeypatch.setenv("CORTADO_COMPILE_THREADS", "3")
    assert kernels.compiling_threads() == 3
    monkeypatch.delenv("CORTADO_COMPILE_THREADS")
    assert 1 <= kernels.compiling_threads() <= kernels.COMPILING_THREADS
    for wrong in ("0", "two", "-1"):
        monkeypatch.setenv("CORTADO_COMPILE_THREADS", wrong)
        with pytest.raises(BackendError, match="CORTADO_COMPILE_THREADS"):
            kernels.compiling_threads()
