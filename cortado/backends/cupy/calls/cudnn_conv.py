"""Convolutions (``dnn_conv`` terms, described by a ``ConvCall``) as cuDNN calls, through
``nvidia-cudnn-frontend``'s graph API, into planned buffers.

Everything is decided when the program is built: cuDNN's operation graph for the convolution (its
operands' dims and strides as the program stores them, a 1-d convolution as a 2-d one of height 1),
its candidate execution plans, and the workspace the neediest of them asks for, which the memory
planner places in the arena. A call passes only pointers, so it can be captured in the step's
CUDA graph.

Candidates are cuDNN's heuristic choices (``heur_mode.A``, then its fallback list) that keep the
program's numerics: float32 never runs in TF32 unless the program asks for it, no candidate reduces
in a narrower type than float32, and none is nondeterministic (two runs give the same bits) unless
the program allows it (``deterministic=False``: cuDNN's weight gradients that add partial sums with
atomics are 2x faster on float32 images of few channels). A 1x1
convolution of stride 1 (forward, or its data gradient) is also a matrix product over the pixels,
one batched cuBLASLt GEMM, which is a candidate too; so is any float32 or float64 forward
convolution or weight gradient without groups as im2col and GEMMs (``conv_im2col``), and a float32 or
float64 weight gradient split along the pixels into partial sums added in order (``conv_wgrad``: a
kernel of our own, or for a 1x1 one a GEMM over the pixels of NHWC images or a batched GEMM per NCHW
image; where cuDNN builds no plan, the other candidates alone). When a program is built, up to
``CANDIDATES`` plans and the other candidates are timed on the program's own buffers (``timing``)
and the fastest kept; ``explain`` names it and the times that chose it. A choice is remembered, for the
process and on disk, by everything that describes the call, as cuBLASLt's are (``choices``).
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from ....errors import BackendError
from . import choices
from .cublaslt import Gemm, GemmCall
from ..codegen import Operand, channels_last_strides, contiguous_strides, same_layout
from .conv_nchw import InNchw, nchw_call
from .conv_epilogue import EpilogueKernel
from ..lowering.conv import epilogue_parts
from .conv_wgrad import split_wgrad
from .timing import time_graph
from .conv_im2col import window_gemm

CANDIDATES = 8  # the plans timed when a program is built, cuDNN's best guesses first
MARGIN = 0.03  # how much faster than cuDNN's first choice another plan must be to replace it
WORKSPACE_LIMIT = 64 << 20  # plans needing more scratch than this are not considered
DATA_TYPES = {"float16": "HALF", "bfloat16": "BFLOAT16", "float32": "FLOAT", "float64": "DOUBLE"}
GEMM = "gemm"  # the choice of the GEMM over the pixels, where cuDNN's are plan indices
WINDOWS = "windows"  # the choice of im2col and GEMMs (``conv_im2col``)
SPLIT = "split"  # the choice of our weight-gradient kernel (``conv_wgrad``)
NCHW = "nchw"  # the choice of the call in NCHW between copies of channels-last images (``conv_nchw``)
UNFUSED = "unfused"  # the choice of the convolution alone, then a generated kernel for its epilogue
LABELS = {GEMM: "the GEMM", WINDOWS: "im2col and GEMMs", SPLIT: "partial sums added in order", NCHW: "in NCHW",
          UNFUSED: "unfused"}  # the other candidates, in the order they are timed, as ``explain`` names their times
AGREEMENT = {2: 2e-2, 4: 1e-3, 8: 1e-9}  # by itemsize: how far a fused plan may stray, relative to the result
_handle = None
_graphs = {}  # a call's description -> (cuDNN graph, its operand tensors, its output tensor, runnable plan indices)


@dataclass(frozen=True)
class ConvCall:
    """All a convolution's call is made from: ``mode`` (``fprop``: image and weights; ``dgrad``: the result's gradient
    and weights; ``wgrad``: image and the result's gradient) of ``first`` and ``second`` into ``out`` (each an
    ``Operand``: shape, dtype, element strides), its geometry, and its ``epilogue`` adding ``extras`` (a bias vector,
    a residual) and a relu; float32 on TF32 tensor cores if ``tf32``, atomics allowed unless ``deterministic``."""

    mode: str
    first: Operand
    second: Operand
    out: Operand
    strides: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1
    epilogue: str = "none"
    extras: tuple = ()
    tf32: bool = False
    deterministic: bool = True

    @property
    def dtype(self):
        return np.dtype(self.out.dtype)

    def __str__(self):
        return f"{self.mode} convolution of {self.first.shape} and {self.second.shape} into {self.out.shape}"


def cudnn_module():
    try:
        import cudnn
    except ImportError as error:
        raise BackendError(f"the cupy backend runs convolutions with cuDNN, through nvidia-cudnn-frontend "
                           f"(pip install -e \".[gpu]\"): {error}") from None
    return cudnn


def handle():
    """The process's cuDNN handle, made on first use."""
    global _handle
    if _handle is None:
        _handle = cudnn_module().create_handle()
    return _handle


