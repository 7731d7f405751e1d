"""``ct.compile`` of MLP training steps of about 1k, 10k and 100k terms: compile time should grow
about linearly in the number of terms.

    python benchmarks/bench_compile.py [--repeats 3] [--out benchmarks/results/compile_cpu.json]

The graph is a whole training step: an L-layer tanh MLP (width 64, batch 32, softmax
cross-entropy), its gradients by ``ct.grad``, and plain gradient-descent updates of every
parameter, so the planner sees forward values that live until their backward use (every pair
of them overlaps in time). Reported per size: the terms given to ``compile``, the kernels it
makes, the median compile time over ``repeats``, how far the arena came out above its lower
bound, and which placement won. A least-squares fit of log(time) on log(terms) gives the growth exponent: 1.0 is linear.
"""

import gc
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from bench_grad import mlp  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, growth_exponent, measured_rows, write_results  # noqa: E402

LAYERS = (75, 750, 7500)  # about 1k, 10k and 100k terms


def training_step(layers):
    loss, parameters = mlp(layers)
    gradients = ct.grad(loss, parameters)
    updates = {p: p - 0.1 * g for p, g in zip(parameters, gradients)}
    state = {p: np.zeros(p.shape, p.dtype) for p in parameters}
    named = ct.Graph([loss]).variables_by_name()
    inputs = [named["x"], named["y"]]  # mlp's own variables: a new ct.var of the same name would be another
    return loss, inputs, state, updates


def measure(layers, repeats):
    times = []
    for _ in range(repeats):
        loss, inputs, state, updates = training_step(layers)
        terms = len(ct.Graph([loss, *updates.values()]))
        gc.collect()
        start = time.perf_counter()
        program = ct.compile([loss], inputs=inputs, state=state, updates=updates)
        times.append(time.perf_counter() - start)
        kernels = len(program.kernels)
        at_bound = program.memory.peak_bytes == program.memory.lower_bound_bytes
        above = program.memory.peak_bytes / program.memory.lower_bound_bytes - 1
        placement = program.memory.order
        del loss, inputs, state, updates, program
    seconds = statistics.median(times)
    return {"layers": layers, "terms": terms, "kernels": kernels, "compile_seconds": seconds,
            "microseconds_per_term": 1e6 * seconds / terms, "arena_at_lower_bound": at_bound,
            "arena_above_lower_bound": above, "placement": placement}


def main():
    args = command_line(__doc__, "compile_cpu.json", repeats=3)
    rows = measured_rows(LAYERS, lambda layers: measure(layers, args.repeats), [
        ("layers", "layers", "7d"), ("terms", "terms", "7d"), ("kernels", "kernels", "8d"),
        ("seconds", "compile_seconds", "9.3f"), ("us/term", "microseconds_per_term", "8.1f"),
        ("above bound", "arena_above_lower_bound", "12.4%"), ("placement", "placement", "15s")])
    exponent = growth_exponent([r["terms"] for r in rows], [r["compile_seconds"] for r in rows])
    print(f"growth exponent of compile time in terms (1.0 = linear): {exponent:.3f}")
    write_results({"benchmark": "compile", "machine": describe(), "repeats": args.repeats, "rows": rows,
                   "time_growth_exponent": exponent}, args.out)


if __name__ == "__main__":
    main()
