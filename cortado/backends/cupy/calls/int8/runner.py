"""An ``int8_gemm`` as a call: the fastest of a few of our tensor-core kernels and cuBLASLt's int8 GEMM.

When a program is built, ``tilings.candidates`` names the tilings worth trying for the product's
shape; each becomes a kernel (``source``), and where cuBLASLt can take the operands (int8 both,
``K`` contiguous, as its int8 kernels require) its first heuristic algorithms join: cuBLASLt writes
the int32 sums into the workspace and a generated kernel applies the epilogue to them. All are
timed on the program's buffers and the fastest is kept (``describe`` names it, for ``explain``).
Every candidate computes the exact sums and the same epilogue code, so the choice changes the
time, never the bits. A call whose operands are not 16-byte aligned (a feed read in place) runs a
kernel that reads them element by element.
"""

from dataclasses import dataclass, replace

import numpy as np

from .....errors import BackendError
from .....exprgraph.ops import PARAM
from .....memplan import aligned
from ..cublaslt import _lt, handle, heuristic, matrix_layout, set_attribute
from ...codegen import Operand, contiguous_strides
from ...sources import kernel_source
from ...kernels import launcher, prepare
from ...launch import overlapping
from .. import choices
from ..timing import time_graph
from .epilogue import OPTIONS, aligned_rows
from .product import Product, counters, partial_bytes, vector_readable
from . import specialised
from .source import gemm_source
from .tilings import candidates, warpgroup_candidates

# our mma.sync tilings timed: on the H100 the fastest of 30 was always among the cost model's first 6 for the seed's
# shapes; of 40, for 784x256x128, the seventh (7% faster: benchmarks/results/h100/experiments/README.md)
CANDIDATES = 6
WARPGROUP_CANDIDATES = 4  # and wgmma tilings, on sm_90, for products large enough to fill their tiles
SPECIALISED_CANDIDATES = 4  # and warp-specialised ones fed by the tensor memory accelerator, with their other forms
LIBRARY_CANDIDATES = 3  # cuBLASLt's algorithms timed
LIBRARY_WORKSPACE = 4 << 20
ALIGNMENT = 256
# each candidate is timed this many times, in turn, and its fastest kept: a GPU that idled while the program
# compiled raises its clocks during the first round (on the H100 the candidates timed first measured 3.5 us in
# it, 2.7 us replayed later)
TIMING_ROUNDS = 2
VECTOR_ALIGNMENT = 16
_R_8I, _R_32I = 3, 10  # cudaDataType


def _well_formed(remembered, count):
    """Whether a remembered choice among ``count`` candidates is one: ``[its index, the candidates' times]``."""
    return (isinstance(remembered, list) and len(remembered) == 2 and isinstance(remembered[0], int)
            and 0 <= remembered[0] < count and isinstance(remembered[1], list) and len(remembered[1]) == count
            and all(isinstance(t, (int, float)) for t in remembered[1]))


def _multiprocessors():
    import cupy

    return cupy.cuda.Device().attributes["MultiProcessorCount"]


def _has_wgmma():
    """Whether the GPU runs sm_90a code (Hopper): ``wgmma`` is not in later architectures' base sets."""
    import cupy

    return cupy.cuda.Device().compute_capability == "90"


class _Kernel:
    """One of our kernels, for one tiling; its tile counters (split-K) in a buffer of its own, zero between calls."""

    def __init__(self, product, tiling, body, extras, out_strides):
        self.product, self.tiling = product, tiling
        self.source = gemm_source(product, tiling, body, extras, out_strides)
        self.workspace_bytes = partial_bytes(product, tiling)
        self.count = counters(product, tiling)
        self.counters = None
        self.out_strides = out_strides
        self.maps = (None, None)  # the warp-specialised kernel's operands (a, b; out where the TMA stores) and maps

    def call(self, a, b, extras, out, workspace, stream):
        import cupy

        if self.counters is None:
            self.counters = cupy.zeros(max(self.count, 1), np.uint32)
        arguments = (a, b, *extras, out, workspace, self.counters.data.ptr)
        if self.tiling.instruction == "tma":
            described = (a, b, out) if self.tiling.stored else (a, b)
            if self.maps[0] != described:  # a program calls with the same operands every step: encoded once
                self.maps = described, specialised.tensor_maps(self.product, self.tiling, a, b, out, self.out_strides)
            arguments += self.maps[1]
        launcher(self.source, arguments)()

    def describe(self):
        return f"int8 {self.tiling.instruction} kernel, {self.tiling}"


