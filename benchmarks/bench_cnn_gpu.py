"""A CNN's training step on the GPU against torch eager, torch.compile and jax.jit.

    python benchmarks/bench_cnn_gpu.py [--skip jax] [--options nhwc=False] [--out benchmarks/results/cnn_gpu.json]
    python benchmarks/bench_cnn_gpu.py --smoke      (ours on the CPU, tiny shapes)

(Single convolution layers against torch's cuDNN are benchmarks/bench_conv_layers_gpu.py's.)

One training step of a ResNet-style CNN without batch norm on 3x32x32 images, batch 128: a 3x3 stem to
32 channels, two residual blocks (conv, relu, conv, add the input, relu) at each of 32, 64 and 128 channels,
a 3x3 convolution of stride 2 between stages, every convolution with a bias and padding 1, global average
pooling, a linear layer to 10 classes, softmax cross-entropy on one-hot labels and plain SGD (learning rate
0.001, at which it trains; the results committed before 2026-11-25 were measured at 0.01, where it diverged) on every
parameter; float32 and bfloat16. The contestants and their timing are bench_mlp_gpu.py's:
ours (``ct.compile(..., backend="cupy")``, CUDA graphs by default) and torch eager timed by CUDA events
around each step; torch.compile(mode="reduce-overhead") of the whole step; jax.jit with the parameters
donated, timed by the wall clock until ``block_until_ready`` and set against ours' wall time. Every
contestant starts from the same He-normal weights (zero biases) on the same random batch, and the losses
of its first two steps are checked against torch eager's (relative 1e-3 in float32, 3e-2 in bfloat16).
Memory: ours' ``device_bytes`` against torch eager's peak over one step. ``--options`` are backend options
for ours (``name=value``, comma-separated: ``deterministic=False``, say), recorded with the results.
"""

import argparse
import ast
import functools
import math
import os
import re
import sys
from dataclasses import dataclass, field, replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, require_gpu, versions  # noqa: E402
from bench_mlp_gpu import (  # noqa: E402
    LOSS_TOLERANCE, SUMMARY, WALL, contest, jax_jit_step, jax_on_gpu, jax_precision, measured, print_tables, torch_batch,
    torch_compiled_step, torch_on_gpu, wall_clock,
)
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

CLASSES, STAGES, BLOCKS = 10, (32, 64, 128), 2  # STAGES: channels of each stage, each at half the last's side
CNN_BATCH, IMAGE_SIDE, LEARNING_RATE = 128, 32, 0.001
CNN_WARMUP, CNN_REPEATS = 10, 100
SMOKE_BATCH, SMOKE_SIDE = 2, 8


PLAN = re.compile(r"  \[([^\[\]]*)\]  -> ")  # explain's bracketed note on a kernel's line: the library call it chose


def chosen_plans(program):
    """What each ``dnn_conv`` kernel of ``program`` runs (a cuDNN plan or a GEMM), as ``explain()`` names it."""
    lines = [line for line in program.explain().splitlines() if "dnn_conv(" in line]
    return [match.group(1) for match in map(PLAN.search, lines) if match]


# -- cnn -------------------------------------------------------------------------------------------


@dataclass
class CnnWork:
    """One case: the dtype, the initial weights and the batch every contestant shares, and the step counts
    (``warmup`` and ``repeats``, which bench_mlp_gpu's ``measured`` reads), and ours' backend options."""

    dtype: str
    values: dict
    x: np.ndarray
    y: np.ndarray
    warmup: int
    repeats: int
    options: dict = field(default_factory=dict)


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


def cortado_cnn_step(work, backend, **options):
    """Our whole training step (forward, backward, SGD on every parameter) as one program; a call returns the loss.
    ``options`` go to ``ct.compile`` (backend options: ``nhwc=True``, say)."""
    batch, _, side, _ = work.x.shape
    loss, x, y, params = cortado_cnn(batch, side, work.dtype)
    grads = ct.grad(loss, params)
    return ct.compile(loss, inputs=[x, y], state={p: work.values[p.name].astype(p.dtype) for p in params},
                      updates={p: p - LEARNING_RATE * g for p, g in zip(params, grads)}, backend=backend, **options)


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
    """torch.compile(mode="reduce-overhead") of the whole step in one graph, as bench_mlp_gpu.py's."""
    return torch_compiled_step(work, torch_cnn_loss, torch_params(torch_on_gpu(), work), LEARNING_RATE)


def jax_jit(work):
    """jax.jit of the step with the parameters donated, as bench_mlp_gpu.py's."""
    jax = jax_on_gpu()
    loss_fn = functools.partial(jax_cnn_loss, precision=jax_precision(jax, work))
    return jax_jit_step(work, loss_fn, dict(work.values), LEARNING_RATE)


def cortado_contestant(work, **options):
    """Ours: the step compiled for the GPU with ``options`` (over the run's), fed CuPy arrays; its loss is read
    from its own output buffer."""
    import cupy

    try:
        step = cortado_cnn_step(work, "cupy", **{**work.options, **options})
    except ct.DTypeError as error:
        return {"error": "unsupported dtype", "detail": str(error)}
    dtype = step.state["fc_w"].dtype  # the program's own (NumPy knows bfloat16 only by the type cortado gives it)
    x, y = cupy.asarray(work.x.astype(dtype)), cupy.asarray(work.y.astype(dtype))
    result = measured(lambda: step(x=x, y=y), clock("cupy"), "cuda events (cupy)", work)
    return {**result, "device_bytes": step.device_bytes, "arena_bytes": step.memory.peak_bytes,
            "plans": chosen_plans(step)}


