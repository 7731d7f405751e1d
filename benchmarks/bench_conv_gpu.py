"""Convolutions on the GPU: single layers against torch's cuDNN, and a CNN's training step against torch and jax.

    python benchmarks/bench_conv_gpu.py [--parts layers,cnn] [--skip jax] [--out benchmarks/results/conv_gpu.json]
    python benchmarks/bench_conv_gpu.py --smoke [--parts layers,cnn]      (the cortado parts on the CPU, tiny shapes)

layers: single convolution layers, forward (``y = conv2d(x, w)``) and backward (the data and weight gradients
from a given output gradient ``dy``), in float16 and float32: the MobileNet 1x1 layers (56x56 64->128,
28x28 128->256, 28x28 256->256) at batch 1 and 32, and a 3x3 64->64 layer (padding 1) on 56x56 at batch 32.
Ours is ``ct.compile([conv2d(x, w)], inputs=[x, w], backend="cupy")``, backward
``ct.grad(sum(conv2d(x, w) * dy), [x, w])`` fed x, w and dy; torch's is ``F.conv2d``, backward one
``aten.convolution_backward`` with output_mask [True, True, False], in NCHW and in channels_last, TF32 off.
Both sides are timed from CUDA-graph replays, so that no Python launch overhead counts: ours replays the
graph its third call ran, torch a ``torch.cuda.CUDAGraph`` of the same work captured after a warm-up on a
side stream; R replays back to back between two events (R: as many as make about 20 ms, at least 20), the
median of 5 such measurements over R (a case whose replays took no longer than the host took to launch them
is marked launch-bound: its time is the launches'). Ours' results are checked against torch's NCHW results first
(max |ours - torch| / max |torch|: 1e-2 in float16, 1e-3 in float32), and the cuDNN plan (or GEMM) ours
chose for each convolution is read off ``program.explain()``.

cnn: one training step of a ResNet-style CNN without batch norm on 3x32x32 images, batch 128: a 3x3 stem to
32 channels, two residual blocks (conv, relu, conv, add the input, relu) at each of 32, 64 and 128 channels,
a 3x3 convolution of stride 2 between stages, every convolution with a bias and padding 1, global average
pooling, a linear layer to 10 classes, softmax cross-entropy on one-hot labels and plain SGD (learning rate
0.01) on every parameter; float32 and bfloat16. The contestants and their timing are bench_mlp_gpu.py's:
ours (``ct.compile(..., backend="cupy")``, CUDA graphs by default) and torch eager timed by CUDA events
around each step; torch.compile(mode="reduce-overhead") of the whole step; jax.jit with the parameters
donated, timed by the wall clock until ``block_until_ready`` and set against ours' wall time. Every
contestant starts from the same He-normal weights (zero biases) on the same random batch, and the losses
of its first two steps are checked against torch eager's (relative 1e-3 in float32, 3e-2 in bfloat16).
Memory: ours' ``device_bytes`` against torch eager's peak over one step.
"""

import argparse
import functools
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, print_table, require_gpu, versions  # noqa: E402
from bench_mlp_gpu import (  # noqa: E402
    COLUMNS, LOSS_TOLERANCE, MEMORY_TARGET, SUMMARY, WALL, check_losses, measured, release, table_rows, torch_batch,
    torch_on_gpu, wall_clock,
)
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

LAYERS = [  # (batch, in channels, out channels, side, kernel)
    (1, 64, 128, 56, 1), (32, 64, 128, 56, 1), (1, 128, 256, 28, 1), (32, 128, 256, 28, 1),
    (1, 256, 256, 28, 1), (32, 256, 256, 28, 1), (32, 64, 64, 56, 3),
]
LAYER_TOLERANCE = {"float16": 1e-2, "float32": 1e-3}  # max |ours - torch| / max |torch|
TIMED_MS, MIN_REPLAYS, ROUNDS = 20, 20, 5  # replays timed at once: about TIMED_MS of work, at least MIN_REPLAYS
LAUNCH_BOUND = 1.25  # a replay within this factor of the host's time per launch was likely paced by the launches