def packed(shape, strides):
    """Whether a tensor's strides are those of its elements packed in NCHW (C-order) or NHWC order: the
    layouts cuDNN's convolution engines read."""
    layouts = (contiguous_strides(shape),) + ((channels_last_strides(shape),) if len(shape) > 2 else ())
    return any(same_layout(shape, strides, expected) for expected in layouts)


def _four_dimensional(shape, strides):
    """A 1-d convolution's operand as a 2-d one's: a height of 1 inserted before its length."""
    if len(shape) != 3:
        return list(shape), list(strides)
    return [shape[0], shape[1], 1, shape[2]], [strides[0], strides[1], strides[2] * shape[2], strides[2]]


def _geometry(call):
    extra = len(call.out.shape) == 3  # a 1-d convolution gets a height of 1
    lows = [0] * extra + [low for low, _ in call.padding]
    highs = [0] * extra + [high for _, high in call.padding]
    return lows, highs, [1] * extra + list(call.strides), [1] * extra + list(call.dilation)


class Conv:
    """The call ``ConvCall`` describes, over fixed pointers: the fastest of cuDNN's plans and the other candidates;
    with an epilogue, cuDNN's fused plans or the convolution alone followed by a generated kernel for it
    (``UNFUSED``), whichever is faster."""

    def __init__(self, call):
        dtype = call.dtype
        if dtype.name not in DATA_TYPES:
            raise BackendError(f"{call}: cuDNN convolves {', '.join(DATA_TYPES)}, not {dtype}")
        self.epilogue = call.epilogue
        described = [_four_dimensional(x.shape, x.strides) for x in (call.first, call.second, call.out)]
        described += [_four_dimensional(*(_bias(x, call.out.strides) if len(x.shape) == 1 else (x.shape, x.strides)))
                      for x in call.extras]
        self.key = call
        self.size = math.prod(call.out.shape)
        self.dtype, self.nbytes = dtype, self.size * dtype.itemsize
        self.mode = call.mode
        self.unfused = self.epilogue_kernel = None
        self.dropped = set()  # fused plans found to disagree with the unfused result when tuned
        if self.epilogue != "none":
            self.unfused = Conv(replace(call, epilogue="none", extras=()))
            self.epilogue_kernel = EpilogueKernel(call)
        alone = self.epilogue == "none"  # the other candidates compute the convolution alone
        self.gemm, self.image_first = (_as_gemm(call) if alone else None) or (None, False)
        self.windows = window_gemm(call) if alone else None
        self.split = split_wgrad(call) if alone else None
        nchw = nchw_call(call) if alone else None
        self.nchw = InNchw(call, Conv(nchw[0]), nchw[1]) if nchw else None
        runners = (self.gemm, self.windows, self.split, self.nchw, self.unfused)
        others = [(choice, runner) for choice, runner in zip(LABELS, runners) if runner]
        if self.key not in _graphs:
            try:
                _graphs[self.key] = self._build(call, described)
            except BackendError:
                if not others:
                    raise
                _graphs[self.key] = None, (), None, [], 0  # no cuDNN plan: the other candidates
        self.graph, self.inputs, self.output, self.plans, workspace = _graphs[self.key]
        self.others = dict(others)  # the candidates other than cuDNN's plans, by the name of their choice
        self.workspace_bytes = max([workspace] + [r.workspace_bytes for r in self.others.values()])
        self.tuned_key = (self.key, self.gemm is not None, self.windows and self.windows.chunk)  # and its candidates
        # the first choice until tuned (``tune`` takes a remembered one): untuned, every level runs its first choice
        self.choice, self.times = (self.plans[0] if self.plans else others[0][0]), None

    def _build(self, call, described):
        """cuDNN's graph of this convolution, built with every plan that keeps the program's numerics."""
        cudnn = cudnn_module()
        dtype, mode = call.dtype, call.mode
        data_type = getattr(cudnn.data_type, DATA_TYPES[dtype.name])
        compute = cudnn.data_type.DOUBLE if dtype == np.float64 else cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=data_type, intermediate_data_type=compute, compute_data_type=compute,
                              handle=handle())
        (a_dims, a_strides), (b_dims, b_strides), (out_dims, out_strides), *extras = described
        a = graph.tensor(dim=a_dims, stride=a_strides, data_type=data_type)
        b = graph.tensor(dim=b_dims, stride=b_strides, data_type=data_type)
        lows, highs, strides, dilation = _geometry(call)
        geometry = dict(pre_padding=lows, post_padding=highs, stride=strides, dilation=dilation)
        if mode == "fprop":
            out = graph.conv_fprop(image=a, weight=b, **geometry)
        elif mode == "dgrad":
            out = graph.conv_dgrad(loss=a, filter=b, **geometry)
        else:
            out = graph.conv_wgrad(image=a, loss=b, **geometry)
        added = [graph.tensor(dim=dims, stride=strides, data_type=data_type) for dims, strides in extras]
        for tensor in added:  # the bias, then the residual, as the epilogue names them
            out = graph.add(a=out, b=tensor)
        if "relu" in epilogue_parts(self.epilogue):
            out = graph.relu(input=out)
        out.set_output(True).set_dim(out_dims).set_stride(out_strides).set_data_type(data_type)
        try:
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            notes = [cudnn.numerical_note.REDUCED_PRECISION_REDUCTION]
            if call.deterministic:
                notes.append(cudnn.numerical_note.NONDETERMINISTIC)
            if not (call.tf32 and dtype == np.float32):  # float32 on tensor cores is TF32, whatever the notes say
                notes.append(cudnn.numerical_note.DOWN_CONVERT_INPUTS)
                if dtype == np.float32:
                    notes.append(cudnn.numerical_note.TENSOR_CORE)
            graph.deselect_numeric_notes(notes)
            graph.deselect_workspace_greater_than(WORKSPACE_LIMIT)
            graph.check_support()
            graph.build_plans(cudnn.build_plan_policy.ALL)
        except Exception as error:  # cuDNN's own exception types differ between its engines
            raise BackendError(f"{call}: cuDNN cannot run it: {error}") from None
        plans, workspace = [], 0
        for index in range(graph.get_execution_plan_count()):
            try:
                need = graph.get_workspace_size_plan_at_index(index)
            except Exception:  # a plan that did not build
                continue
            plans.append(index)
            workspace = max(workspace, need)
            if len(plans) == CANDIDATES:
                break
        if not plans:
            raise BackendError(f"{call}: cuDNN built no plan for it")
        return graph, (a, b, *added), out, plans, workspace

    def describe(self):
        """Which call runs, and the times that chose it, for ``explain``."""
        if self.choice == GEMM:
            what = f"a cuBLASLt GEMM over the pixels for this 1x1 {self.mode}"
        elif self.choice in (WINDOWS, SPLIT, NCHW):
            what = self.others[self.choice].describe()
        elif self.choice == UNFUSED:
            what = f"{self.unfused.describe()}, then a generated kernel for its {self.epilogue}"
        else:
            fused = f" with its {self.epilogue} fused" if self.epilogue != "none" else ""
            what = f"cuDNN {self.mode}{fused} {self.graph.get_plan_name_at_index(self.choice)}"
        if self.times is None:
            return f"{what} (cuDNN's first choice of {len(self.plans)} plans, not timed)" if self.plans else what
        cudnn_best, others = self.times
        timed = [f"cuDNN's best of {len(self.plans)} plans {1e3 * cudnn_best:.1f} us"] if cudnn_best is not None else []
        timed += [f"{LABELS[c]} {1e3 * t:.1f} us" for c, t in others.items() if c != UNFUSED or self.plans]
        timed += [f"{len(self.dropped)} fused plans dropped: they disagreed with it unfused"] if self.dropped else []
        return f"{what} ({', '.join(timed)})" if timed else what

    def tune(self, pointers, stream):
        """Choose the fastest plan, the GEMM, im2col and GEMMs, our weight-gradient kernel, or the convolution alone
        and the epilogue's kernel, timed on ``pointers`` (``call``'s), whose contents it overwrites, or take the choice
        ``choices`` remembers for this call. cuDNN's first choice stays unless another is faster by ``MARGIN``."""
        remembered = self._remembered()
        if remembered is not None:  # and each other candidate takes the algorithm remembered for it
            self.choice, self.times = remembered
            for candidate, runner in self.others.items():
                self._tune_other(candidate, runner, pointers, stream)
            return
        times = [self._time(index, pointers, stream) for index in self.plans]
        if self.unfused is not None and self.plans:  # fused plans that disagree with it unfused are dropped
            self.choice = UNFUSED
            expected = self._result(pointers, stream)
            self.dropped = {index for index in self.plans if not self._agrees(index, expected, pointers, stream)}
            times = [np.inf if index in self.dropped else t for index, t in zip(self.plans, times)]
        choice, fastest, best_time = None, np.inf, None
        if times and not np.isinf(min(times)):
            best = int(np.argmin(times))
            best = best if times[best] < times[0] * (1 - MARGIN) else 0
            choice, best_time = self.plans[best], times[best]
            fastest = best_time * (1 - MARGIN)
        timed = {}
        for candidate, runner in self.others.items():
            self._tune_other(candidate, runner, pointers, stream)
            timed[candidate] = self._time(candidate, pointers, stream)
            if timed[candidate] < fastest:
                choice, fastest = candidate, timed[candidate]
        if choice is None:
            raise BackendError(f"none of the {len(self.plans)} cuDNN plans and {len(timed)} other candidates for a "
                               f"{self.mode} convolution ran")
        self.choice, self.times = choice, (best_time, timed)
        named = choice if choice in self.others else self.graph.get_plan_name_at_index(choice)
        choices.remember("cudnn", self.tuned_key, [named, best_time, timed])

    def _remembered(self):
        """``(choice, times)`` as ``choices`` remembers them for this call (a plan by its name, which its index
        among the plans built here gives back), or None where there are none or its candidates lack that choice."""
        stored = choices.recall("cudnn", self.tuned_key)
        if not (isinstance(stored, list) and len(stored) == 3 and isinstance(stored[0], str)
                and (stored[1] is None or isinstance(stored[1], (int, float))) and isinstance(stored[2], dict)
                and set(stored[2]) <= set(self.others) and all(isinstance(t, (int, float)) for t in stored[2].values())):
            return None  # none, or not one this call could have made
        named, best_time, timed = stored
        if named in self.others:
            return named, (best_time, timed)
        plans = [index for index in self.plans if self.graph.get_plan_name_at_index(index) == named]
        return (plans[0], (best_time, timed)) if plans else None

    def _tune_other(self, candidate, runner, pointers, stream):
        """Let ``runner``, the other ``candidate``, choose its own algorithm (a GEMM's, a convolution's alone) on
        ``pointers``: timed the first time a process meets the call, remembered after."""
        if candidate == GEMM:
            runner.tune(self._gemm_pointers(*pointers[:4]), stream)
        else:
            runner.tune(pointers[:4] + ((),) if candidate == UNFUSED else pointers[:4], stream)

    def _agrees(self, plan, expected, pointers, stream):
        """Whether fused ``plan`` computes ``expected`` (the convolution alone and the epilogue's kernel's result),
        within ``AGREEMENT`` of its largest magnitude: on the H100 one of cuDNN's fused NHWC plans returned
        another convolution's values."""
        self.choice = plan
        try:
            found = self._result(pointers, stream)
        except Exception:  # a plan that refuses to run is timed as infinite already
            return False
        scale = max(float(abs(expected).max()), 1e-30)
        return bool(abs(found - expected).max() <= AGREEMENT[self.dtype.itemsize] * scale)

    def _result(self, pointers, stream):
        """The result of one call with the current choice, as float32 on the device."""
        import cupy

        self.call(*pointers, stream.ptr)
        stream.synchronize()
        raw = cupy.ndarray((self.size,), cupy.uint16 if self.dtype.itemsize == 2 else self.dtype.name,
                           memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(pointers[2], self.nbytes, self), 0))
        if self.dtype.itemsize != 2:
            return raw.astype(cupy.float32)
        if self.dtype == np.float16:
            return raw.view(cupy.float16).astype(cupy.float32)
        return (raw.astype(cupy.uint32) << 16).view(cupy.float32)  # bfloat16: the high half of a float32

    def _time(self, choice, pointers, stream):
        """Milliseconds a call with ``choice`` takes; infinite if the library refuses it."""
        self.choice = choice
        try:
            return time_graph(lambda: self.call(*pointers, stream.ptr), stream)
        except Exception:  # a plan that builds may still refuse to run; cuDNN's errors have no common type
            return np.inf

    def _gemm_pointers(self, image, weights, out, workspace):
        """The GEMM's pointers (``Gemm.call``'s): its two factors, the product written over the output."""
        a, b = (image, weights) if self.image_first else (weights, image)
        return a, b, out, out, workspace, None, None

    def call(self, a, b, out, workspace, extras, stream):
        """Run on device pointers (``extras``: the epilogue's bias and residual) on ``stream`` (a pointer), which
        must be CuPy's current stream where the choice launches kernels of its own (the executor's always is)."""
        if self.choice == GEMM:
            self.gemm.call(*self._gemm_pointers(a, b, out, workspace), stream)
            return
        if self.choice in (WINDOWS, SPLIT, NCHW):
            self.others[self.choice].call(a, b, out, workspace, stream)
            return
        if self.choice == UNFUSED:
            self.unfused.call(a, b, out, workspace, (), stream)
            self.epilogue_kernel(out, extras)
            return
        cudnn = cudnn_module()
        cudnn.set_stream(handle(), stream)
        pack = {**dict(zip(self.inputs, (a, b, *extras))), self.output: out}
        self.graph.execute_plan_at_index(pack, workspace, self.choice, handle=handle())


