"""A convolution as cuBLASLt GEMMs over its windows (im2col): a candidate cuDNN's plans are timed against.

A chunk of images at a time, the windows of the input are gathered into a column matrix in the
workspace, ``col[(c, *tap), (n, *position)]`` (``window_kernels.im2col_source``: padding reads as
zeros, strides and dilation are constant index arithmetic), and cuBLASLt multiplies it:

- forward: ``out[n] = w (K, C taps) @ col[:, n]``, one batched GEMM over the chunk's images for NCHW
  results, or ``out = col^T @ w^T`` over every pixel of the chunk for NHWC results;
- weight gradient: ``dw (K, C taps) += dy (K, pixels) @ col^T``, the chunks added in order into ``dw``
  (zeroed first), so the result is the same bits every run. An NCHW ``dy`` is gathered into
  ``(K, pixels)`` rows first, by the same kernel (one tap); an NHWC one is read where it is.

Chunks are as many images (a divisor of the batch) as keep the gathered matrices within
``COLUMN_BYTES``; without groups only. The data gradient stays cuDNN's. Only float32 and float64 take
part: on the H100, cuDNN's tensor-core kernels for float16 and bfloat16 were 2 to 10 times faster than
this in every layer of the convolution benchmarks, and the memory plan holds a candidate's workspace
whether it wins or not. In float32, without tensor cores, it won four weight gradients of the 1x1 layers
of bench_conv_layers_gpu.py (with 32 MiB chunks, also the strided layers' of bench_cnn_gpu.py's network,
for 19 MiB more device memory in its bfloat16 step).
"""

import math

import numpy as np

from ....memplan import aligned
from .cublaslt import Gemm, GemmCall
from ..codegen import Operand, channels_last_strides, contiguous_strides
from ..kernels import launcher
from ..window_kernels import im2col_source

COLUMN_BYTES = 8 << 20  # the most the gathered columns (and rows of dy) of one chunk may take
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ALIGNMENT = 256


def _chunk(batch, per_image_bytes):
    """The most images, dividing ``batch``, whose gathered matrices fit in ``COLUMN_BYTES``; None if one does not."""
    fitting = [b for b in range(1, batch + 1) if batch % b == 0 and b * per_image_bytes <= COLUMN_BYTES]
    return max(fitting) if fitting else None


def window_gemm(call):
    """The ``WindowGemm`` of ``ConvCall`` ``call``, or None where it has none: a data gradient, groups, a dtype not
    in ``DTYPES``, weights or a result stored other than the GEMM writes them, or images too large for
    ``COLUMN_BYTES`` one at a time."""
    mode, second, out = call.mode, call.second, call.out
    if mode == "dgrad" or call.groups != 1 or call.dtype not in DTYPES:
        return None
    taps = call.first.shape[1] * math.prod((second.shape if mode == "fprop" else out.shape)[2:])
    positions = math.prod((out.shape if mode == "fprop" else second.shape)[2:])
    per_image = taps * positions * call.dtype.itemsize
    if mode == "fprop":
        stored = out.strides in (contiguous_strides(out.shape), channels_last_strides(out.shape))
        if not stored or second.strides != contiguous_strides(second.shape):
            return None
        gathered_rows = False
    else:
        if out.strides != contiguous_strides(out.shape):
            return None
        gathered_rows = second.strides != channels_last_strides(second.shape)
        per_image += gathered_rows * second.shape[1] * positions * call.dtype.itemsize
    chunk = _chunk(call.first.shape[0], per_image)
    return None if chunk is None else WindowGemm(call, chunk, gathered_rows)


def _matrix(shape, dtype, strides=None):
    return Operand(shape, dtype, contiguous_strides(shape) if strides is None else strides)