class _Library:
    """cuBLASLt's int8 GEMM (algorithm ``choice`` of its heuristic) into int32 sums, then the epilogue as a kernel
    over them; written straight into the result where the epilogue is the sums themselves."""

    def __init__(self, product, body, extras, out_strides, algorithms, choice):
        from nvmath.bindings.cublas import ComputeType

        lt = _lt()
        p = product
        self.desc = lt.matmul_desc_create(ComputeType.COMPUTE_32I, _R_32I)
        set_attribute(self.desc, lt.MatmulDescAttribute.TRANSA, 1)  # b, stored n x k, is cuBLASLt's transposed A
        set_attribute(self.desc, lt.MatmulDescAttribute.TRANSB, 0)
        self.layouts = [matrix_layout(_R_8I, p.k, p.n, p.b_strides[1]), matrix_layout(_R_8I, p.k, p.m, p.a_strides[0]),
                        matrix_layout(_R_32I, p.n, p.m, p.n), matrix_layout(_R_32I, p.n, p.m, p.n)]
        self.algorithms = heuristic(self.desc, self.layouts, LIBRARY_WORKSPACE, LIBRARY_CANDIDATES) \
            if algorithms is None else algorithms
        self.choice = choice
        self.scalars = np.array([1, 0], np.int32)
        sums = Operand((p.m, p.n), np.dtype(np.int32), contiguous_strides((p.m, p.n)))
        self.direct = body.op is PARAM  # the sums are the result (C order, as they are written)
        self.epilogue = None if self.direct else replace(kernel_source((body,), [sums, *extras]), options=OPTIONS)
        if self.epilogue is not None:
            prepare(self.epilogue)
        self.sums_bytes = 0 if self.direct else aligned(p.m * p.n * 4, ALIGNMENT)
        self.workspace_bytes = self.sums_bytes + int(self.algorithms["workspace_size"].max())

    def call(self, a, b, extras, out, workspace, stream):
        sums = out if self.direct else workspace
        first, second, c_layout, d_layout = self.layouts
        base = self.scalars.ctypes.data
        algorithm = self.algorithms.ctypes.data + self.choice * self.algorithms.itemsize
        _lt().matmul(handle(), self.desc, base, b, first, a, second, base + self.scalars.itemsize, sums, c_layout,
                     sums, d_layout, algorithm, workspace + self.sums_bytes,
                     int(self.algorithms["workspace_size"][self.choice]), stream)
        if self.epilogue is not None:
            source = self.epilogue
            launcher(source, (sums, *extras, out))()

    def describe(self):
        return f"cuBLASLt int8 GEMM (algorithm {self.choice})" + ("" if self.direct else " and an epilogue kernel")


def _library_takes(product, out_strides):
    """Whether cuBLASLt's int8 GEMM can take ``product``: int8 both, ``K`` contiguous in rows aligned as its int8
    kernels need, a result in C order."""
    p = product
    return (p.a_dtype == p.b_dtype == np.int8 and p.vector_a and p.vector_b and p.k % 4 == 0
            and tuple(out_strides) == contiguous_strides((p.m, p.n)))


def _library_candidates(product, body, extras, out_strides):
    """cuBLASLt's int8 GEMM with each of its first heuristic algorithms, where it takes the product (none where its
    heuristic offers none)."""
    if not _library_takes(product, out_strides):
        return []
    try:
        first = _Library(product, body, extras, out_strides, None, 0)
    except BackendError:
        return []
    return [first] + [_Library(product, body, extras, out_strides, first.algorithms, i)
                      for i in range(1, len(first.algorithms))]


def _time(candidate, pointers, stream):
    """Milliseconds a call of ``candidate`` takes; infinite where cuBLASLt refuses an algorithm its heuristic
    offered."""
    try:
        return time_graph(lambda: candidate.call(*pointers, stream.ptr), stream)
    except _lt().cuBLASLtError:
        return np.inf


