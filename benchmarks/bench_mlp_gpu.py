"""MLP training steps on the GPU: cortado against torch eager, torch.compile and jax.jit, the GEMM floor and memory.

    python benchmarks/bench_mlp_gpu.py [--sizes small,large] [--dtypes float32,bfloat16] [--skip jax]
                                       [--out benchmarks/results/mlp_gpu.json]

One step is the forward pass of a relu MLP with softmax cross-entropy on one-hot labels, its backward pass
and a plain SGD update of every weight and bias. small is 784-1024-1024-10 at batch 128 (200 timed steps
after 10 of warm-up); large is 8192-8192-8192-8192, three 8192x8192 layers, at batch 8192 (10 timed
after 3). Every contestant starts from the same Glorot-normal weights on the same random batch, and
float32 means float32: TF32 is off in torch, and JAX runs its matmuls at precision HIGHEST (what
``jax_default_matmul_precision="highest"`` sets, but per matmul, so it leaves bfloat16 alone).

The contestants, and how each is timed:

- cortado: ``ct.compile(..., backend="cupy", cuda_graph=True)`` (examples/mlp_gpu.py); CuPy's CUDA events. Also
  with ``autotune=False``: cuBLASLt's first heuristic choice for each GEMM.
- torch: eager; ``loss.backward()``, then ``p -= lr * p.grad`` and ``p.grad = None``; torch's CUDA events.
- torch.compile: mode="reduce-overhead", fullgraph=True, of the whole step: loss and gradients by
  ``torch.func.grad_and_value``, then the update in place on parameters marked static, which is what
  lets CUDA graphs replay a step that mutates them; torch's CUDA events.
- jax: ``jax.jit`` of (params, x, y) -> (loss, new params), params donated. JAX runs on streams of its
  own, so its steps are timed by the wall clock until ``block_until_ready`` returns, and set against ours'
  wall time, measured the same way (until the device is idle).

Each step is timed alone, between events on the current stream, and the median is kept. Before timing,
the losses of every contestant's first two steps (the second shows the update) are checked against torch
eager's: relative 1e-3 in float32, 3e-2 in bfloat16. For the large size the GEMM floor is the step's
GEMMs (per layer X @ W, dY @ W^T but for the first layer, and X^T @ dY) run back to back with
torch.matmul, timed as one: a step runs them so, and no step of this model can take less. Each GEMM
timed alone can be faster where the card had idled before it (an H200 running bfloat16 GEMMs without
a pause is held to its power limit: once 8 such GEMMs took 11.3 ms one by one and 13.0 ms back to
back), so that sum is reported too, as ``alone_ms``. Clocks also fall as a card heats over a run, so
the ratio of ours to the floor (and of ours with heuristic GEMMs to it) comes from the three timed in
turns, in rounds of rotated order (``in_turns``), not from figures taken minutes apart. Memory: torch
eager's peak during a step over what was allocated before its model and its first matmul (parameters,
gradients, activations and cuBLAS's workspace count; the caller's batch does not), against ours'
``device_bytes`` (arena, state, outputs, constants, cuBLASLt workspaces; feeds are read where the
caller keeps them).
"""

import argparse
import functools
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, print_table, require_gpu, time_calls, versions  # noqa: E402
from machine import describe  # noqa: E402
from mlp_gpu import LEARNING_RATE, compiled_step, initial_values, torch_loss, torch_step  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

CASES = {  # layer sizes, batch, warm-up steps, timed steps
    "small": ((784, 1024, 1024, 10), 128, 10, 200),
    "large": ((8192, 8192, 8192, 8192), 8192, 3, 10),
}
LOSS_TOLERANCE = {"float32": 1e-3, "bfloat16": 3e-2}
TURNS = 3  # rounds of ours and the GEMM floor timed in turns (``in_turns``)
MEMORY_TARGET = 0.7  # ours / torch eager
WALL = "wall clock until block_until_ready"


@dataclass
class Workload:
    """One case: the model, its dtype, the initial weights and the batch every contestant shares, the step counts."""

    sizes: tuple
    batch: int
    dtype: str
    values: dict
    x: np.ndarray
    y: np.ndarray
    warmup: int
    repeats: int


def measured(call, timer, timer_name, work, losses=()):
    """The losses of the first two steps (those not yet taken), then ``call`` timed over the case's steps."""
    losses = list(losses) + [float(call()) for _ in range(2 - len(losses))]
    device, wall = time_calls(call, timer, work.repeats, work.warmup)
    return {"ms": 1e3 * device, "wall_ms": 1e3 * wall, "steps_per_s": 1 / device, "timer": timer_name, "losses": losses}