CLASSES, STAGES, BLOCKS = 10, (32, 64, 128), 2  # STAGES: channels of each stage, each at half the last's side
CNN_BATCH, IMAGE_SIDE, LEARNING_RATE = 128, 32, 0.01
CNN_WARMUP, CNN_REPEATS = 10, 100
SMOKE_LAYERS = [(2, 4, 8, 6, 1), (2, 4, 4, 6, 3)]
SMOKE_BATCH, SMOKE_SIDE = 2, 8
PARTS = ("layers", "cnn")


# -- layers ----------------------------------------------------------------------------------------


def layer_name(layer):
    """``b32 64->128 56x56 1x1``: batch, channels, image side and kernel, as the tables and logs name a layer."""
    n, c, k, side, r = layer
    return f"b{n} {c}->{k} {side}x{side} {r}x{r}"


def layer_values(layer, rng):
    """x, w and dy in float64, drawn once for a layer and cast to each side's dtype (w scaled to keep y near 1)."""
    n, c, k, side, r = layer
    return {"x": rng.standard_normal((n, c, side, side)), "w": rng.standard_normal((k, c, r, r)) / np.sqrt(c * r * r),
            "dy": rng.standard_normal((n, k, side, side))}


def layer_terms(layer, dtype, backward):
    """Our layer as ``(outputs, inputs)``: the convolution, or its data and weight gradients from a fed ``dy``."""
    n, c, k, side, r = layer
    x, w = ct.var("x", (n, c, side, side), dtype), ct.var("w", (k, c, r, r), dtype)
    y = ct.conv2d(x, w, padding=r // 2)
    if not backward:
        return [y], [x, w]
    dy = ct.var("dy", y.shape, dtype)
    return ct.grad(ct.sum(y * dy), [x, w]), [x, w, dy]


def relative_error(results, reference):
    """max |result - reference| / max |reference| over the outputs, in float64."""
    errors = []
    for result, expected in zip(results, reference):
        result, expected = np.asarray(result, np.float64), np.asarray(expected, np.float64)
        errors.append(float(np.abs(result - expected).max() / np.abs(expected).max()))
    return max(errors)


PLAN = re.compile(r"  \[([^\[\]]*)\]  -> ")  # explain's bracketed note on a kernel's line: the library call it chose


def chosen_plans(program):
    """What each ``dnn_conv`` kernel of ``program`` runs (a cuDNN plan or a GEMM), as ``explain()`` names it."""
    lines = [line for line in program.explain().splitlines() if "dnn_conv(" in line]
    return [match.group(1) for match in map(PLAN.search, lines) if match]


def replay_us(launch, record, elapsed_ms):
    """Microseconds one replay of a captured graph takes: ``launch()`` R times back to back between two events
    (``record()`` makes one, ``elapsed_ms(start, end)`` waits for the end), R enough for about ``TIMED_MS`` of work
    and at least ``MIN_REPLAYS``, the median of ``ROUNDS`` such measurements over R. Also R, and the host's
    microseconds per launch over the first ``MIN_REPLAYS`` (too few to fill the launch queue): a replay that takes
    no longer than that on the device was paced by its launches, not by its work."""

    def per_replay_ms(replays):
        start = record()
        began = time.perf_counter()
        for _ in range(replays):
            launch()
        host_ms = 1e3 * (time.perf_counter() - began)
        end = record()
        return elapsed_ms(start, end) / replays, host_ms / replays

    estimate, launch_ms = per_replay_ms(MIN_REPLAYS)
    replays = max(MIN_REPLAYS, math.ceil(TIMED_MS / estimate))
    rounds = [per_replay_ms(replays)[0] for _ in range(ROUNDS)]
    return {"us": 1e3 * statistics.median(rounds), "replays": replays, "launch_us": 1e3 * launch_ms}


def cupy_events(stream):
    """``replay_us``'s events for a CuPy stream: recorded on it, where our graph replays."""
    import cupy

    def elapsed_ms(start, end):
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)

    return stream.record, elapsed_ms