def _bias(x, result_strides):
    """A bias vector of ``K`` channels as the ``(1, K, 1, ...)`` tensor cuDNN adds, its dims and its strides in the
    result's layout (NHWC engines read a broadcast operand's layout from its strides, sizes of 1 included)."""
    shape = (1, x.shape[0]) + (1,) * (len(result_strides) - 2)
    return shape, channels_last_strides(shape) if result_strides[1] == 1 else contiguous_strides(shape)


def _as_gemm(call):
    """A 1x1 convolution of stride 1 without padding, forward or data gradient, as a ``Gemm`` over its pixels; None
    for any other, and where neither the result is NCHW nor the image and the result are NHWC. Into NCHW it is
    one product per image, ``out[n] = w @ x[n]`` (``(K, C) @ (C, pixels)``; ``dx[n] = w^T @ dy[n]``); in NHWC one over every
    pixel of the batch, ``out = x @ w^T`` (``(N pixels, C) @ (C, K)``; ``dx = dy @ w``). Returns the ``Gemm``
    and whether the image is its first factor."""
    image, weights, out = call.first, call.second, call.out
    if call.mode == "wgrad" or call.groups != 1 or set(call.strides) != {1} or any(p != (0, 0) for p in call.padding) \
            or set(weights.shape[2:]) != {1}:
        return None
    pixels = math.prod(image.shape[2:])
    matrix = Operand(weights.shape[:2], weights.dtype, weights.strides[:2])
    if out.strides == contiguous_strides(out.shape):  # the image packed either way: its pixels one stride apart
        spread = Operand((image.shape[0], image.shape[1], pixels), image.dtype, image.strides[:2] + image.strides[-1:])
        return Gemm(GemmCall.product(matrix, spread, transpose_a=call.mode == "dgrad", tf32=call.tf32)), False
    if out.strides == channels_last_strides(out.shape) and image.strides == channels_last_strides(image.shape):
        rows_shape = (image.shape[0] * pixels, image.shape[1])
        rows = Operand(rows_shape, image.dtype, contiguous_strides(rows_shape))
        return Gemm(GemmCall.product(rows, matrix, transpose_b=call.mode == "fprop", tf32=call.tf32)), True
    return None