def torch_on_gpu():
    """torch, with TF32 off (float32 matmuls in float32), or an error where it sees no GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_batch(torch, work):
    dtype = getattr(torch, work.dtype)
    return torch.tensor(work.x, dtype=dtype, device="cuda"), torch.tensor(work.y, dtype=dtype, device="cuda")


def torch_eager(work):
    """PyTorch eager (examples/mlp_gpu.py's ``torch_step``), and its peak memory over one step."""
    torch = torch_on_gpu()
    x, y = torch_batch(torch, work)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step = torch_step(work.values, work.dtype)
    first = float(step(x, y))
    peak = torch.cuda.max_memory_allocated() - before
    return {**measured(functools.partial(step, x, y), clock("torch"), "cuda events (torch)", work, [first]),
            "peak_bytes": peak, "batch_bytes": x.nbytes + y.nbytes}


def _leaves(params):
    """The tensors of a list or a dict of them, in order."""
    return list(params.values()) if isinstance(params, dict) else list(params)


def torch_compiled_step(work, loss, params, learning_rate):
    """torch.compile(mode="reduce-overhead") of the whole step of ``loss(params, x, y)`` (``params``: a list or a dict
    of tensors, updated in place by SGD at ``learning_rate``) in one graph; it also counts the times inductor gave
    up on CUDA graphs (then the step ran compiled but launched kernel by kernel)."""
    torch = torch_on_gpu()
    from torch._dynamo.utils import counters

    x, y = torch_batch(torch, work)
    for p in _leaves(params):
        torch._dynamo.mark_static_address(p)  # a CUDA graph may update it in place

    def whole_step(params, x, y):
        grads, value = torch.func.grad_and_value(loss)(params, x, y)
        for p, g in zip(_leaves(params), _leaves(grads)):
            p -= learning_rate * g
        return value

    compiled = torch.compile(whole_step, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def call():
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs may be overwritten
        return compiled(params, x, y)

    skips = counters["inductor"]["cudagraph_skips"]
    result = measured(call, clock("torch"), "cuda events (torch)", work)
    return {**result, "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips}


def torch_compiled(work):
    """torch.compile of the MLP's step (``torch_compiled_step``)."""
    torch = torch_on_gpu()
    dtype = getattr(torch, work.dtype)
    params = [torch.tensor(v, dtype=dtype, device="cuda") for v in work.values.values()]
    return torch_compiled_step(work, torch_loss, params, LEARNING_RATE)


def jax_on_gpu():
    """jax, where it runs on a GPU; and the precision of float32 products that keeps them float32 (no TF32)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # not 75% of the GPU up front: others share it
    import jax

    if jax.default_backend() != "gpu":
        raise RuntimeError(f"jax runs on {jax.default_backend()}, not on a GPU")
    return jax


def jax_precision(jax, work):
    return jax.lax.Precision.HIGHEST if work.dtype == "float32" else None


def jax_jit_step(work, loss_fn, values, learning_rate):
    """jax.jit of the SGD step (at ``learning_rate``) of ``loss_fn(params, x, y)`` from ``values`` (a list or a dict
    of NumPy arrays), the parameters donated; each call waits for its results (the wall clock times it)."""
    jax = jax_on_gpu()
    import jax.numpy as jnp

    @functools.partial(jax.jit, donate_argnums=0)
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)

    dtype = jnp.dtype(work.dtype)
    params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype=dtype), values)
    x, y = jnp.asarray(work.x, dtype=dtype), jnp.asarray(work.y, dtype=dtype)

    def call():
        nonlocal params
        loss, params = step(params, x, y)
        return jax.block_until_ready((loss, params))[0]

    return measured(call, wall_clock(), WALL, work)


def jax_jit(work):
    """jax.jit of the MLP's step (``jax_jit_step``)."""
    jax = jax_on_gpu()
    import jax.numpy as jnp

    precision = jax_precision(jax, work)

    def loss_fn(params, x, y):
        h = x
        for W, b in zip(params[0:-2:2], params[1:-2:2]):
            h = jax.nn.relu(jnp.matmul(h, W, precision=precision) + b)
        logits = jnp.matmul(h, params[-2], precision=precision) + params[-1]
        return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.sum(logits * y, axis=1))

    return jax_jit_step(work, loss_fn, list(work.values.values()), LEARNING_RATE)


class WallEvent:
    """A stand-in for a CUDA event where there is none to record: the wall clock when ``record`` is called."""

    def record(self):
        self.seconds = time.perf_counter()


def wall_clock():
    """A ``clock`` of wall-clock stand-ins, for steps that wait for their own results."""
    start, end = WallEvent(), WallEvent()
    return start, end, lambda: 1e3 * (end.seconds - start.seconds), lambda: None


def cortado_step(work, **options):
    """Ours: the step compiled for the GPU, fed CuPy arrays; its loss is read from its own output buffer."""
    import cupy

    try:
        step = compiled_step(work.values, work.batch, work.sizes, work.dtype, **options)
    except ct.DTypeError as error:
        return {"error": "unsupported dtype", "detail": str(error)}
    dtype = step.state["W1"].dtype  # the program's own (NumPy knows bfloat16 only by the type cortado gives it)
    x, y = cupy.asarray(work.x.astype(dtype)), cupy.asarray(work.y.astype(dtype))
    result = measured(lambda: step(x=x, y=y), clock("cupy"), "cuda events (cupy)", work)
    return {**result, "device_bytes": step.device_bytes, "arena_bytes": step.memory.peak_bytes}


# Ours runs last: a fault in a new backend can take the CUDA context down with it, and the peers are measured by then.
CONTESTANTS = {"torch": torch_eager, "torch.compile": torch_compiled, "jax": jax_jit,
               "cortado (heuristic GEMMs)": functools.partial(cortado_step, autotune=False), "cortado": cortado_step}


def floor_gemms(work):
    """The step's GEMMs with torch.matmul at their shapes, layouts and dtype: ``(gemms, calls)``, the GEMMs in the
    order a step runs them and a call for each distinct one. An operand the step reads transposed is a transposed
    view here too."""
    torch = torch_on_gpu()
    dtype = getattr(torch, work.dtype)

    def operand(rows, cols, transposed):
        if transposed:
            return torch.randn(cols, rows, dtype=dtype, device="cuda").t()
        return torch.randn(rows, cols, dtype=dtype, device="cuda")

    gemms = []  # (left, right) as (rows, columns, transposed)
    for i, (fan_in, fan_out) in enumerate(zip(work.sizes, work.sizes[1:])):
        gemms.append(((work.batch, fan_in, False), (fan_in, fan_out, False)))  # X @ W
        if i:
            gemms.append(((work.batch, fan_out, False), (fan_out, fan_in, True)))  # dX = dY @ W^T
        gemms.append(((fan_in, work.batch, True), (work.batch, fan_out, False)))  # dW = X^T @ dY
    calls = {}
    for left, right in gemms:
        if (left, right) not in calls:  # the same shapes and layouts again: the same operands
            out = torch.empty(left[0], right[1], dtype=dtype, device="cuda")
            calls[left, right] = functools.partial(torch.matmul, operand(*left), operand(*right), out=out)
    return gemms, calls


def gemm_floor(work):
    """The step's GEMMs (``floor_gemms``) back to back as a step runs them, and each alone, summed."""
    gemms, calls = floor_gemms(work)
    back_to_back, _ = time_calls(lambda: [calls[gemm]() for gemm in gemms], clock("torch"), 10, 3)
    alone = {gemm: 1e3 * time_calls(call, clock("torch"), 10, 3)[0] for gemm, call in calls.items()}
    return {"ms": 1e3 * back_to_back, "alone_ms": sum(alone[gemm] for gemm in gemms), "gemms": len(gemms)}


def in_turns(work):
    """Ours, with tuned and with heuristic GEMMs, and the GEMM floor back to back, timed in turns: ``TURNS`` rounds,
    each timing every one over the case's steps, in an order rotated from round to round. A card under sustained
    load lowers its clocks as it heats, so whichever ran first would gain; in turns, none does. The median of each
    one's rounds, in milliseconds."""
    import cupy

    feeds = {}
    calls = {}
    for name, options in (("cortado", {}), ("cortado (heuristic GEMMs)", {"autotune": False})):
        step = compiled_step(work.values, work.batch, work.sizes, work.dtype, **options)
        dtype = step.state["W1"].dtype
        feeds = feeds or {"x": cupy.asarray(work.x.astype(dtype)), "y": cupy.asarray(work.y.astype(dtype))}
        calls[name] = (functools.partial(step, **feeds), clock("cupy"))
    gemms, floor = floor_gemms(work)
    calls["GEMM floor"] = (lambda: [floor[gemm]() for gemm in gemms], clock("torch"))
    names, rounds = list(calls), {name: [] for name in calls}
    for turn in range(TURNS):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            call, timer = calls[name]
            rounds[name].append(1e3 * time_calls(call, timer, work.repeats, work.warmup)[0])
    log("in turns (ms, round by round): " + "; ".join(f"{name} {', '.join(f'{ms:.3f}' for ms in times)}"
                                                     for name, times in rounds.items()))
    return {name: statistics.median(times) for name, times in rounds.items()}


def release():
    """Give cached device memory back between contestants, so that one's leftovers do not crowd the next."""
    gc.collect()
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


def workload(size, dtype):
    sizes, batch, warmup, repeats = CASES[size]
    rng = np.random.default_rng(0)
    values = initial_values(sizes, rng)
    x = rng.standard_normal((batch, sizes[0]), dtype=np.float32)
    y = np.zeros((batch, sizes[-1]), np.float32)
    y[np.arange(batch), rng.integers(0, sizes[-1], batch)] = 1
    return Workload(sizes, batch, dtype, values, x, y, warmup, repeats)


def contest(label, contestants, work, skip):
    """Every contestant not in ``skip``, one after another on ``work``: their results, losses checked against torch
    eager's and times set against ours (``peer_over_ours``), and ours' memory against torch eager's peak."""
    results = {}
    for name, contestant in contestants.items():
        if name not in skip:
            results[name] = attempt(f"{label}: {name}", contestant, work)
            release()
    check_losses(label, results, LOSS_TOLERANCE[work.dtype])
    ours, eager = results.get("cortado", {}), results.get("torch", {})
    for result in results.values():
        if "ms" in result and "ms" in ours:
            result["peer_over_ours"] = result["ms"] / (ours["wall_ms"] if result["timer"] == WALL else ours["ms"])
    memory = {}
    if "device_bytes" in ours and "peak_bytes" in eager:
        memory = {"memory": {"ours_bytes": ours["device_bytes"], "torch_bytes": eager["peak_bytes"],
                             "ours_over_torch": ours["device_bytes"] / eager["peak_bytes"], "target": MEMORY_TARGET}}
    return results, memory


def run_case(size, dtype, skip):
    """Every contestant on one size and dtype (``contest``), and the GEMM floor of the large step."""
    work = workload(size, dtype)
    label = f"{size} {dtype}"
    results, memory = contest(label, CONTESTANTS, work, skip)
    case = {"size": size, "dtype": dtype, "layers": "-".join(map(str, work.sizes)), "batch": work.batch,
            "warmup": work.warmup, "repeats": work.repeats, "contestants": results, **memory}
    if size == "large":
        floor = case["gemm_floor"] = attempt(f"{label}: GEMM floor", gemm_floor, work)
        turns = case["in_turns"] = attempt(f"{label}: ours and the GEMM floor in turns", in_turns, work)
        if "GEMM floor" in turns:
            floor["ms_in_turns"] = turns["GEMM floor"]
            floor["ours_over_floor"] = turns["cortado"] / turns["GEMM floor"]
            floor["heuristic_over_floor"] = turns["cortado (heuristic GEMMs)"] / turns["GEMM floor"]
    return case


def check_losses(label, results, tolerance):
    """Each contestant's first two losses against torch eager's; a mismatch is marked, and printed loudly."""
    reference = results.get("torch", {}).get("losses")
    for name, result in results.items():
        if reference and "losses" in result:
            result["loss_rel_error"] = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference))
            result["mismatch"] = not result["loss_rel_error"] <= tolerance  # NaN too
            if result["mismatch"]:
                log(f"!!! MISMATCH: {label}: {name}'s losses {result['losses']} against torch eager's {reference}: "
                    f"relative error {result['loss_rel_error']:.3e} > {tolerance:g} !!!")