def torch_events():
    """``replay_us``'s events for torch: recorded on torch's current stream, where ``CUDAGraph.replay`` launches."""
    import torch

    def record():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(start, end):
        end.synchronize()
        return start.elapsed_time(end)

    return record, elapsed_ms


def ours_layer(layer, dtype, backward, values):
    """Our program for the layer fed CuPy arrays: its outputs, the replay time of its captured graph, its plans."""
    import cupy

    outputs, inputs = layer_terms(layer, dtype, backward)
    program = ct.compile(outputs, inputs=inputs, backend="cupy")
    feeds = {v.name: cupy.asarray(values[v.name].astype(dtype)) for v in inputs}
    for _ in range(3):  # the first call runs kernel by kernel, the second captures the step's graph, the third replays it
        results = program(**feeds)
    results = [cupy.asnumpy(r) for r in results]
    (graph,) = program._executor.graphs.values()
    stream = program._executor.stream
    timed = replay_us(lambda: graph.launch(stream), *cupy_events(stream))
    return {**timed, "plans": chosen_plans(program), "outputs": results}


def torch_graph(work):
    """A ``torch.cuda.CUDAGraph`` of ``work()`` captured as torch documents it, after a warm-up on a side stream
    (which also lets cuDNN choose its algorithms outside the capture), and the tensors the graph writes."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = work()
    return graph, outputs


def torch_layer(layer, dtype, backward, values, channels_last):
    """torch's layer in NCHW or channels_last: its outputs and the replay time of a CUDA graph of it."""
    torch = torch_on_gpu()
    r = layer[-1]
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x, w, dy = (torch.tensor(values[name], dtype=getattr(torch, dtype), device="cuda").contiguous(memory_format=layout)
                for name in ("x", "w", "dy"))
    padding = [r // 2] * 2

    def work():
        if backward:  # grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
            # groups, output_mask: the data and weight gradients, no bias gradient
            return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], padding, [1, 1], False, [0, 0], 1,
                                                       [True, True, False])[:2]
        return (torch.nn.functional.conv2d(x, w, padding=padding),)

    graph, outputs = torch_graph(work)
    graph.replay()
    results = [t.double().cpu().numpy() for t in outputs]
    return {**replay_us(graph.replay, *torch_events()), "outputs": results}


def layer_case(layer, dtype, backward):
    """One layer, dtype and pass: torch in NCHW and channels_last, then ours, checked against torch's NCHW results.
    Ours runs last: a fault in a new backend can take the CUDA context down with it, and torch is measured by then."""
    values = layer_values(layer, np.random.default_rng(0))
    sides = {}
    for name, measure in (("torch_nchw", functools.partial(torch_layer, channels_last=False)),
                          ("torch_nhwc", functools.partial(torch_layer, channels_last=True)), ("ours", ours_layer)):
        sides[name] = measure(layer, dtype, backward, values)
        release()
    error = relative_error(sides["ours"]["outputs"], sides["torch_nchw"]["outputs"])
    mismatch = not error <= LAYER_TOLERANCE[dtype]  # NaN too
    if mismatch:
        log(f"!!! MISMATCH: {layer_name(layer)} {dtype}: ours against torch's: relative error {error:.3e} > "
            f"{LAYER_TOLERANCE[dtype]:g} !!!")
    ours, nchw, nhwc = sides["ours"]["us"], sides["torch_nchw"]["us"], sides["torch_nhwc"]["us"]
    return {"ours_us": ours, "torch_nchw_us": nchw, "torch_nhwc_us": nhwc, "torch_nchw_over_ours": nchw / ours,
            "torch_nhwc_over_ours": nhwc / ours, "rel_error": error, "mismatch": mismatch, "plans": sides["ours"]["plans"],
            "replays": {name: side["replays"] for name, side in sides.items()},
            "launch_us": {name: side["launch_us"] for name, side in sides.items()},
            "launch_bound": [name for name, side in sides.items() if side["us"] < LAUNCH_BOUND * side["launch_us"]]}


