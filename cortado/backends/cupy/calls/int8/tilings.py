"""The tilings worth timing for one int8 GEMM: block tiles fitted to its shape, split-K to fill the GPU.

A product of 512x16x512 has 33 million multiply-adds, a few microseconds of one multiprocessor's
tensor cores; what decides its time is how many of the 132 multiprocessors take part and how long
each waits on memory. So a skinny product gets a small tile along its short side and its ``K``
split over several blocks, and a large one big tiles, whose operands are reused the most from
shared memory; a short ``K`` has all its tiles in flight at once (on the H100 each tile waited for
in turn added about 0.2 us to a 3 us product). ``candidates`` ranks the block shapes by a rough
cost (the waves of blocks times the work of each, plus a price per staged ``K`` tile and per
split) and returns the best few; the backend times those on the program's buffers and keeps the
fastest (on the H100 the fastest of 30 was always among the first 6).

A large product's blocks read much from L2 (``A`` once per column of tiles, ``B`` once per row of
them: 768 MB for 128x256 tiles at 4096^3), so the cost is the larger of the two, and a split adds
its partial sums' trip through L2. (A rough guide, not the bound itself: on the H100 the kernels sharing a tile of
``A`` between two blocks of a cluster, which halves its reads, were no faster than the others at 4096^3.)
``warpgroup_candidates`` ranks the ``wgmma`` tiles (sm_90) the same way, at twice the multiply-add rate, for the
``cp.async`` kernel and for the warp-specialised one, which also comes on a persistent grid where a product has
more tiles than SMs, alone and in clusters of two.
"""

import math
from dataclasses import replace

from .product import SWIZZLE_ALIGNMENT, Tiling, warpgroup_tiling

# (bm, bn, warps_m, warps_n): each warp computes a (bm / warps_m) x (bn / warps_n) part in 16x8 products
BLOCK_SHAPES = (
    (16, 16, 1, 2), (16, 32, 1, 2), (16, 64, 1, 4), (32, 16, 2, 1), (32, 32, 2, 2), (32, 64, 2, 2),
    (64, 16, 4, 1), (64, 32, 2, 2), (64, 64, 2, 2), (32, 128, 1, 4), (128, 32, 4, 1), (64, 128, 2, 2),
    (128, 64, 2, 2), (128, 128, 2, 4), (128, 256, 2, 4), (256, 128, 4, 2),
)
SHARED_LIMIT = 227 << 10  # the most shared memory a block may have on sm_90
SHARED_PER_SM = 228 << 10  # what the blocks on one SM share
L2_BYTES_PER_CYCLE = 3000  # what all SMs together read from L2 a cycle (about 5.5 TB/s on the H100)
MULTIPLY_ADDS_PER_CYCLE = 2048  # an SM's int8 multiply-adds a cycle through mma.sync, roughly
TILE_CYCLES = 600  # a staged K tile's latency where the pipeline cannot hide it
SPLIT_CYCLES = 2000  # a split's fixed cost (the last block's wait and its adds), its partials' bytes apart
MAX_SPLITS = 16
MAX_STAGES = 6
MAX_WARPGROUP_STAGES = 8
# wgmma tiles (bm, bn): a warpgroup per 64 rows, all bn columns in one instruction
WARPGROUP_SHAPES = ((64, 64), (64, 128), (64, 256), (128, 64), (128, 128), (128, 256), (256, 128))
WARPGROUP_MULTIPLY_ADDS_PER_CYCLE = 4096  # wgmma's int8 rate, twice mma.sync's
WARPGROUP_MIN_MULTIPLY_ADDS = 1 << 25  # below this a product is latency-bound, and mma.sync's small tiles win
SPECIALISED_MIN_MULTIPLY_ADDS = 1 << 22  # the warp-specialised kernel's lower overhead is worth timing from here


