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
"""

import math

from .source import Tiling

# (bm, bn, warps_m, warps_n): each warp computes a (bm / warps_m) x (bn / warps_n) part in 16x8 products
BLOCK_SHAPES = (
    (16, 16, 1, 2), (16, 32, 1, 2), (16, 64, 1, 4), (32, 16, 2, 1), (32, 32, 2, 2), (32, 64, 2, 2),
    (64, 16, 4, 1), (64, 32, 2, 2), (64, 64, 2, 2), (32, 128, 1, 4), (128, 32, 4, 1), (64, 128, 2, 2),
    (128, 64, 2, 2), (128, 128, 2, 4), (128, 256, 2, 4), (256, 128, 4, 2),
)
SHARED_LIMIT = 227 << 10  # the most shared memory a block may have on sm_90
MULTIPLY_ADDS_PER_CYCLE = 2048  # an SM's int8 multiply-adds a cycle through mma.sync, roughly
TILE_CYCLES = 600  # a staged K tile's latency where the pipeline cannot hide it
SPLIT_CYCLES = 2000  # a split's cost: the partial sums written, read and added
MAX_SPLITS = 16
MAX_STAGES = 6


def _cost(m, n, k, bm, bn, bk, splits, multiprocessors, threads):
    blocks = math.ceil(m / bm) * math.ceil(n / bn) * splits
    per_sm = max(1, min(2048 // threads, 4))
    waves = math.ceil(blocks / (multiprocessors * per_sm))
    k_tiles = math.ceil(math.ceil(k / bk) / splits)
    work = bm * bn * bk * k_tiles / MULTIPLY_ADDS_PER_CYCLE * min(per_sm, math.ceil(blocks / multiprocessors))
    return waves * (work + TILE_CYCLES * (k_tiles + 2)) + (SPLIT_CYCLES if splits > 1 else 0)


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
                cost = _cost(m, n, k, bm, bn, bk, splits, multiprocessors, tiling.threads)
                ranked.append((cost, bm * bn, tiling))
    ranked.sort(key=lambda entry: entry[:2])
    return [tiling for _, _, tiling in ranked[:count]]