COLUMNS = [("case", "case", "16s"), ("contestant", "contestant", "14s"), ("ms/step", "ms", "10.3f"),
           ("steps/s", "steps_per_s", "9.1f"), ("peer/ours", "peer_over_ours", "10.2f"),
           ("loss rel err", "loss_rel_error", "13.2e")]
SUMMARY = [("case", "case", "16s"), ("ours MiB", "ours_mib", "10.1f"), ("torch MiB", "torch_mib", "10.1f"),
           ("ours/torch", "ours_over_torch", "11.2f"), ("GEMM floor ms", "floor_ms", "14.3f"),
           ("in turns ms", "floor_in_turns_ms", "12.3f"), ("ours/floor", "ours_over_floor", "11.2f"),
           ("heuristic/floor", "heuristic_over_floor", "16.2f"),
           ("GEMMs alone ms", "alone_ms", "15.3f")]


def table_rows(cases):
    """The printed tables' rows: one per contestant and case, and one summary (memory, floor) per case."""
    rows, summary = [], []
    for case in cases:
        label = f"{case.get('size')} {case.get('dtype')}"
        if "error" in case:
            summary.append({"case": label, "note": f"ERROR {case['error']}"})
            continue
        for name, result in case["contestants"].items():
            note = (f"ERROR {result['error']}".splitlines()[0] if "error" in result else
                    "MISMATCH" if result.get("mismatch") else "CUDA graphs skipped" if result.get("cudagraph_skips") else
                    "wall clock" if result.get("timer") == WALL else "")
            rows.append({"case": label, "contestant": name, **result, "note": note})
        memory, floor = case.get("memory", {}), case.get("gemm_floor", {})
        summary.append({"case": label, "ours_mib": memory.get("ours_bytes", 0) / 2**20 or None,
                        "torch_mib": memory.get("torch_bytes", 0) / 2**20 or None,
                        "ours_over_torch": memory.get("ours_over_torch"), "floor_ms": floor.get("ms"),
                        "floor_in_turns_ms": floor.get("ms_in_turns"),
                        "ours_over_floor": floor.get("ours_over_floor"),
                        "heuristic_over_floor": floor.get("heuristic_over_floor"), "alone_ms": floor.get("alone_ms")})
    return rows, summary