def layer_note(case):
    """The printed note on a case: its failure, or a mismatch and the sides whose replays their launches paced."""
    if "error" in case:
        return "ERROR " + case["error"].splitlines()[0][:60]
    notes = ["MISMATCH"] if case["mismatch"] else []
    if case["launch_bound"]:
        notes.append("launch-bound: " + ", ".join(case["launch_bound"]))
    return "; ".join(notes)


def layers_part():
    """Every layer, dtype and pass; a failed case is recorded and the run goes on."""
    cases = []
    for layer in LAYERS:
        for dtype in LAYER_TOLERANCE:
            for backward in (False, True):
                kind = "backward" if backward else "forward"
                case = attempt(f"{layer_name(layer)} {dtype} {kind}", layer_case, layer, dtype, backward)
                cases.append({"layer": layer_name(layer), "dtype": dtype, "pass": kind, **case, "note": layer_note(case)})
    return {"timed_ms": TIMED_MS, "min_replays": MIN_REPLAYS, "rounds": ROUNDS, "tolerance": LAYER_TOLERANCE,
            "cases": cases}


LAYER_COLUMNS = [("layer", "layer", "24s"), ("dtype", "dtype", "8s"), ("pass", "pass", "9s"),
                 ("ours us", "ours_us", "9.1f"), ("torch us", "torch_nchw_us", "9.1f"),
                 ("torch nhwc us", "torch_nhwc_us", "14.1f"), ("nchw/ours", "torch_nchw_over_ours", "10.2f"),
                 ("nhwc/ours", "torch_nhwc_over_ours", "10.2f"), ("rel err", "rel_error", "9.1e")]


# -- cnn -------------------------------------------------------------------------------------------


@dataclass
class CnnWork:
    """One case: the dtype, the initial weights and the batch every contestant shares, and the step counts
    (``warmup`` and ``repeats``, which bench_mlp_gpu's ``measured`` reads)."""

    dtype: str
    values: dict
    x: np.ndarray
    y: np.ndarray
    warmup: int
    repeats: int


def units():
    """The network after its stem, in order: ``("down", name, in channels, out channels)``, a convolution of stride 2
    into the next stage, or ``("block", name, channels, channels)``, a residual block of two convolutions."""
    for s, channels in enumerate(STAGES):
        if s:
            yield "down", f"down{s}", STAGES[s - 1], channels
        for b in range(BLOCKS):
            yield "block", f"stage{s}_block{b}", channels, channels


def cnn_shapes():
    """Every parameter's shape by name, in the order the network uses them: each 3x3 convolution's weights (OIHW)
    and bias, then the classifier's weights (in, out) and bias."""
    shapes = {}

    def conv(name, c_in, c_out):
        shapes[name + "_w"], shapes[name + "_b"] = (c_out, c_in, 3, 3), (c_out,)

    conv("stem", 3, STAGES[0])
    for kind, name, c_in, c_out in units():
        for suffix in ("",) if kind == "down" else ("_1", "_2"):
            conv(name + suffix, c_in, c_out)
    shapes["fc_w"], shapes["fc_b"] = (STAGES[-1], CLASSES), (CLASSES,)
    return shapes


def resnet(x, conv, relu):
    """The network's convolutional part on images ``x``, in any of the three libraries: ``conv(h, name, stride)`` is
    its 3x3 convolution of padding 1 with parameters ``name_w`` and ``name_b``, ``relu`` its relu."""
    h = relu(conv(x, "stem", 1))
    for kind, name, _, _ in units():
        if kind == "down":
            h = relu(conv(h, name, 2))
        else:
            h = relu(conv(relu(conv(h, name + "_1", 1)), name + "_2", 1) + h)
    return h


