"""A convolution's weight gradient as a kernel of our own: the pixels split over blocks, the blocks' partial
sums added in a fixed order, so the result is the same bits every run.

A weight gradient is a GEMM whose reduced axis, the batch's pixels, is far longer than its result
(``dw[o, c, tap] = sum over pixels of dy[o, pixel] * x[c, pixel moved by tap]``: 131072 pixels for a
32x32 batch of 128, 9216 outputs for 32 channels and 3x3 taps). cuDNN's deterministic plans for
float32 split it too little (0.41 ms on the H100 for such a layer, 0.15 ms for its plans that add
with atomics; this kernel takes 0.11 ms). Here every block takes a run of tiles of pixels (``TP x
TQ`` positions of one image) and a block of output and input channels; per tile it stages the
tile's ``dy`` and the input rows and columns the taps reach (zeros in the padding) in shared
memory, and each thread sums, in registers, ``OPT`` output channels times every tap for one input
channel (four positions of ``dy``, and where the stride and dilation across are 1, four input
columns, in one shared-memory load each; ``ACCUMULATORS`` of 36 sums ran 1.2x to 1.5x faster than
72 on the H100). Its sums go to a partial of the workspace; a second kernel adds the partials in
order into ``dw``. Strides, padding, dilation and
groups are constants of the source; so are the operands' strides, so any layout is read where it lies.

Only float32 and float64 take part: on the H100, for the bfloat16 weight gradients of
``bench_cnn_gpu.py``'s network, cuDNN's tensor-core plans took 30 to 64 us against this kernel's
57 to 172, and the memory plan holds a candidate's workspace whether it wins or not. A 1x1 weight
gradient is a plain GEMM, which cuBLASLt does better than this kernel: over every pixel of NHWC
images (``PixelGemm``), or per NCHW image with the products added in order (``ImageGemms``).
"""

import math

import numpy as np

from ....memplan import aligned
from .cublaslt import Gemm, GemmCall
from ..codegen import Operand, finished_source, storage_type
from ..kernels import launcher