def command_line():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,large", help="of: " + ", ".join(CASES))
    parser.add_argument("--dtypes", default="float32,bfloat16", help="of: " + ", ".join(LOSS_TOLERANCE))
    parser.add_argument("--skip", default="", help="contestants to leave out, comma-separated, of: " + ", ".join(CONTESTANTS))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "mlp_gpu.json"))
    args = parser.parse_args()
    args.sizes, args.dtypes, args.skip = (list(filter(None, a.split(","))) for a in (args.sizes, args.dtypes, args.skip))
    for given, known in ((args.sizes, CASES), (args.dtypes, LOSS_TOLERANCE)):
        if set(given) - set(known):
            parser.error(f"unknown {', '.join(sorted(set(given) - set(known)))}; choose from {', '.join(known)}")
    return args


def main():
    args = command_line()
    _, gpu = require_gpu()
    log(f"{gpu}: sizes {', '.join(args.sizes)}; dtypes {', '.join(args.dtypes)}")
    cases = []
    for size in args.sizes:
        for dtype in args.dtypes:
            case = attempt(f"{size} {dtype}", run_case, size, dtype, args.skip)
            cases.append({"size": size, "dtype": dtype, **case})
    write_results({"benchmark": "mlp_gpu", "machine": {**describe(), "gpu": gpu}, "versions": versions("torch", "jax"),
                   "learning_rate": LEARNING_RATE, "loss_tolerance": LOSS_TOLERANCE,
                   "notes": {
                       "cortado": "ct.compile(..., backend='cupy', cuda_graph=True), fed CuPy arrays in its dtype; its GEMMs' "
                                  "algorithms timed and chosen when built",
                       "cortado (heuristic GEMMs)": "the same with autotune=False: cuBLASLt's first heuristic choice",
                       "torch.compile": "mode='reduce-overhead', fullgraph=True, dynamic=False, of the whole step: "
                                        "torch.func.grad_and_value, then p -= lr * g in place on parameters marked "
                                        "with torch._dynamo.mark_static_address; cudagraph_skips counts fallbacks",
                       "jax": "jax.jit with donate_argnums=0; precision HIGHEST on every float32 matmul; timed by the "
                              "wall clock until block_until_ready (ratios against ours' wall time)",
                       "memory": "torch: max_memory_allocated during one eager step minus memory_allocated before the "
                                 "model was made and cuBLAS first ran (the batch, batch_bytes, comes before); ours: "
                                 "device_bytes (arena, state, outputs, constants, cuBLASLt workspaces; CuPy feeds are "
                                 "read in place)",
                       "gemm_floor": "ms: the step's GEMMs back to back with torch.matmul, timed as one; alone_ms: "
                                     "the sum of each timed alone; ms_in_turns, ours_over_floor, heuristic_over_floor: "
                                     "from in_turns",
                       "in_turns": "ours (tuned and heuristic GEMMs) and the GEMM floor back to back, timed in "
                                   f"{TURNS} rounds in an order rotated each round: each one's median round (ms)",
                   },
                   "cases": cases}, args.out)
    print_tables(cases, SUMMARY)


def print_tables(cases, summary_columns):
    """The contestants' table and the summary's (memory; the MLP's floor), at the end of a run's output."""
    rows, summary = table_rows(cases)
    print_table(rows, COLUMNS)
    print_table(summary, summary_columns)
    print(f"peer/ours: its time over ours (above 1: ours is faster; against jax, wall clock against wall clock); "
          f"memory target ours/torch <= {MEMORY_TARGET}", flush=True)


if __name__ == "__main__":
    main()