def cortado_cnn(batch, side, dtype):
    """Ours: the loss of the network on a batch of images and one-hot labels, ``(loss, x, y, parameters)``."""
    x, y = ct.var("x", (batch, 3, side, side), dtype), ct.var("y", (batch, CLASSES), dtype)
    params = {name: ct.var(name, shape, dtype) for name, shape in cnn_shapes().items()}

    def conv(h, name, stride):
        return ct.conv2d(h, params[name + "_w"], stride=stride, padding=1) + ct.reshape(params[name + "_b"], (-1, 1, 1))

    logits = ct.mean(resnet(x, conv, ct.relu), axis=(2, 3)) @ params["fc_w"] + params["fc_b"]
    return ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * y, axis=1)), x, y, list(params.values())


def torch_cnn_loss(params, x, y):
    """The same network and loss in torch (``params``: tensors by name), in functions torch.compile traces as they are."""
    import torch.nn.functional as F

    def conv(h, name, stride):
        return F.conv2d(h, params[name + "_w"], params[name + "_b"], stride=stride, padding=1)

    logits = resnet(x, conv, F.relu).mean(dim=(2, 3)) @ params["fc_w"] + params["fc_b"]
    return (logits.logsumexp(dim=1) - (logits * y).sum(dim=1)).mean()


def jax_cnn_loss(params, x, y, precision):
    """The same network and loss in jax; ``precision`` for every convolution and matmul (HIGHEST: float32 in float32)."""
    import jax
    import jax.numpy as jnp

    def conv(h, name, stride):
        out = jax.lax.conv_general_dilated(h, params[name + "_w"], (stride, stride), ((1, 1), (1, 1)),
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=precision)
        return out + params[name + "_b"][:, None, None]

    logits = jnp.matmul(jnp.mean(resnet(x, conv, jax.nn.relu), axis=(2, 3)), params["fc_w"], precision=precision)
    logits = logits + params["fc_b"]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.sum(logits * y, axis=1))


def cnn_workload(dtype, batch=CNN_BATCH, side=IMAGE_SIDE, warmup=CNN_WARMUP, repeats=CNN_REPEATS):
    """He-normal weights (std sqrt(2 / fan_in)), zero biases, a standard normal batch and random one-hot labels,
    drawn once with NumPy (seed 0) in float32 and cast by each contestant."""
    rng = np.random.default_rng(0)
    values = {}
    for name, shape in cnn_shapes().items():
        fan_in = shape[0] if name == "fc_w" else math.prod(shape[1:])  # the classifier is (in, out); a conv OIHW
        values[name] = (np.zeros(shape, np.float32) if name.endswith("_b") else
                        rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2 / fan_in)))
    x = rng.standard_normal((batch, 3, side, side), dtype=np.float32)
    y = np.zeros((batch, CLASSES), np.float32)
    y[np.arange(batch), rng.integers(0, CLASSES, batch)] = 1
    return CnnWork(dtype, values, x, y, warmup, repeats)


def cortado_cnn_step(work, backend):
    """Our whole training step (forward, backward, SGD on every parameter) as one program; a call returns the loss."""
    batch, _, side, _ = work.x.shape
    loss, x, y, params = cortado_cnn(batch, side, work.dtype)
    grads = ct.grad(loss, params)
    return ct.compile(loss, inputs=[x, y], state={p: work.values[p.name].astype(p.dtype) for p in params},
                      updates={p: p - LEARNING_RATE * g for p, g in zip(params, grads)}, backend=backend)


def torch_params(torch, work, requires_grad=False):
    """The shared initial parameters as torch tensors on the GPU in the case's dtype, by name."""
    dtype = getattr(torch, work.dtype)
    return {name: torch.tensor(v, dtype=dtype, device="cuda", requires_grad=requires_grad) for name, v in work.values.items()}