def _cost(m, n, k, tiling, multiprocessors, rate=MULTIPLY_ADDS_PER_CYCLE):
    """Cycles, roughly: the waves of blocks times each one's work and staged tiles, or the operands' reads from L2
    (``A`` once per column of tiles, ``B`` once per row of them) where those take longer; a split adds its partial
    sums' trip through L2."""
    bm, bn, bk, splits = tiling.bm, tiling.bn, tiling.bk, tiling.splits
    blocks = math.ceil(m / bm) * math.ceil(n / bn) * splits
    per_sm = max(1, min(2048 // tiling.threads, 4, SHARED_PER_SM // tiling.shared_bytes))
    waves = math.ceil(blocks / (multiprocessors * per_sm))
    k_tiles = math.ceil(math.ceil(k / bk) / splits)
    work = bm * bn * bk * k_tiles / rate * min(per_sm, math.ceil(blocks / multiprocessors))
    compute = waves * (work + TILE_CYCLES * (k_tiles + 2))
    reads = (m * k * math.ceil(n / bn) + n * k * math.ceil(m / bm)) / L2_BYTES_PER_CYCLE
    if splits == 1:
        return max(compute, reads)
    partials = 2 * splits * math.ceil(m / bm) * bm * math.ceil(n / bn) * bn * 4  # written, then read back
    return max(compute, reads) + SPLIT_CYCLES + partials / L2_BYTES_PER_CYCLE


def candidates(m, n, k, multiprocessors, count):
    """The ``count`` best-ranked ``Tiling`` s for an ``m x n x k`` product on ``multiprocessors`` SMs."""
    ranked = []
    for bm, bn, warps_m, warps_n in BLOCK_SHAPES:
        if bm > 2 * max(m, 16) or bn > 2 * max(n, 16):
            continue
        for bk in (32, 64, 128, 256):
            if bk > 32 and bk > 2 * k:
                continue
            k_tiles = math.ceil(k / bk)
            stages = max(2, min(MAX_STAGES, k_tiles + 1))  # a short K all in flight at once
            while stages > 2 and stages * (bm + bn) * (bk + 16) > SHARED_LIMIT:
                stages -= 1
            if stages * (bm + bn) * (bk + 16) > SHARED_LIMIT:
                continue
            tiles = math.ceil(m / bm) * math.ceil(n / bn)
            for splits in {1, min(MAX_SPLITS, k_tiles, max(1, multiprocessors // tiles))}:
                splits = math.ceil(k_tiles / math.ceil(k_tiles / splits))  # no split left empty
                tiling = Tiling(bm, bn, bk, warps_m, warps_n, stages, splits)
                cost = _cost(m, n, k, tiling, multiprocessors)
                ranked.append((cost, bm * bn, tiling))
    ranked.sort(key=lambda entry: entry[:2])
    return [tiling for _, _, tiling in ranked[:count]]


def warpgroup_candidates(m, n, k, multiprocessors, count, instruction="wgmma", stored=0, lines=0):
    """The ``count`` best-ranked wgmma ``Tiling`` s (sm_90) for an ``m x n x k`` product, fed by ``cp.async``
    (``instruction`` ``wgmma``) or by the tensor memory accelerator (``tma``: and the persistent and clustered forms
    of those; where the TMA can store the results, ``stored`` bytes each, the persistent forms storing that way; and
    where the results' rows are 16-byte aligned, ``lines`` bytes each, every form storing them in whole lines); none
    for a small product."""
    if m * n * k < (WARPGROUP_MIN_MULTIPLY_ADDS if instruction == "wgmma" else SPECIALISED_MIN_MULTIPLY_ADDS):
        return []
    # the cp.async kernel refills a stage two tiles after it was read, the warp-specialised one as soon as it is read
    fewest, ahead = (3, 2) if instruction == "wgmma" else (2, 0)
    ranked = []
    for bm, bn in WARPGROUP_SHAPES:
        if bm > 2 * max(m, 64) or bn > 2 * max(n, 64):
            continue
        for bk in (64, 128):
            limit = _shared_limit(bm)
            k_tiles = math.ceil(k / bk)
            stages = max(fewest, min(MAX_WARPGROUP_STAGES, k_tiles + ahead))
            while stages > fewest and stages * (bm + bn) * bk + SWIZZLE_ALIGNMENT > limit:
                stages -= 1
            if stages * (bm + bn) * bk + SWIZZLE_ALIGNMENT > SHARED_LIMIT:
                continue
            tiles = math.ceil(m / bm) * math.ceil(n / bn)
            for splits in {1, min(MAX_SPLITS, k_tiles, max(1, multiprocessors // tiles))}:
                splits = math.ceil(k_tiles / math.ceil(k_tiles / splits))  # no split left empty
                tiling = warpgroup_tiling(bm, bn, bk, stages, splits, instruction)
                cost = _cost(m, n, k, tiling, multiprocessors, WARPGROUP_MULTIPLY_ADDS_PER_CYCLE)
                ranked.append((cost, bm * bn, tiling))
    ranked.sort(key=lambda entry: entry[:2])
    chosen = [tiling for _, _, tiling in ranked[:count]]
    if instruction != "tma":
        return chosen
    # and each unsplit one with more tiles than SMs on a persistent grid (a block's next tile loads while it stores),
    # alone and in clusters of two blocks (neighbours in a row), which read their tile of A once for both
    persistent = [replace(t, blocks=multiprocessors // 2 * 2) for t in chosen
                  if t.splits == 1 and math.ceil(m / t.bm) * math.ceil(n / t.bn) > multiprocessors]
    persistent += [replace(t, cluster=2) for t in persistent if math.ceil(n / t.bn) % 2 == 0]
    stored_by_tma = [stored_tiling(t, stored) for t in persistent] if stored else []
    in_lines = [line_tiling(t, lines) for t in chosen + persistent] if lines else []
    return chosen + persistent + [t for t in stored_by_tma + in_lines if t is not None]


def line_tiling(tiling, size):
    """``tiling`` with each warp's results, ``size`` bytes each, stored in whole 128-byte lines through shared memory
    of its own (``warpgroup.line_stores``); None where a tile's row of results is no whole number of lines or the
    warps' shared memory does not fit beside the stages. On the H200, at 4096^3, a persistent 128x256 tile's int32
    sums stored so took 96-105 us against 100-108 stored by each thread, a 256x128 tile's int8 results 91-94 against
    102-111 stored by the TMA (``benchmarks/results/h200/experiments/int8_lines/``)."""
    lined = replace(tiling, lines=True)
    return lined if tiling.bn * size % 128 == 0 and lined.shared_bytes <= _shared_limit(tiling.bm) else None


def _shared_limit(bm):
    """The shared memory a wgmma block of ``bm`` rows may take: a one-warpgroup block leaves room for a second."""
    return SHARED_LIMIT // 2 if bm == 64 else SHARED_LIMIT


def stored_tiling(tiling, size):
    """``tiling`` with its results, ``size`` bytes each, written into shared memory and stored from there by the TMA
    while the block multiplies its next tile (a persistent block otherwise stops multiplying to store each tile, and
    every block stores at once); None where that tile of results does not fit beside all of its stages, or a row of
    it is no whole number of 32, 64 or 128 bytes (the widths the TMA swizzles). On the H200, at 4096^3, a 256x128
    tile's int8 results stored so took 103-105 us against 111-115 stored by each thread; a tile of int32 results
    stored so with fewer stages was slower at every tile shape tried
    (``benchmarks/results/h200/experiments/int8_epilogue/``)."""
    stored = replace(tiling, stored=size)
    return stored if stored.store_width and stored.shared_bytes <= SHARED_LIMIT else None