class WindowGemm:
    """One convolution (fprop or wgrad, no groups) as im2col and cuBLASLt GEMMs, ``chunk`` images at a time, over
    fixed pointers. ``gathered_rows``: a weight gradient's ``dy`` is gathered into rows (it is not NHWC)."""

    def __init__(self, call, chunk, gathered_rows):
        mode, x, second, out = call.mode, call.first, call.second, call.out
        self.mode, self.chunk, self.batches = mode, chunk, x.shape[0] // chunk
        dtype = call.dtype
        itemsize = dtype.itemsize
        window = (second.shape if mode == "fprop" else out.shape)[2:]
        counts = (out.shape if mode == "fprop" else second.shape)[2:]
        taps, positions = x.shape[1] * math.prod(window), math.prod(counts)
        pixels = chunk * positions
        image = Operand((chunk,) + x.shape[1:], x.dtype, x.strides)
        lows = tuple(low for low, _ in call.padding)
        self.columns = im2col_source(image, window, call.strides, lows, call.dilation, counts)
        self.image_step = chunk * x.strides[0] * itemsize
        self.columns_bytes = aligned(taps * pixels * itemsize, ALIGNMENT)
        columns_t = _matrix((pixels, taps), dtype, (1, pixels))  # col^T, col being (taps, pixels) row-major
        self.rows, rows_bytes = None, 0
        if mode == "fprop":
            weights = _matrix((second.shape[0], taps), dtype)
            self.columns_first = out.strides == channels_last_strides(out.shape)
            if self.columns_first:  # out rows (pixels, K) = col^T @ w^T
                product = GemmCall.product(columns_t, weights, transpose_b=True, tf32=call.tf32)
            else:  # out[n] (K, positions) = w @ col[:, n]
                spread = _matrix((chunk, taps, positions), dtype, (positions, pixels, 1))
                product = GemmCall.product(weights, spread, tf32=call.tf32)
            self.out_step = chunk * math.prod(out.shape[1:]) * itemsize
        else:
            k = second.shape[1]
            if gathered_rows:  # gathered into (K, pixels) rows after the columns: im2col of dy with one tap
                ones = (1,) * len(counts)
                dy_image = Operand((chunk,) + second.shape[1:], dtype, second.strides)
                self.rows = im2col_source(dy_image, ones, ones, (0,) * len(counts), ones, counts)
                rows_bytes, row_strides = aligned(k * pixels * itemsize, ALIGNMENT), (pixels, 1)
            else:  # NHWC: dy's (pixels, K) rows read where they lie, as a transposed matrix
                row_strides = (1, k)
            product = GemmCall.product(_matrix((k, pixels), dtype, row_strides), columns_t, beta=1.0, tf32=call.tf32)
            self.dy_step = chunk * second.strides[0] * itemsize
            self.out_bytes = math.prod(out.shape) * itemsize
        self.scratch = self.columns_bytes + rows_bytes
        self.gemm = Gemm(product)
        self.workspace_bytes = self.scratch + self.gemm.workspace_bytes

    def describe(self):
        what = "weight gradient" if self.mode == "wgrad" else "forward convolution"
        return f"im2col and cuBLASLt GEMMs for this {what}, {self.chunk} images at a time"

    def _gemm_pointers(self, a, b, out, workspace, chunk=0):
        """``Gemm.call``'s pointers for chunk ``chunk`` of ``call``'s (the first, for tuning)."""
        columns, gemm_workspace = workspace, workspace + self.scratch
        if self.mode == "fprop":
            at = out + chunk * self.out_step
            factors = (columns, b) if self.columns_first else (b, columns)
            return (*factors, at, at, gemm_workspace, None, None)
        rows = workspace + self.columns_bytes if self.rows is not None else b + chunk * self.dy_step
        return rows, columns, out, out, gemm_workspace, None, None

    def tune(self, pointers, stream):
        """Choose the GEMM's algorithm on ``pointers`` (``call``'s, without the stream)."""
        self.gemm.tune(self._gemm_pointers(*pointers), stream)

    def call(self, a, b, out, workspace, stream):
        """Run on device pointers (``a``, ``b``: ``dnn_conv``'s operands) on ``stream`` (a pointer), which must be
        CuPy's current stream, as the executor's is wherever it runs or tunes a call: the gathers launch there."""
        import cupy

        if self.mode == "wgrad":
            cupy.cuda.runtime.memsetAsync(out, 0, self.out_bytes, stream)
        for chunk in range(self.batches):
            _launch(self.columns, a + chunk * self.image_step, workspace)
            if self.rows is not None:
                _launch(self.rows, b + chunk * self.dy_step, workspace + self.columns_bytes)
            self.gemm.call(*self._gemm_pointers(a, b, out, workspace, chunk), stream)


def _launch(source, image, destination):
    """Run the gather ``source`` from ``image`` into ``destination`` (pointers) on the current stream."""
    launcher(source, (image, destination))()