def torch_eager(work):
    """torch eager: ``loss.backward()``, then ``p -= lr * p.grad`` and ``p.grad = None``; and its peak memory over one
    step, over what was allocated before its parameters (the batch comes before)."""
    torch = torch_on_gpu()
    x, y = torch_batch(torch, work)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    params = torch_params(torch, work, requires_grad=True)

    def step():
        loss = torch_cnn_loss(params, x, y)
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= LEARNING_RATE * p.grad
                p.grad = None
        return loss.detach()

    first = float(step())
    peak = torch.cuda.max_memory_allocated() - before
    return {**measured(step, clock("torch"), "cuda events (torch)", work, [first]),
            "peak_bytes": peak, "batch_bytes": x.nbytes + y.nbytes}


def torch_compiled(work):
    """torch.compile(mode="reduce-overhead") of the whole step in one graph, as bench_mlp_gpu.py's; it also counts
    the times inductor gave up on CUDA graphs."""
    torch = torch_on_gpu()
    from torch._dynamo.utils import counters

    x, y = torch_batch(torch, work)
    params = torch_params(torch, work)
    for p in params.values():
        torch._dynamo.mark_static_address(p)  # a CUDA graph may update it in place

    def whole_step(params, x, y):
        grads, loss = torch.func.grad_and_value(torch_cnn_loss)(params, x, y)
        for name, p in params.items():
            p -= LEARNING_RATE * grads[name]
        return loss

    compiled = torch.compile(whole_step, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def call():
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs may be overwritten
        return compiled(params, x, y)

    skips = counters["inductor"]["cudagraph_skips"]
    result = measured(call, clock("torch"), "cuda events (torch)", work)
    return {**result, "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips}


def jax_jit(work):
    """jax.jit of the step with the parameters donated; each call waits for its results (the wall clock times it)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # not 75% of the GPU up front: others share it
    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "gpu":
        raise RuntimeError(f"jax runs on {jax.default_backend()}, not on a GPU")
    precision = jax.lax.Precision.HIGHEST if work.dtype == "float32" else None
    loss_fn = functools.partial(jax_cnn_loss, precision=precision)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, {name: p - LEARNING_RATE * grads[name] for name, p in params.items()}

    dtype = jnp.dtype(work.dtype)
    params = {name: jnp.asarray(v, dtype=dtype) for name, v in work.values.items()}
    x, y = jnp.asarray(work.x, dtype=dtype), jnp.asarray(work.y, dtype=dtype)

    def call():
        nonlocal params
        loss, params = step(params, x, y)
        return jax.block_until_ready((loss, params))[0]

    return measured(call, wall_clock(), WALL, work)


def cortado_contestant(work):
    """Ours: the step compiled for the GPU, fed CuPy arrays; its loss is read from its own output buffer."""
    import cupy

    try:
        step = cortado_cnn_step(work, "cupy")
    except ct.DTypeError as error:
        return {"error": "unsupported dtype", "detail": str(error)}
    dtype = step.state["fc_w"].dtype  # the program's own (NumPy knows bfloat16 only by the type cortado gives it)
    x, y = cupy.asarray(work.x.astype(dtype)), cupy.asarray(work.y.astype(dtype))
    result = measured(lambda: step(x=x, y=y), clock("cupy"), "cuda events (cupy)", work)
    return {**result, "device_bytes": step.device_bytes, "arena_bytes": step.memory.peak_bytes,
            "plans": chosen_plans(step)}


# Ours runs last: a fault in a new backend can take the CUDA context down with it, and the peers are measured by then.
CNN_CONTESTANTS = {"torch": torch_eager, "torch.compile": torch_compiled, "jax": jax_jit, "cortado": cortado_contestant}


def cnn_case(dtype, skip):
    """Every contestant on one dtype, their losses checked, their times set against ours, and the memory."""
    work = cnn_workload(dtype)
    label = f"cnn {dtype}"
    results = {}
    for name, contestant in CNN_CONTESTANTS.items():
        if name not in skip:
            results[name] = attempt(f"{label}: {name}", contestant, work)
            release()
    check_losses(label, results, LOSS_TOLERANCE[dtype])
    ours, eager = results.get("cortado", {}), results.get("torch", {})
    for result in results.values():
        if "ms" in result and "ms" in ours:
            result["peer_over_ours"] = result["ms"] / (ours["wall_ms"] if result["timer"] == WALL else ours["ms"])
    case = {"batch": CNN_BATCH, "image": f"3x{IMAGE_SIDE}x{IMAGE_SIDE}", "stages": STAGES, "blocks": BLOCKS,
            "warmup": work.warmup, "repeats": work.repeats, "contestants": results}
    if "device_bytes" in ours and "peak_bytes" in eager:
        case["memory"] = {"ours_bytes": ours["device_bytes"], "torch_bytes": eager["peak_bytes"],
                          "ours_over_torch": ours["device_bytes"] / eager["peak_bytes"], "target": MEMORY_TARGET}
    return case


def cnn_part(skip):
    """Both dtypes of the CNN's step; a failed case is recorded and the run goes on."""
    cases = [{"size": "cnn", "dtype": dtype, **attempt(f"cnn {dtype}", cnn_case, dtype, skip)} for dtype in LOSS_TOLERANCE]
    return {"learning_rate": LEARNING_RATE, "loss_tolerance": LOSS_TOLERANCE, "cases": cases}


MEMORY_COLUMNS = SUMMARY[:4]  # case and memory: the MLP's GEMM floor columns have no counterpart here

NOTES = {
    "layers": "ours: ct.compile(..., backend='cupy') with its defaults, the replays of the graph its third call ran, "
              "between CuPy events on the program's stream; torch: a torch.cuda.CUDAGraph of F.conv2d (forward) or one "
              "aten.convolution_backward (backward, data and weight gradients), NCHW and channels_last, TF32 off, its "
              "replays between torch events; each: R replays back to back (about 20 ms, at least 20), the median of 5 "
              "over R; ratios: torch's time over ours (above 1: ours is faster); plans: what ours chose for each "
              "convolution, as program.explain() names it; rel_error: max |ours - torch NCHW| / max |torch NCHW|; "
              "launch_us: the host's time per launch (over the first 20); launch_bound: the sides whose replays took "
              "under 1.25x that on the device, so their launches, not their work, set their time",
    "cortado": "ct.compile(..., backend='cupy') of the whole step (CUDA graphs, the default), fed CuPy arrays in its "
               "dtype; each convolution's cuDNN plan (or GEMM) timed and chosen when built, named in plans",
    "torch": "eager: loss.backward(), then p -= lr * p.grad and p.grad = None; F.conv2d with its bias; TF32 off",
    "torch.compile": "mode='reduce-overhead', fullgraph=True, dynamic=False, of the whole step: "
                     "torch.func.grad_and_value, then p -= lr * g in place on parameters marked with "
                     "torch._dynamo.mark_static_address; cudagraph_skips counts fallbacks",
    "jax": "jax.jit with donate_argnums=0; jax.lax.conv_general_dilated in NCHW/OIHW/NCHW; precision HIGHEST on "
           "every float32 convolution and matmul; timed by the wall clock until block_until_ready (ratios against "
           "ours' wall time)",
    "timing (cnn)": "each step timed alone between CUDA events on the current stream (jax: the wall clock), median of "
                    "the timed steps after the warm-up; the first two steps' losses checked against torch eager's",
    "memory": "torch: max_memory_allocated during one eager step minus memory_allocated before its parameters were "
              "made (the batch, batch_bytes, comes before); ours: device_bytes (arena, state, outputs, constants, "
              "workspaces; CuPy feeds are read in place)",
}


# -- the command line ------------------------------------------------------------------------------


def smoke(parts):
    """The cortado parts on the CPU (backend "numpy") at tiny shapes, no GPU needed: each layer's program against
    the reference interpreter, and two CNN training steps in each dtype, timed by the wall clock."""
    if "layers" in parts:
        for layer in SMOKE_LAYERS:
            for dtype in LAYER_TOLERANCE:
                for backward in (False, True):
                    smoke_layer(layer, dtype, backward)
    if "cnn" in parts:
        for dtype in LOSS_TOLERANCE:
            smoke_cnn(dtype)


def smoke_layer(layer, dtype, backward):
    """One layer's program on the CPU against the reference interpreter, and the plan parsing on its explain()."""
    outputs, inputs = layer_terms(layer, dtype, backward)
    program = ct.compile(outputs, inputs=inputs, backend="numpy")
    values = layer_values(layer, np.random.default_rng(0))
    feeds = {v.name: values[v.name].astype(dtype) for v in inputs}
    error = relative_error(program(**feeds), ct.evaluate(outputs, feeds))
    verdict = "ok" if error <= LAYER_TOLERANCE[dtype] else "MISMATCH"
    log(f"{layer_name(layer)} {dtype} {'backward' if backward else 'forward'}: relative error {error:.1e} against "
        f"ct.evaluate, {verdict}; plans {chosen_plans(program)}")


def smoke_cnn(dtype):
    """The CNN's step built as on the GPU but for NumPy, at a tiny batch and image, run and timed by ``measured``."""
    work = cnn_workload(dtype, SMOKE_BATCH, SMOKE_SIDE, warmup=1, repeats=2)
    step = cortado_cnn_step(work, "numpy")
    own = step.state["fc_w"].dtype
    result = measured(functools.partial(step, x=work.x.astype(own), y=work.y.astype(own)), wall_clock(), WALL, work)
    log(f"cnn {dtype}, batch {SMOKE_BATCH}, {SMOKE_SIDE}x{SMOKE_SIDE}: {len(work.values)} parameters, losses "
        f"{result['losses']}, {result['ms']:.1f} ms a step on the CPU")


def command_line():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="of: " + ", ".join(PARTS))
    parser.add_argument("--skip", default="", help="CNN contestants to leave out, comma-separated, of: "
                        + ", ".join(CNN_CONTESTANTS))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "conv_gpu.json"))
    parser.add_argument("--smoke", action="store_true", help="only the cortado parts, on the CPU at tiny shapes")
    args = parser.parse_args()
    args.parts, args.skip = (list(filter(None, a.split(","))) for a in (args.parts, args.skip))
    for given, known in ((args.parts, PARTS), (args.skip, CNN_CONTESTANTS)):
        if set(given) - set(known):
            parser.error(f"unknown {', '.join(sorted(set(given) - set(known)))}; choose from {', '.join(known)}")
    return args