THREADS = 256  # the most threads a block of the partial kernel has
SHARED_BYTES = 48 << 10  # a block's staged tile
PARTIAL_BYTES = 16 << 20  # the most the blocks' partial sums may take
ACCUMULATORS = 36  # the most sums one thread keeps in registers
BLOCKS_PER_SM = 2
SUM_LANES = 8  # threads adding the partials of one output element
STAGED = 8  # the loads a thread has in flight when it stages a tile
ALIGNMENT = 256
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _divisor(n, limit):
    """The largest divisor of ``n`` not above ``limit``."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _multiprocessors():
    import cupy

    return cupy.cuda.Device().attributes["MultiProcessorCount"]


def split_wgrad(call):
    """The ``SplitWgrad`` of weight-gradient ``ConvCall`` ``call``, or, for a 1x1 one, its ``PixelGemm`` (NHWC
    images) or ``ImageGemms`` (NCHW); None for another mode or dtype, more than two spatial axes, taps too many for
    its registers or tiles, or a 1x1 one that is neither product or whose products would take more than
    ``PARTIAL_BYTES``."""
    out = call.out
    taps = math.prod(out.shape[2:])
    if call.mode != "wgrad" or call.dtype not in DTYPES or len(out.shape) > 4 or taps > 2 * ACCUMULATORS:
        return None
    if 0 in call.first.shape + call.second.shape or math.prod(out.shape) * 8 > PARTIAL_BYTES:  # empty, or too many
        return None
    geometry = _Geometry(call)
    if taps == 1:
        if geometry.product_over_pixels():
            return PixelGemm(geometry, call.tf32)
        fits = geometry.n * geometry.o * geometry.c * geometry.acc_bytes <= PARTIAL_BYTES
        return ImageGemms(geometry, call.tf32) if fits and geometry.products_per_image() else None
    return SplitWgrad(geometry) if geometry.tile is not None else None


class _Geometry:
    """The weight gradient's sizes as a 2-d one's (a 1-d one gets a height of 1) and the tiling chosen for them."""

    def __init__(self, call):
        x, dy, dw = call.first, call.second, call.out
        extra = 4 - len(dw.shape)

        def planar(values, fill):
            return (fill,) * extra + tuple(values)

        self.n, self.c, self.h, self.w = x.shape[:2] + planar(x.shape[2:], 1)
        _, self.o, self.p, self.q = dy.shape[:2] + planar(dy.shape[2:], 1)
        self.r, self.s = planar(dw.shape[2:], 1)
        self.stride, self.dilation = planar(call.strides, 1), planar(call.dilation, 1)
        self.low = planar([low for low, _ in call.padding], 0)
        self.x_strides = x.strides[:2] + planar(x.strides[2:], 0)
        self.dy_strides = dy.strides[:2] + planar(dy.strides[2:], 0)
        self.dw_strides = dw.strides[:2] + planar(dw.strides[2:], 0)
        self.groups, self.dtype = call.groups, call.dtype
        self.og, self.cg, self.taps = self.o // self.groups, self.c // self.groups, self.r * self.s
        self.ob = _divisor(self.og, 32)
        self.opt = max(d for d in (8, 4, 2, 1) if self.ob % d == 0 and (d * self.taps <= ACCUMULATORS or d == 1))
        self.cb = _divisor(self.cg, min(32, THREADS // (self.ob // self.opt)))  # a thread group within THREADS
        self.acc = np.dtype(np.float64 if self.dtype == np.float64 else np.float32)
        self.acc_bytes = self.acc.itemsize
        self.vector = self.acc_bytes == 4 and self.stride[1] == 1 and self.dilation[1] == 1
        self.loads_per_row = -(-(3 + self.s) // 4)  # float4s covering the columns four positions and their taps read
        self.tile = self._tile()

    def _plain(self):
        """1x1 (the caller knows), stride 1, no padding, no groups: every pixel of ``dy`` is one of ``x``'s."""
        return self.stride == (1, 1) and self.low == (0, 0) and self.groups == 1 and (self.p, self.q) == (self.h, self.w)

    def products_per_image(self):
        """Whether the weight gradient is ``dy[n] @ x[n]^T`` summed over the images ``n``: plain, each image's pixels
        one stride apart in both operands."""
        packed = all(strides[3] == 1 and (strides[2] == self.w or self.h == 1) for strides in (self.x_strides, self.dy_strides))
        return self._plain() and packed

    def product_over_pixels(self):
        """Whether the weight gradient is ``dy^T @ x`` over the rows of every pixel of the batch: plain, both operands
        channels last and packed, ``dw`` in C order."""
        def rows(strides, channels):
            return strides[1] == 1 and strides[3] == channels and (strides[2] == self.w * channels or self.h == 1) \
                and strides[0] == self.h * self.w * channels
        return self._plain() and rows(self.x_strides, self.c) and rows(self.dy_strides, self.o) \
            and self.dw_strides[:2] == (self.c, 1)

    def _shared_bytes(self, tp, tq):
        return (self.ob * dy_pitch(tp, tq) + self.cb * self.band(tp, tq)[3]) * self.acc_bytes

    def band(self, tp, tq):
        """The input rows and columns a tile of ``tp x tq`` output positions reads, and how they are laid out in
        shared memory: the pitch of a row and the size of one channel's plane. Threads of consecutive channels
        read distinct banks: planes of an odd size, or, where four columns are read at once (``vector``), of four
        times an odd size, with rows of a multiple of four that the last loads do not overrun."""
        rows = (tp - 1) * self.stride[0] + (self.r - 1) * self.dilation[0] + 1
        columns = (tq - 1) * self.stride[1] + (self.s - 1) * self.dilation[1] + 1
        if not self.vector:
            return rows, columns, columns, rows * columns | 1
        pitch = -(-max(columns, tq - 4 + 4 * self.loads_per_row) // 4) * 4
        plane = rows * pitch
        return rows, columns, pitch, plane + 4 if plane // 4 % 2 == 0 else plane

    def _tile(self):
        """The positions of a tile, ``(TP, TQ)``: rows of at most 32 (a multiple of 4, for vector loads), about 256
        positions in all, within ``SHARED_BYTES``, cutting the image with the fewest positions past its edge (a
        56-wide image in rows of 28, not 32 and 24 of 32); None where no tile fits."""
        widest = min(-(-self.q // 4) * 4, 32)
        for tq in sorted(range(4, widest + 1, 4), key=lambda t: (t < widest // 2, _overrun(self.q, t), -t)):
            rows = [t for t in range(1, min(self.p, max(1, 256 // tq)) + 1) if self._shared_bytes(t, tq) <= SHARED_BYTES]
            if rows:
                return min(rows, key=lambda t: (t <= max(rows) // 2, _overrun(self.p, t), -t)), tq
        return None


def dy_pitch(tp, tq):
    """The shared-memory elements of one output channel's tile of ``dy``: its positions, padded to four times an odd
    number, so that threads staging consecutive channels (from NHWC) write to 8 banks, not 2."""
    return tp * tq if tp * tq // 4 % 2 else tp * tq + 4


def _overrun(size, tile):
    """The positions tiles of ``tile`` cover past the end of an axis of ``size``."""
    return -(-size // tile) * tile - size


class SplitWgrad:
    """The partial-sum kernel and the kernel adding the partials, over fixed pointers."""

    def __init__(self, geometry):
        g = geometry
        self.geometry = g
        tp, tq = g.tile
        group_threads = (g.ob // g.opt) * g.cb
        self.ks = _divisor(tp, max(1, THREADS // group_threads))  # thread groups splitting a tile's rows
        outputs = g.o * g.cg * g.taps
        if self.ks * outputs * g.acc_bytes > PARTIAL_BYTES:
            self.ks = 1
        units = g.n * -(-g.p // tp) * -(-g.q // tq)
        channel_blocks = (g.cg // g.cb) * g.groups * (g.og // g.ob)
        fitting = max(1, PARTIAL_BYTES // (self.ks * outputs * g.acc_bytes))
        self.splits = max(1, min(units, fitting, -(-BLOCKS_PER_SM * _multiprocessors() // channel_blocks)))
        self.parts = self.splits * self.ks
        self.grid = (self.splits, g.cg // g.cb, g.groups * (g.og // g.ob))
        self.block = (group_threads * self.ks, 1, 1)
        self.partial = _partial_source(g, units, self.splits, self.ks, self.block[0])
        self.sum = _sum_source(g, self.parts)
        self.sum_blocks = -(-outputs // 32)
        self.workspace_bytes = aligned(self.parts * outputs * g.acc_bytes, ALIGNMENT)

    def describe(self):
        return (f"our weight-gradient kernel ({self.splits} blocks along the pixels, "
                f"their {self.parts} partial sums added in order)")

    def tune(self, pointers, stream):
        """Nothing to choose: the tiling is fixed by the shapes."""

    def call(self, x, dy, out, workspace, stream):
        """Run on device pointers, on CuPy's current stream (the executor's, wherever it runs or tunes a call)."""
        launcher(self.partial, (x, dy, workspace), self.grid, self.block)()
        launcher(self.sum, (workspace, out), self.sum_blocks, (32 * SUM_LANES,))()


class PixelGemm:
    """A 1x1 weight gradient of NHWC images as one cuBLASLt GEMM over every pixel of the batch, ``dw = dy^T @ x``
    (``(K, pixels) @ (pixels, C)``), written into ``dw``."""

    def __init__(self, geometry, tf32):
        g = geometry
        rows = g.n * g.p * g.q
        dy, x = Operand((rows, g.o), g.dtype, (g.o, 1)), Operand((rows, g.c), g.dtype, (g.c, 1))
        self.gemm = Gemm(GemmCall.product(dy, x, transpose_a=True, tf32=tf32))
        self.workspace_bytes = self.gemm.workspace_bytes

    def describe(self):
        return "one cuBLASLt GEMM over every pixel of the batch for this 1x1 weight gradient"

    def tune(self, pointers, stream):
        """Choose the GEMM's algorithm on ``pointers`` (``call``'s, without the stream)."""
        x, dy, out, workspace = pointers
        self.gemm.tune((dy, x, out, out, workspace, None, None), stream)

    def call(self, x, dy, out, workspace, stream):
        self.gemm.call(dy, x, out, out, workspace, None, None, stream)


class ImageGemms:
    """A 1x1 weight gradient as one batched cuBLASLt GEMM, ``dy[n] @ x[n]^T`` for every image ``n`` into the
    workspace, then the products added in order: cuDNN's deterministic float32 plans for it were 2 to 3
    times slower than its plans that add with atomics on the H100, and NCHW images' pixels are no one
    reduced axis of a single GEMM."""

    def __init__(self, geometry, tf32):
        g = geometry
        self.geometry = g
        pixels = g.p * g.q
        dy = Operand((g.n, g.o, pixels), g.dtype, g.dy_strides[:2] + (1,))
        x = Operand((g.n, g.c, pixels), g.dtype, g.x_strides[:2] + (1,))
        product = GemmCall.product(dy, x, transpose_b=True, tf32=tf32)
        self.gemm = Gemm(product)
        self.products_bytes = aligned(math.prod(product.shape) * g.acc_bytes, ALIGNMENT)
        self.workspace_bytes = self.products_bytes + self.gemm.workspace_bytes
        self.sum = _sum_source(g, g.n)
        self.sum_blocks = -(-g.o * g.c // 32)

    def describe(self):
        return (f"one batched cuBLASLt GEMM per image for this 1x1 weight gradient ({self.geometry.n} images), the "
                f"products added in order")

    def _gemm_pointers(self, x, dy, workspace):
        return dy, x, workspace, workspace, workspace + self.products_bytes, None, None

    def tune(self, pointers, stream):
        """Choose the GEMM's algorithm on ``pointers`` (``call``'s, without the stream)."""
        x, dy, _, workspace = pointers
        self.gemm.tune(self._gemm_pointers(x, dy, workspace), stream)

    def call(self, x, dy, out, workspace, stream):
        """Run on device pointers, on CuPy's current stream (the executor's, wherever it runs or tunes a call)."""
        self.gemm.call(*self._gemm_pointers(x, dy, workspace), stream)
        launcher(self.sum, (workspace, out), self.sum_blocks, (32 * SUM_LANES,))()


def _staged(acc, threads, total, where, inside, source, destination):
    """Statements copying ``total`` elements into shared memory, ``STAGED`` loads in flight per thread before their
    stores: element ``i`` is at ``where`` (statements), read from ``source`` if ``inside``, else zero."""
    rounds = -(-total // (threads * STAGED))
    return f"""    #pragma unroll 1
    for (int round = 0; round < {rounds}; ++round) {{
      {acc} staged[{STAGED}];
      #pragma unroll
      for (int j = 0; j < {STAGED}; ++j) {{
        const int i = tid + (round * {STAGED} + j) * {threads};
        {where}
        staged[j] = (i < {total} && {inside}) ? ({acc})ct_load({source}) : ({acc})0;
      }}
      #pragma unroll
      for (int j = 0; j < {STAGED}; ++j) {{
        const int i = tid + (round * {STAGED} + j) * {threads};
        {where}
        if (i < {total}) {destination} = staged[j];
      }}
    }}"""


def _partial_source(g, units, splits, ks, threads):
    """The kernel writing each block's (and row group's) sums into ``out0[part][o][c][tap]``."""
    tp, tq = g.tile
    rows, columns, pitch, plane = g.band(tp, tq)
    pitch_dy = dy_pitch(tp, tq)
    acc = "double" if g.acc_bytes == 8 else "float"
    sh, sw = g.stride
    dh, dw = g.dilation
    xn, xc, xh, xw = g.x_strides
    yn, yo, yp, yq = g.dy_strides
    groups_of_o = g.ob // g.opt
    tiles_across = -(-g.q // tq)
    tiles = -(-g.p // tp) * tiles_across
    if acc == "float":  # four positions of one channel's dy in one shared load
        load = [f"      const float4 d{o} = *reinterpret_cast<const float4*>(&dys[(og * {g.opt} + {o}) * {pitch_dy} "
                f"+ pl * {tq} + qq]);" for o in range(g.opt)]
        value = "d{o}.{lane}"
    else:
        load = [f"      const double* d{o} = &dys[(og * {g.opt} + {o}) * {pitch_dy} + pl * {tq} + qq];"
                for o in range(g.opt)]
        value = "d{o}[{u}]"
    # staged in the order of memory: position by position within a channel (NCHW), or across channels (NHWC)
    if yo == 1:
        dy_where = f"const int o = i % {g.ob}, cell = i / {g.ob}, p = p0 + cell / {tq}, q = q0 + cell % {tq};"
        dy_destination = f"dys[o * {pitch_dy} + cell]"
    else:
        dy_where = f"const int o = i / {tp * tq}, p = p0 + i % {tp * tq} / {tq}, q = q0 + i % {tq};"
        dy_destination = f"dys[i / {tp * tq} * {pitch_dy} + i % {tp * tq}]"
    if xc == 1:
        x_where = f"const int c = i % {g.cb}, cell = i / {g.cb}, y = h0 + cell / {columns}, x = w0 + cell % {columns};"
    else:
        x_where = (f"const int c = i / {rows * columns}, cell = i % {rows * columns}, y = h0 + cell / {columns}, "
                   f"x = w0 + cell % {columns};")
    products = []
    for r in range(g.r):
        if g.vector:  # the columns of row r the four positions' taps read, four at a time
            products += [f"        const float4 x{r}_{j} = *reinterpret_cast<const float4*>(&xr[{r * dh * pitch + 4 * j}]);"
                         for j in range(g.loads_per_row)]
        for u in range(4):
            for s in range(g.s):
                column = u * sw + s * dw
                read = f"x{r}_{column // 4}.{'xyzw'[column % 4]}" if g.vector else f"xr[{r * dh * pitch + column}]"
                products.append(f"        {{ const {acc} v = {read};")
                products += [f"          acc[{o}][{r * g.s + s}] += {value.format(o=o, u=u, lane='xyzw'[u])} * v;"
                             for o in range(g.opt)]
                products.append("        }")
    text = f"""  __shared__ __align__(16) {acc} dys[{g.ob * pitch_dy}];
  __shared__ __align__(16) {acc} xs[{g.cb * plane}];
  const int tid = threadIdx.x, cl = tid % {g.cb}, og = (tid / {g.cb}) % {groups_of_o}, k = tid / {g.cb * groups_of_o};
  const int group = blockIdx.z / {g.og // g.ob};
  const long long c0 = group * {g.cg} + blockIdx.y * {g.cb}, o0 = group * {g.og} + (blockIdx.z % {g.og // g.ob}) * {g.ob};
  {acc} acc[{g.opt}][{g.taps}];
  #pragma unroll
  for (int o = 0; o < {g.opt}; ++o)
    #pragma unroll
    for (int t = 0; t < {g.taps}; ++t) acc[o][t] = 0;
  const long long first = (long long)blockIdx.x * {units} / {splits}, last = (long long)(blockIdx.x + 1) * {units} / {splits};
  for (long long unit = first; unit < last; ++unit) {{
    const long long n = unit / {tiles};
    const int p0 = (int)(unit % {tiles}) / {tiles_across} * {tp}, q0 = (int)(unit % {tiles}) % {tiles_across} * {tq};
    __syncthreads();
{_staged(acc, threads, g.ob * tp * tq, dy_where, f"p < {g.p} && q < {g.q}",
         f"in1[n * {yn} + (o0 + o) * {yo} + p * {yp} + q * {yq}]", dy_destination)}
    const int h0 = p0 * {sh} - {g.low[0]}, w0 = q0 * {sw} - {g.low[1]};
{_staged(acc, threads, g.cb * rows * columns, x_where, f"y >= 0 && y < {g.h} && x >= 0 && x < {g.w}",
         f"in0[n * {xn} + (c0 + c) * {xc} + (long long)y * {xh} + (long long)x * {xw}]",
         f"xs[c * {plane} + cell / {columns} * {pitch} + cell % {columns}]")}
    __syncthreads();
    for (int pl = k; pl < {tp}; pl += {ks}) {{
      #pragma unroll 1
      for (int qq = 0; qq < {tq}; qq += 4) {{
{chr(10).join(load)}
        const {acc}* xr = &xs[cl * {plane} + pl * {sh * pitch} + qq * {sw}];
{chr(10).join(products)}
      }}
    }}
  }}
  {acc}* part = out0 + ((long long)blockIdx.x * {ks} + k) * {g.o * g.cg * g.taps};
  #pragma unroll
  for (int o = 0; o < {g.opt}; ++o)
    #pragma unroll
    for (int t = 0; t < {g.taps}; ++t)
      part[((o0 + og * {g.opt} + o) * {g.cg} + blockIdx.y * {g.cb} + cl) * {g.taps} + t] = acc[o][t];
"""
    operands = [Operand((), g.dtype, ()), Operand((), g.dtype, ())]
    return finished_source("split_wgrad", text, [Operand((), g.acc, ())], operands, (), None, None)


def _sum_source(g, parts):
    """The kernel adding the ``parts`` partial sums of each element of ``dw`` in order: ``SUM_LANES`` threads take
    every ``SUM_LANES``-th partial, then one adds their sums, lane by lane."""
    acc = "double" if g.acc_bytes == 8 else "float"
    outputs = g.o * g.cg * g.taps
    wo, wc, wr, ws = g.dw_strides
    text = f"""  __shared__ {acc} sums[{SUM_LANES}][33];
  const int lane = threadIdx.x % 32, j = threadIdx.x / 32;
  const long long e = (long long)blockIdx.x * 32 + lane;
  {acc} sum = 0;
  if (e < {outputs})
    for (int part = j; part < {parts}; part += {SUM_LANES}) sum += in0[(long long)part * {outputs} + e];
  sums[j][lane] = sum;
  __syncthreads();
  if (j == 0 && e < {outputs}) {{
    #pragma unroll
    for (int other = 1; other < {SUM_LANES}; ++other) sum += sums[other][lane];
    const long long o = e / {g.cg * g.taps}, c = e / {g.taps} % {g.cg}, r = e % {g.taps} / {g.s}, s = e % {g.s};
    out0[o * {wo} + c * {wc} + r * {wr} + s * {ws}] = ct_store<{storage_type(g.dtype)}>(sum);
  }}
"""
    return finished_source("split_wgrad_sum", text, [Operand((), g.dtype, ())], [Operand((), g.acc, ())], (), None,
                           None)
