"""The GPT benchmark's step (bench_gpt_gpu.py, ``--size``) built with code-generation constants set otherwise, each
variant timed in turns with the defaults in one process (the GEMMs' tuned choices shared), so that a constant's
effect on the whole step is measured where it runs:

    python3 benchmarks/results/h200/experiments/kernel_constants/probe.py --size small --rounds 3 \\
        reduction_kernels.SPLIT_ROWS_MIN=32 reduction_kernels.COLUMN_BLOCKS_WANTED=2112

Each argument ``module.NAME=value`` sets a constant of ``cortado.backends.cupy.<module>`` while that variant is
built (a variant of several settings: join them with ``+``); set it in the module that reads it (one that imports
it by name holds its own). Prints each variant's median step time per round.
"""

import argparse
import ast
import importlib
import statistics
import sys

import cupy

sys.path.insert(0, "benchmarks")
import bench_gpt_gpu as bench  # noqa: E402
from bench_fused_gpu import clock, time_calls  # noqa: E402

import cortado as ct  # noqa: E402


def settings(text):
    """``[(module, name, value)]`` of a variant's ``module.NAME=value`` settings joined by ``+``."""
    found = []
    for part in filter(None, text.split("+")):
        target, value = part.split("=", 1)
        module, name = target.rsplit(".", 1)
        found.append((importlib.import_module(f"cortado.backends.cupy.{module}"), name, ast.literal_eval(value)))
    return found


def built(work, variant):
    """The step compiled with ``variant``'s constants set while it is built and run once (its kernels compile
    then), the constants restored after."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in variant]
    for module, name, value in variant:
        setattr(module, name, value)
    try:
        loss, tokens, labels, state, updates = bench.cortado_graph(work)
        step = ct.compile(loss, inputs=[tokens, labels], state=state, updates=updates, backend="cupy")
        feeds = {"tokens_in": cupy.asarray(work.tokens), "labels": cupy.asarray(work.labels)}
        first = float(step(**feeds))
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    return step, feeds, first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("variants", nargs="*")
    args = parser.parse_args()
    work = bench.workload(args.size)
    variants = {"defaults": []} | {text: settings(text) for text in args.variants}
    steps = {name: built(work, variant) for name, variant in variants.items()}
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (step, feeds, _) in steps.items():
            device, _ = time_calls(lambda step=step, feeds=feeds: step(**feeds), clock("cupy"), args.steps, warmup=10)
            times[name].append(1e3 * device)
    for name, (step, _, first) in steps.items():
        shown = ", ".join(f"{ms:.3f}" for ms in times[name])
        print(f"{name}: {shown} ms (median {statistics.median(times[name]):.3f}); {step.kernels_run} kernels; "
              f"loss after its first steps {first:.6f}", flush=True)


if __name__ == "__main__":
    main()