@dataclass(frozen=True)
class Int8Call:
    """All an int8 product's call is made from: ``a`` (``m x k``) and ``b`` (``k x n``), each an ``Operand`` (shape,
    dtype, element strides), and whether each is a constant of the program, which no kernel writes; the epilogue's
    ``body`` (over ``param`` stand-ins: the int32 sums, then ``extras``, its other operands) and the result's
    ``out_strides``."""

    a: Operand
    b: Operand
    body: object
    extras: tuple
    out_strides: tuple
    constant_a: bool = False
    constant_b: bool = False


class Int8Gemm:
    """The int8 product ``Int8Call`` describes, over fixed pointers."""

    dtype = np.dtype(np.float32)  # what the executor fills buffers with before timing

    def __init__(self, call):
        a, b, body, operands, out_strides = call.a, call.b, call.body, list(call.extras), call.out_strides
        (m, k), n = a.shape, b.shape[1]
        b_rows = (b.strides[1], b.strides[0])  # B read as n rows of k
        product = Product(m, n, k, a.strides, b.strides, a.dtype, b.dtype, vector_readable(a.strides),
                          vector_readable(b_rows), call.constant_a, call.constant_b)
        multiprocessors = _multiprocessors()
        tilings = candidates(m, n, k, multiprocessors, CANDIDATES)
        if product.vector_a and product.vector_b and _has_wgmma():
            tilings += warpgroup_candidates(m, n, k, multiprocessors, WARPGROUP_CANDIDATES)
            if overlapping() and specialised.available():  # the driver's launch passes the tensor maps
                size = body.dtype.itemsize  # the TMA's stores and whole lines offered where they can store the rows
                tilings += warpgroup_candidates(m, n, k, multiprocessors, SPECIALISED_CANDIDATES, "tma",
                                                size if specialised.storable_rows(size, out_strides, n) else 0,
                                                size if aligned_rows(size, out_strides) else 0)
        own = [_Kernel(product, t, body, operands, out_strides) for t in tilings]
        for kernel in own:
            prepare(kernel.source)  # every candidate compiled side by side before they are timed
        self.candidates = own + _library_candidates(product, body, operands, out_strides)
        self.vector = product.vector_a or product.vector_b
        self.unaligned = _Kernel(replace(product, vector_a=False, vector_b=False), own[0].tiling, body, operands,
                                 out_strides) if self.vector else own[0]
        self.workspace_bytes = max(c.workspace_bytes for c in self.candidates)
        self.key = (product, own[0].source.name, tuple(c.describe() for c in self.candidates))
        self.choice = 0
        self.times = None

    def tune(self, pointers, stream):
        """Time every candidate on ``pointers`` (``call``'s arguments, whose contents it overwrites); keep the
        fastest, or take the one ``choices`` remembers for the call (its key names every candidate)."""
        remembered = choices.recall("int8", self.key)
        if _well_formed(remembered, len(self.candidates)):
            self.choice, self.times = remembered
            return
        rounds = [[_time(c, pointers, stream) for c in self.candidates] for _ in range(TIMING_ROUNDS)]
        times = [min(column) for column in zip(*rounds)]
        self.choice, self.times = int(np.argmin(times)), times
        choices.remember("int8", self.key, [self.choice, times])

    def call(self, a, b, extras, out, workspace, stream):
        """Run on device pointers (``extras``: the epilogue's operands) on ``stream`` (a pointer), which is also
        CuPy's current stream."""
        chosen = self.candidates[self.choice]
        stored = isinstance(chosen, _Kernel) and chosen.tiling.stored
        if (self.vector and (a % VECTOR_ALIGNMENT or b % VECTOR_ALIGNMENT)) or (stored and out % VECTOR_ALIGNMENT):
            chosen = self.unaligned
        chosen.call(a, b, extras, out, workspace, stream)

    def describe(self):
        chosen = self.candidates[self.choice]
        if self.times is None:
            return chosen.describe()
        others = sorted((t, c.describe()) for c, t in zip(self.candidates, self.times) if c is not chosen)
        runner_up = f"; next {others[0][1]}, {others[0][0] * 1e3:.2f} us" if others else ""
        return f"{chosen.describe()}, {self.times[self.choice] * 1e3:.2f} us{runner_up}"