def main():
    args = command_line()
    if args.smoke:
        smoke(args.parts)
        return
    _, gpu = require_gpu()
    log(f"{gpu}: parts {', '.join(args.parts)}")
    results = {"benchmark": "conv_gpu", "machine": {**describe(), "gpu": gpu}}
    if "layers" in args.parts:
        results["layers"] = layers_part()
    if "cnn" in args.parts:
        results["cnn"] = cnn_part(args.skip)
    write_results({**results, "versions": versions("torch", "jax"), "notes": NOTES}, args.out)
    print_tables(results)


def print_tables(results):
    """The tables of the parts that ran, at the end of the run's output."""
    if "layers" in results:
        print_table(results["layers"]["cases"], LAYER_COLUMNS)
        for case in filter(lambda case: "plans" in case, results["layers"]["cases"]):
            log(f"{case['layer']} {case['dtype']} {case['pass']}: ours ran {case.get('plans')}")
        print("nchw/ours, nhwc/ours: torch's time over ours (above 1: ours is faster); launch-bound: replays no slower "
              f"than {LAUNCH_BOUND}x the host's time per launch", flush=True)
    if "cnn" in results:
        rows, summary = table_rows(results["cnn"]["cases"])
        print_table(rows, COLUMNS)
        print_table(summary, MEMORY_COLUMNS)
        print(f"peer/ours: its time over ours (above 1: ours is faster; against jax, wall clock against wall clock); "
              f"memory target ours/torch <= {MEMORY_TARGET}", flush=True)


if __name__ == "__main__":
    main()
