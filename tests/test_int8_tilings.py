"""The int8 GEMM candidates chosen for a shape (CPU: no kernel runs): every one launchable, none wasted, the
wgmma ones only where they can run and pay, the warp-specialised ones persistent and clustered only where they
can be."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortado.backends.cupy.calls.int8.product import Product, Tiling, grid, partial_bytes, warpgroup_tiling
from cortado.backends.cupy.calls.int8.source import gemm_source
from cortado.backends.cupy.calls.int8.tilings import (SHARED_LIMIT, WARPGROUP_MIN_MULTIPLY_ADDS, candidates,
                                               stored_tiling, warpgroup_candidates)
from cortado.exprgraph.ops import parameter

SIZES = st.integers(1, 5000)


def _no_empty_split(k, tiling):
    k_tiles = math.ceil(k / tiling.bk)
    return (tiling.splits - 1) * math.ceil(k_tiles / tiling.splits) < k_tiles


@settings(max_examples=200, deadline=None)
@given(SIZES, SIZES, SIZES)
def test_every_candidate_fits_a_block_and_leaves_no_split_empty(m, n, k):
    specialised = warpgroup_candidates(m, n, k, 132, 4, "tma", 1, 1)
    for tiling in candidates(m, n, k, 132, 6) + warpgroup_candidates(m, n, k, 132, 4) + specialised:
        assert tiling.shared_bytes <= SHARED_LIMIT and tiling.threads <= 1024
        assert _no_empty_split(k, tiling), tiling
    for tiling in warpgroup_candidates(m, n, k, 132, 4):
        assert tiling.instruction == "wgmma" and tiling.bm % 64 == 0 and tiling.stages >= 3
    tiles = {t: (math.ceil(n / t.bn), math.ceil(m / t.bm)) for t in specialised}
    for tiling in specialised:
        across, down = tiles[tiling]
        assert tiling.instruction == "tma" and tiling.bm % 64 == 0 and tiling.stages >= 2
        if tiling.blocks:  # a persistent grid only where there are more tiles than SMs, and no split
            assert tiling.splits == 1 and across * down > 132 and tiling.blocks == 132
            assert grid(_product(m, n, k), tiling) == (132, 1, 1)
        else:
            assert grid(_product(m, n, k), tiling) == (across * down, 1, tiling.splits)
        if tiling.cluster > 1:  # pairs of neighbours in a row, on a persistent grid
            assert tiling.blocks and across % 2 == 0
        if tiling.lines:  # whole lines of 128 bytes, the warps' shared memory beside all of the stages
            assert not tiling.stored and tiling.bn % 128 == 0
            assert replace(tiling, lines=False) in specialised
            assert tiling.shared_bytes <= (SHARED_LIMIT // 2 if tiling.bm == 64 else SHARED_LIMIT)
        if tiling.stored:  # the persistent forms' results stored by the TMA, in boxes a whole swizzle wide
            assert tiling.blocks and tiling.stored == 1
            assert tiling.bn in (32, 64) or tiling.bn % 128 == 0
            assert replace(tiling, stored=0) in specialised  # with all of its stages
    assert all(not t.stored for t in warpgroup_candidates(m, n, k, 132, 4, "tma"))


def _product(m, n, k, constant_b=False):
    return Product(m, n, k, (k, 1), (1, k), np.dtype(np.int8), np.dtype(np.int8), True, True, False, constant_b)


def test_a_warp_specialised_kernel_refuses_clusters_it_cannot_pair():
    """Clustered blocks take neighbouring tiles of a row and share their tile of A: a split, a row of an odd number of
    tiles or an odd persistent grid would leave a block without its neighbour; and a split's last block leaves its
    job, which a persistent block cannot."""
    from cortado.backends.cupy.codegen import Operand

    sums = parameter(0, Operand((256, 384), np.dtype(np.int32), (384, 1)))
    product = _product(256, 384, 256)
    for tiling in (warpgroup_tiling(64, 192, 128, 2, 2, "tma", 0, 2), warpgroup_tiling(64, 128, 128, 2, 1, "tma", 0, 2),
                   warpgroup_tiling(64, 192, 128, 2, 1, "tma", 3, 2), warpgroup_tiling(64, 192, 128, 2, 2, "tma", 4)):
        with pytest.raises(ValueError, match="warp-specialised kernel cannot take"):
            gemm_source(product, tiling, sums, [], (384, 1))
    text = gemm_source(product, warpgroup_tiling(64, 192, 128, 2, 1, "tma", 0, 2), sums, [], (384, 1)).text
    assert "__cluster_dims__(2, 1, 1)" in text and ".multicast::cluster" in text


def test_a_warp_specialised_kernel_asks_for_a_constant_b_before_waiting_for_the_kernel_before():
    """The producer's first copies of a constant B (a quantized layer's weights) go out before it waits; A, and a
    B some kernel writes, only after."""
    from cortado.backends.cupy.codegen import Operand

    sums = parameter(0, Operand((784, 256), np.dtype(np.int32), (256, 1)))
    tiling = warpgroup_tiling(64, 64, 128, 4, 1, "tma")
    for constant in (False, True):
        text = gemm_source(_product(784, 256, 128, constant), tiling, sums, [], (256, 1)).text
        producer = text[text.index("the producer warp"):text.index("} else {")]
        before = producer[:producer.index("ct_wait_prior_grids();")]
        assert ('"l"(b_map_address)' in before) == constant
        assert '"l"(a_map_address)' not in before and "out0[" not in producer


def test_results_are_stored_by_the_tma_only_where_it_can_store_them():
    """The TMA stores boxes of rows 32, 64 or 128 bytes wide, into rows of whole 16-byte chunks, 16-byte aligned; a
    kernel storing that way keeps room for its tile of results beside its stages, and has no split (whose blocks leave
    their job early)."""
    from cortado import cast
    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.calls.int8.specialised import storable_rows

    assert storable_rows(4, (1024, 1), 1000)
    assert storable_rows(1, (1024, 1), 1024)
    assert not storable_rows(1, (1024, 1), 1000)  # its rows' last 8 bytes
    assert not storable_rows(1, (1000, 1), 1000) and not storable_rows(4, (1, 4), 4)
    persistent = warpgroup_tiling(128, 256, 128, 4, 1, "tma", 132)
    assert stored_tiling(persistent, 1).stages == 4 and stored_tiling(persistent, 4) is None  # no room for 128 KB
    assert stored_tiling(warpgroup_tiling(128, 256, 128, 2, 1, "tma", 132), 4).shared_bytes <= SHARED_LIMIT
    assert stored_tiling(warpgroup_tiling(64, 16, 128, 4, 1, "tma", 132), 1) is None  # rows of 16 bytes
    assert stored_tiling(warpgroup_tiling(64, 192, 128, 4, 1, "tma", 132), 1) is None  # one box and a half
    product = _product(8192, 1024, 512)
    sums = parameter(0, Operand((8192, 1024), np.dtype(np.int32), (1024, 1)))
    text = gemm_source(product, stored_tiling(persistent, 1), cast(sums, "int8"), [], (1024, 1)).text
    consumers = text[text.index("} else {"):]
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in consumers and "out0[" not in consumers
    assert "cp.async.bulk.wait_group.read 0" in consumers and "ct_tensor_map out_map" in text
    for tiling, n in ((warpgroup_tiling(128, 256, 128, 2, 2, "tma", 0, 1, 4), 1024),  # a split
                      (stored_tiling(persistent, 1), 1000)):  # rows of 1000 bytes
        with pytest.raises(ValueError, match="warp-specialised kernel cannot take"):
            gemm_source(_product(8192, n, 512), tiling, sums, [], (1024, 1))


def test_results_are_stored_in_whole_lines_only_where_the_rows_hold_them():
    """A warp stores its rows in whole 128-byte lines through shared memory of its own, beside all of the stages:
    where a tile's row is whole lines, in rows 16-byte aligned, and only in the warp-specialised kernel, whose
    consumer warps the shared memory is laid out for."""
    from cortado import cast
    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.calls.int8.tilings import line_tiling
    from cortado.backends.cupy.calls.int8.warpgroup import line_storable

    assert line_storable(4, (4096, 1), 32) and line_storable(1, (4096, 1), 128)
    assert not line_storable(1, (4096, 1), 64) and not line_storable(4, (4098, 1), 128)
    assert not line_storable(4, (1, 4096), 128)
    persistent = warpgroup_tiling(256, 128, 128, 4, 1, "tma", 132)
    assert line_tiling(persistent, 4).shared_bytes == persistent.shared_bytes + 16 * 2048 <= SHARED_LIMIT
    assert line_tiling(warpgroup_tiling(128, 128, 128, 7, 1, "tma"), 4) is None  # no room beside 7 stages
    assert line_tiling(warpgroup_tiling(128, 64, 128, 4, 1, "tma"), 1) is None  # 64 bytes a row
    assert line_tiling(warpgroup_tiling(64, 64, 128, 7, 1, "tma"), 4) is None  # no room left for a second block
    int8_results = gemm_source(_product(4096, 4096, 4096), line_tiling(warpgroup_tiling(128, 256, 128, 4, 1, "tma"), 1),
                               cast(parameter(0, Operand((4096, 4096), np.dtype(np.int32), (4096, 1))), "int8"), [],
                               (4096, 1)).text
    assert "line_scratch" in int8_results and "store_staged" not in int8_results  # not the whole tile's staging
    sums = parameter(0, Operand((4096, 4096), np.dtype(np.int32), (4096, 1)))
    text = gemm_source(_product(4096, 4096, 4096), line_tiling(persistent, 4), sums, [], (4096, 1)).text
    consumers = text[text.index("} else {"):]
    assert "line_scratch" in consumers and "*reinterpret_cast<uint4*>(out0" in consumers
    for tiling, body, strides in ((line_tiling(persistent, 4), sums, (4098, 1)),  # rows not 16-byte aligned
                                  (warpgroup_tiling(128, 64, 128, 4, 1, "tma", lines=True), cast(sums, "int8"),
                                   (4096, 1)),  # rows of 64 bytes
                                  (warpgroup_tiling(256, 128, 128, 4, 1, "wgmma", lines=True), sums, (4096, 1))):
        with pytest.raises(ValueError, match="whole lines"):
            gemm_source(_product(4096, 4096, 4096), tiling, body, [], strides)


def test_small_products_get_no_wgmma_candidates_and_large_ones_do():
    assert warpgroup_candidates(512, 64, 512, 132, 4) == []
    assert 512 * 64 * 512 < WARPGROUP_MIN_MULTIPLY_ADDS
    large = warpgroup_candidates(4096, 4096, 4096, 132, 4)
    assert len(large) == 4 and all(t.bm * t.bn == 128 * 256 and t.splits == 1 for t in large)


def test_a_split_costs_its_partial_sums():
    """A 2048x1024 product fills the GPU with unsplit tiles: a split of 128x256 tiles would move 16 MB of partial
    sums through L2, more than it saves."""
    for tiling in warpgroup_candidates(2048, 1024, 1024, 132, 4):
        assert tiling.splits == 1, tiling
    product = Product(2048, 1024, 1024, (1024, 1), (1, 1024), np.dtype(np.int8), np.dtype(np.int8), True, True)
    assert partial_bytes(product, warpgroup_tiling(128, 256, 128, 4, 2)) == 2048 * 1024 * 2 * 4


def test_a_wgmma_kernel_refuses_what_it_cannot_read():
    from cortado.backends.cupy.codegen import Operand

    sums = parameter(0, Operand((64, 64), np.dtype(np.int32), (64, 1)))
    element_wise = Product(64, 64, 64, (1, 64), (1, 64), np.dtype(np.int8), np.dtype(np.int8), False, True)
    with pytest.raises(ValueError, match="wgmma kernel cannot take"):
        gemm_source(element_wise, warpgroup_tiling(64, 64, 64, 3), sums, [], (64, 1))
    vector = Product(64, 64, 64, (64, 1), (1, 64), np.dtype(np.int8), np.dtype(np.int8), True, True)
    source = gemm_source(vector, warpgroup_tiling(64, 64, 64, 3), sums, [], (64, 1))
    assert "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8" in source.text and "-arch=sm_90a" in source.options
    assert "mma.sync" in gemm_source(vector, Tiling(16, 16, 64, 1, 2, 2), sums, [], (64, 1)).text


def test_int8_results_of_whole_tiles_are_staged_and_stored_sixteen_bytes_a_thread():
    """Narrow results in rows of whole 16-byte chunks go through shared memory; int32 results, columns and rows
    of odd lengths do not."""
    from cortado import cast
    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.calls.int8.epilogue import staged

    tiling = warpgroup_tiling(128, 128, 128, 7)
    assert staged(tiling, np.int8, (1024, 1)) and staged(tiling, np.float16, (1024, 1))
    assert not staged(tiling, np.int32, (1024, 1))
    assert not staged(tiling, np.int8, (1, 2048))
    assert not staged(tiling, np.int8, (1000, 1))
    assert staged(Tiling(16, 16, 64, 1, 2, 2), np.int8, (1024, 1))
    product = Product(2048, 1024, 1024, (1024, 1), (1, 1024), np.dtype(np.int8), np.dtype(np.int8), True, True)
    sums = parameter(0, Operand((2048, 1024), np.dtype(np.int32), (1024, 1)))
    text = gemm_source(product, tiling, cast(sums, "int8"), [], (1024, 1)).text
    assert "store_staged();" in text
    assert "store_staged" not in gemm_source(product, tiling, sums, [], (1024, 1)).text


@pytest.mark.parametrize("tiling", [Tiling(64, 32, 64, 2, 2, 2), warpgroup_tiling(64, 64, 128, 4)])
def test_only_constant_operands_are_read_before_waiting_for_the_kernel_before(tiling):
    """The kernel before may still be flushing its writes: a value a kernel writes is read after the wait, a
    constant (the weights) before it."""
    from cortado.backends.cupy.codegen import Operand

    sums = parameter(0, Operand((784, 256), np.dtype(np.int32), (256, 1)))
    for constants in [(False, False), (False, True), (True, True)]:
        product = Product(784, 256, 128, (128, 1), (1, 128), np.dtype(np.int8), np.dtype(np.int8), True, True,
                          *constants)
        before, after = gemm_source(product, tiling, sums, [], (256, 1)).text.split("ct_wait_prior_grids();")
        for name, constant in zip("ab", constants):
            assert (f"load_{name}(s, kt0 + s)" in before) == constant
            assert (f"load_{name}(s, kt0 + s)" in after) != constant
        assert "out0[" not in before and "partials[" not in before