# Ours runs last: a fault in a new backend can take the CUDA context down with it, and the peers are measured by then.
# "cortado nondeterministic" lets cuDNN add partial sums in any order, as torch and jax do by default.
CNN_CONTESTANTS = {"torch": torch_eager, "torch.compile": torch_compiled, "jax": jax_jit, "cortado": cortado_contestant,
                   "cortado nondeterministic": functools.partial(cortado_contestant, deterministic=False)}


def cnn_case(dtype, skip, options):
    """Every contestant on one dtype (bench_mlp_gpu's ``contest``)."""
    work = replace(cnn_workload(dtype), options=options)
    results, memory = contest(f"cnn {dtype}", CNN_CONTESTANTS, work, skip)
    return {"batch": CNN_BATCH, "image": f"3x{IMAGE_SIDE}x{IMAGE_SIDE}", "stages": STAGES, "blocks": BLOCKS,
            "warmup": work.warmup, "repeats": work.repeats, "contestants": results, **memory}


def cnn_part(skip, options):
    """Both dtypes of the CNN's step; a failed case is recorded and the run goes on."""
    cases = [{"size": "cnn", "dtype": dtype, **attempt(f"cnn {dtype}", cnn_case, dtype, skip, options)}
             for dtype in LOSS_TOLERANCE]
    return {"learning_rate": LEARNING_RATE, "loss_tolerance": LOSS_TOLERANCE, "ours_options": options, "cases": cases}


MEMORY_COLUMNS = SUMMARY[:4]  # case and memory: the MLP's GEMM floor columns have no counterpart here

NOTES = {
    "cortado": "ct.compile(..., backend='cupy') of the whole step with its defaults (CUDA graphs; channels last for "
               "bfloat16; deterministic cuDNN plans), fed CuPy arrays in its dtype; each convolution's cuDNN plan (or "
               "GEMM) timed and chosen when built, named in plans",
    "cortado nondeterministic": "the same with deterministic=False: cuDNN's plans that add partial sums in any order "
                                "are candidates too, as torch's and jax's defaults allow; peer_over_ours here is its "
                                "time over the deterministic program's",
    "torch": "eager: loss.backward(), then p -= lr * p.grad and p.grad = None; F.conv2d with its bias; TF32 off",
    "torch.compile": "mode='reduce-overhead', fullgraph=True, dynamic=False, of the whole step: "
                     "torch.func.grad_and_value, then p -= lr * g in place on parameters marked with "
                     "torch._dynamo.mark_static_address; cudagraph_skips counts fallbacks",
    "jax": "jax.jit with donate_argnums=0; jax.lax.conv_general_dilated in NCHW/OIHW/NCHW; precision HIGHEST on "
           "every float32 convolution and matmul; timed by the wall clock until block_until_ready (ratios against "
           "ours' wall time)",
    "timing": "each step timed alone between CUDA events on the current stream (jax: the wall clock), median of "
                    "the timed steps after the warm-up; the first two steps' losses checked against torch eager's",
    "memory": "torch: max_memory_allocated during one eager step minus memory_allocated before its parameters were "
              "made (the batch, batch_bytes, comes before); ours: device_bytes (arena, state, outputs, constants, "
              "workspaces; CuPy feeds are read in place)",
}


# -- the command line ------------------------------------------------------------------------------


def smoke():
    """Ours on the CPU (backend "numpy") at tiny shapes, no GPU needed: two training steps in each dtype."""
    for dtype in LOSS_TOLERANCE:
        smoke_cnn(dtype)


def smoke_cnn(dtype):
    """The CNN's step built as on the GPU but for NumPy, at a tiny batch and image, run and timed by ``measured``."""
    work = cnn_workload(dtype, SMOKE_BATCH, SMOKE_SIDE, warmup=1, repeats=2)
    step = cortado_cnn_step(work, "numpy")
    own = step.state["fc_w"].dtype
    result = measured(functools.partial(step, x=work.x.astype(own), y=work.y.astype(own)), wall_clock(), WALL, work)
    log(f"cnn {dtype}, batch {SMOKE_BATCH}, {SMOKE_SIDE}x{SMOKE_SIDE}: {len(work.values)} parameters, losses "
        f"{result['losses']}, {result['ms']:.1f} ms a step on the CPU")


def backend_options(text):
    """``"a=1,b=True"`` as ``{"a": 1, "b": True}``."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    return {name.strip(): ast.literal_eval(value.strip()) for name, value in pairs}


def command_line():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", default="", help="contestants to leave out, comma-separated, of: "
                        + ", ".join(CNN_CONTESTANTS))
    parser.add_argument("--options", default="", help="backend options for ours, e.g. deterministic=False")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cnn_gpu.json"))
    parser.add_argument("--smoke", action="store_true", help="only ours, on the CPU at tiny shapes")
    args = parser.parse_args()
    args.skip = list(filter(None, args.skip.split(",")))
    args.options = backend_options(args.options)
    if set(args.skip) - set(CNN_CONTESTANTS):
        parser.error(f"unknown {', '.join(sorted(set(args.skip) - set(CNN_CONTESTANTS)))}; "
                     f"choose from {', '.join(CNN_CONTESTANTS)}")
    return args


def main():
    args = command_line()
    if args.smoke:
        smoke()
        return
    _, gpu = require_gpu()
    log(gpu)
    results = {"benchmark": "cnn_gpu", "machine": {**describe(), "gpu": gpu}, "cnn": cnn_part(args.skip, args.options)}
    write_results({**results, "versions": versions("torch", "jax"), "notes": NOTES}, args.out)
    print_tables(results["cnn"]["cases"], MEMORY_COLUMNS)


if __name__ == "__main__":
    main()
