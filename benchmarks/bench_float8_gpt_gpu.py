"""The GPT's training step in float8 against the same step in bfloat16, on the GPU: time a step, and the loss after
a run of steps from the same seed.

    python benchmarks/bench_float8_gpt_gpu.py [--size large] [--steps 2000] [--seed 0] [--peers torch,compile,reduce-overhead]
                                              [--out benchmarks/results/float8_gpt_gpu.json]
    python benchmarks/bench_float8_gpt_gpu.py --backend numpy --size tiny --steps 20    (a smoke test on the CPU)

The model is examples/gpt.py's (``cortado.nn``): in bfloat16 (float32 master weights, AdamW), and in float8, where
every linear layer of the blocks is ``nn.Linear(..., float8=True)`` (e4m3 products with delayed power-of-two
scales, gradients rounded to e5m2; the attention, the embeddings and the tied head stay bfloat16). The sizes are
bench_gpt_gpu.py's (its ``SIZES``): large is 12 layers, width 768, 12 heads, context 1024, batch 8.

- loss: ``--steps`` steps from the weights of ``--seed`` (0), each on a new batch of windows of
  examples/data/shakespeare.txt drawn from one generator (of seed ``--seed`` + 1), the same for both; the mean loss
  of the last 50 steps, and float8's relative difference;
- step: then 50 calls back to back on one batch between two events, the device time per step (median of
  ``--repeats``), and the step's kernels timed one by one (``Program.profile``), slowest first;
- each step: on the GPU, steps timed as bench_gpt_gpu.py times every contestant (its size's warm-up steps, then its
  timed steps, each alone between two events and synchronised, the median), the time the peers' are set against.

The peers (``--peers``, on the GPU by default): torch eager, torch.compile and torch.compile in "reduce-overhead"
mode, bench_gpt_gpu.py's contestants of the same size, each in a process of its own after ours, in bfloat16: torch
trains in float8 only through Transformer Engine or torchao, and the GPU machine has neither installed, which the
results say.
"""

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)

from bench_fused_gpu import clock, time_calls  # noqa: E402
from bench_gpt_gpu import ALIASES, SIZES, run_child  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402
from cortado import nn, optim  # noqa: E402
from gpt import BETAS, GPT, TEXT, WEIGHT_DECAY, windows  # noqa: E402

LEARNING_RATE = 3e-3
LAST = 50  # the steps whose mean loss is compared
PEERS = "torch,compile,reduce-overhead"  # bench_gpt_gpu.py's contestants (its --only names), the GPU's default


def program(size, dtype, backend, data, seed=0, **options):
    """The compiled training step of the GPT of ``size`` in ``dtype`` ("bfloat16" or "float8"), from the initial
    weights of ``seed``, with ``ct.compile``'s ``options``."""
    shape = SIZES[size]
    float8 = dtype == "float8"
    model = GPT(len(set(data.tolist())), shape.context, shape.width, shape.heads, None, shape.layers,
                float8).compute_in("bfloat16")
    tokens = ct.var("tokens_in", (shape.batch, shape.context), "int32")
    labels = ct.var("labels", (shape.batch, shape.context), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    adamw = optim.AdamW(lr=LEARNING_RATE, betas=BETAS, weight_decay=WEIGHT_DECAY, decay=lambda name, p: p.ndim == 2)
    state, updates = adamw.updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    started = time.perf_counter()
    step = ct.compile([loss], inputs=[tokens, labels], backend=backend, updates=updates,
                      state={**model.initial_values(seed), **state}, **options)
    return step, time.perf_counter() - started


def _device(array, backend):
    if backend != "cupy":
        return array
    import cupy

    return cupy.asarray(array)


def step_ms(step, tokens, labels, repeats):
    """Device milliseconds a step: 50 calls back to back on one batch between two events on the stream they are
    launched on (the median of ``repeats``); a call's host work overlaps the steps before it."""
    import cupy

    step(tokens_in=tokens, labels=labels)
    stream = cupy.cuda.get_current_stream()
    times = []
    for _ in range(repeats):
        start = stream.record()
        for _ in range(50):
            step(tokens_in=tokens, labels=labels)
        end = stream.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 50)
    return float(np.median(times))


def losses(step, data, size, steps, backend, seed=1):
    """The loss of each of ``steps`` steps, each on new windows drawn from one generator of ``seed`` (each copied as it
    is made: a program writes every call's loss into the same buffer)."""
    shape = SIZES[size]
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(steps):
        x, y = windows(data, shape.batch, shape.context, rng)
        found.append(step(tokens_in=_device(x, backend), labels=_device(y, backend))[0].copy())
    return [float(np.asarray(v.get() if hasattr(v, "get") else v)) for v in found]


