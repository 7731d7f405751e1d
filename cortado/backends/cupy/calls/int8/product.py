"""What an int8 GEMM kernel is generated for: the product (sizes, strides, dtypes) and how it is cut (``Tiling``)."""

from dataclasses import dataclass

import numpy as np

PAD = 16  # bytes after each row of a tile staged for ldmatrix (mma.sync)
SWIZZLE_ALIGNMENT = 1024  # bytes: the repeat of the 128-byte swizzle a wgmma tile is stored in
PRODUCER_THREADS = 32  # the warp-specialised kernel's producer: one warp, of which one thread asks for the tiles
LINE_SCRATCH = 16 * 128  # bytes: a consumer warp's 16 rows of results, 128 bytes of each at a time


@dataclass(frozen=True)
class Tiling:
    """How one GEMM is cut: block tile ``bm x bn x bk``, its warps, the pipeline's depth, the split of ``K``, and the
    tensor-core instruction: ``mma`` (``mma.sync``, sm_80 on, warps of ``(bm / warps_m) x (bn / warps_n)``),
    ``wgmma`` (sm_90, a warpgroup of four warps per 64 rows, ``warps_m = bm / 16``, ``warps_n = 1``) or ``tma``
    (the same warpgroups fed by the tensor memory accelerator, which one more warp, the producer, asks for each
    tile)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    splits: int = 1
    instruction: str = "mma"
    blocks: int = 0  # ``tma``: a persistent grid of this many blocks, each taking every blocks-th output tile
    cluster: int = 1  # ``tma``: blocks of a cluster take neighbouring tiles of a row and share their tile of A
    # ``tma``: the results, ``stored`` bytes each, written into shared memory and stored from there by the TMA while
    # the block goes on to its next tile; 0: each thread stores its own
    stored: int = 0
    # ``tma``: each consumer warp's results stored in whole 128-byte lines of a row, through shared memory of its own
    # (``LINE_SCRATCH`` bytes), where a tile lies wholly inside the result; else each thread stores its own
    lines: bool = False

    @property
    def threads(self):
        return 32 * self.warps_m * self.warps_n + (PRODUCER_THREADS if self.instruction == "tma" else 0)

    @property
    def store_width(self):
        """With ``stored``: the bytes a row of each box of results the TMA stores holds (a width it swizzles: 128, 64 or
        32), or None where a tile's row of results is no whole number of them."""
        row = self.bn * self.stored
        width = min(row, 128)
        return width if width in (32, 64, 128) and row % width == 0 else None

    @property
    def shared_bytes(self):
        if self.instruction != "mma":  # swizzled rows, no padding; the base rounded up to the swizzle's repeat
            results = self.bm * self.bn * self.stored + (self.bm // 16 * LINE_SCRATCH if self.lines else 0)
            return self.stages * (self.bm + self.bn) * self.bk + results + SWIZZLE_ALIGNMENT
        return self.stages * (self.bm + self.bn) * (self.bk + PAD)

    def __str__(self):
        split = f" split-K {self.splits}" if self.splits > 1 else ""
        groups = self.bm // 64
        workers = (f"{groups} warpgroup{'s' if groups > 1 else ''}" if self.instruction != "mma"
                   else f"{self.warps_m}x{self.warps_n} warps")
        producer = " and a producer warp" if self.instruction == "tma" else ""
        persistent = f", persistent on {self.blocks} blocks" if self.blocks else ""
        cluster = f", A shared by clusters of {self.cluster}" if self.cluster > 1 else ""
        stored = ", stored by the TMA" if self.stored else ", stored in whole lines" if self.lines else ""
        return (f"{self.bm}x{self.bn}x{self.bk} tiles, {workers}{producer}, {self.stages} stages{split}{persistent}"
                f"{cluster}{stored}")


def warpgroup_tiling(bm, bn, bk, stages, splits=1, instruction="wgmma", blocks=0, cluster=1, stored=0, lines=False):
    """A wgmma ``Tiling`` (``instruction`` ``wgmma`` or ``tma``): a warpgroup per 64 rows of the block's tile."""
    return Tiling(bm, bn, bk, bm // 16, 1, stages, splits, instruction, blocks, cluster, stored, lines)


@dataclass(frozen=True)
class Product:
    """The GEMM itself: sizes, the element strides of ``A`` (``m, k``) and ``B`` (``k, n``), the operands' dtypes,
    whether each is read 16 bytes at a time (``K`` stride 1, rows 16-byte aligned), and whether each is a constant
    of the program, which no kernel writes (a quantized layer's weights): those are read before the kernel waits
    for the one before it (``staging.prologue``; a constant ``B``, by the warp-specialised kernel's producer)."""

    m: int
    n: int
    k: int
    a_strides: tuple
    b_strides: tuple
    a_dtype: np.dtype
    b_dtype: np.dtype
    vector_a: bool
    vector_b: bool
    constant_a: bool = False
    constant_b: bool = False


def vector_readable(strides):
    """Whether an operand with element ``strides`` (``row, k``) can be read 16 bytes at a time, its pointer aligned."""
    row, k = strides
    return k == 1 and row % 16 == 0


def tiles(product, tiling):
    """The output tiles and the split of each: ``(tiles across N, tiles down M, splits)``."""
    return (-(-product.n // tiling.bn), -(-product.m // tiling.bm), tiling.splits)


def grid(product, tiling):
    """The blocks a kernel is launched on: one per output tile and split, ``(across, down, splits)``; for the
    warp-specialised kernel, which numbers the output tiles in one row, ``(tiles, 1, splits)``, or its persistent
    blocks (no more than there are tiles)."""
    across, down, splits = tiles(product, tiling)
    if tiling.instruction != "tma":
        return across, down, splits
    return min(tiling.blocks or across * down, across * down), 1, splits


def partial_bytes(product, tiling):
    """The workspace the split sums take (0 without a split)."""
    if tiling.splits == 1:
        return 0
    across, down, splits = tiles(product, tiling)
    return across * down * splits * tiling.bm * tiling.bn * 4


def counters(product, tiling):
    """How many tile counters the kernel needs (one per output tile; 0 without a split)."""
    across, down, _ = tiles(product, tiling)
    return across * down if tiling.splits > 1 else 0


def ptx_type(dtype):
    return {"int8": "s8", "uint8": "u8"}[np.dtype(dtype).name]