def each_step_ms(step, tokens, labels, size):
    """Device milliseconds a step, each step alone between two events and synchronised (the median of the steps
    bench_gpt_gpu.py times at ``size``, after its warm-up steps), as that benchmark times its contestants."""
    shape = SIZES[size]
    device, _ = time_calls(lambda: step(tokens_in=tokens, labels=labels), clock("cupy"), shape.steps, shape.warmup)
    return 1e3 * device


def peers(names, size, backend, float8_ms):
    """bench_gpt_gpu.py's contestants ``names`` on ``size``, each in a process of its own: their results, with their
    step's time over ours in float8 (``over_float8``: above 1, ours is faster), and a line each."""
    options = argparse.Namespace(backend=backend, compile_mode="default", steps=None, warmup=None, timeout=600)
    found = {}
    for name in names:
        log(f"peer {name} (bfloat16) ...")
        result = run_child(name, size, options)
        if result.get("ms") and float8_ms:
            result["over_float8"] = result["ms"] / float8_ms
        found[name] = result
        log(f"peer {name} (bfloat16): " + (f"{result['ms']:.3f} ms a step" + (
            f", {result['over_float8']:.3f}x ours in float8" if "over_float8" in result else "")
            if result.get("ms") else f"not run: {result.get('error')}"))
    return found


STARTED = time.perf_counter()


def log(message):
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0, help="of the initial weights; the batches' is seed + 1")
    parser.add_argument("--backend", default="cupy", choices=["cupy", "numpy"])
    parser.add_argument("--peers", default=None, help=f"bench_gpt_gpu.py's contestants to run beside ours, comma-"
                        f"separated, or none (default: {PEERS} on the GPU, none with --backend numpy)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "float8_gpt_gpu.json"))
    args = parser.parse_args()
    text = open(TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    data = np.array([alphabet.index(c) for c in text], np.int32)
    installed = {name: importlib.util.find_spec(name) is not None for name in ("transformer_engine", "torchao")}
    results = {"size": args.size, "steps": args.steps, "seed": args.seed, "peers_installed": installed, "runs": {}}
    print(f"float8 peers installed: {installed} (torch's float8 needs one; torch runs bfloat16 here)", flush=True)
    names = args.peers if args.peers is not None else (PEERS if args.backend == "cupy" else "none")
    names = [ALIASES.get(n, n) for n in names.split(",") if n and n != "none"]
    for dtype in ("bfloat16", "float8"):
        step, compile_s = program(args.size, dtype, args.backend, data, args.seed)
        log(f"{dtype}: compiled in {compile_s:.1f} s")
        run = {"compile_s": compile_s, "kernels": len(step.kernels)}
        run["losses"] = losses(step, data, args.size, args.steps, args.backend, args.seed + 1)
        run["final_loss"] = float(np.mean(run["losses"][-LAST:]))  # (all of them, in a run of fewer steps)
        log(f"{dtype}: {args.steps} steps taken")
        if args.backend == "cupy":  # timed after the run: its state does not change a step's time
            x, y = windows(data, SIZES[args.size].batch, SIZES[args.size].context, np.random.default_rng(0))
            x, y = _device(x, args.backend), _device(y, args.backend)
            run["ms"] = step_ms(step, x, y, args.repeats)
            run["each_ms"] = each_step_ms(step, x, y, args.size)
            run["profile"] = step.profile(tokens_in=x, labels=y)
        results["runs"][dtype] = run
        each = f" ({run['each_ms']:.3f} each alone)" if "each_ms" in run else ""
        log(f"{dtype}: {run.get('ms')} ms a step{each}, {run['kernels']} kernels; loss {run['losses'][0]:.4f} first, "
            f"{run['final_loss']:.4f} over the last {min(LAST, args.steps)} of {args.steps}")
        if "profile" in run:
            print("\n".join(run["profile"].splitlines()[:25]), flush=True)
        del step
    bf16, fp8 = results["runs"]["bfloat16"], results["runs"]["float8"]
    if bf16.get("ms") and fp8.get("ms"):
        results["float8_speedup"] = bf16["ms"] / fp8["ms"]
        print(f"float8 step {fp8['ms']:.3f} ms against bfloat16 {bf16['ms']:.3f} ms: {results['float8_speedup']:.3f}x "
              f"(target 1.3x)")
    if names:
        results["peers"] = peers(names, args.size, args.backend, fp8.get("each_ms"))
    results["loss_relative_difference"] = (fp8["final_loss"] - bf16["final_loss"]) / bf16["final_loss"]
    print(f"loss after {args.steps} steps: float8 {fp8['final_loss']:.4f}, bfloat16 {bf16['final_loss']:.4f}, "
          f"{results['loss_relative_difference']:+.2%} (target within 2%)")
    write_results(results, args.out)


if __name__ == "__main__":
    main()
