"""Terms built and scheduled per second for graphs of 1k, 10k and 100k terms.

    python benchmarks/bench_build.py [--repeats 5] [--out benchmarks/results/build_cpu.json]

The graph is a deep network of small blocks (a matmul, a bias, a nonlinearity, a reduction
and a residual sum), so that interning, shape and dtype inference, and the schedule's walk
all see realistic terms. Each size is built from scratch ``repeats`` times (the previous graph
freed first); the median is reported, and a least-squares fit of log(time) on log(size) gives
the exponent of growth: 1.0 is linear.

Each size is measured twice: as users run it, and with Python's cyclic garbage collector
switched off. The difference is CPython rescanning every live term in its full collections,
not work cortado does; the second exponent is the engine's own growth.
"""

import gc
import os
import statistics
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from reporting import command_line, growth_exponent, write_results  # noqa: E402
from machine import describe  # noqa: E402

SIZES = (1_000, 10_000, 100_000)
TERMS_PER_BLOCK = 8  # a var, matmul, add, tanh, sum, multiply, add, and a fresh weak constant


def build(n_terms):
    """A graph of about ``n_terms`` distinct terms; returns its output."""
    h = ct.var("x", (4, 4))
    for k in range(n_terms // TERMS_PER_BLOCK):
        W = ct.var(f"W{k}", (4, 4))
        z = ct.tanh(h @ W + h)
        h = z + ct.sum(z, axis=1, keepdims=True) * (1.0 / (k + 2))
    return h


def measure(n_terms, repeats, collector):
    builds, schedules, counts = [], [], []
    for _ in range(repeats):
        gc.collect()
        if not collector:
            gc.disable()
        start = time.perf_counter()
        out = build(n_terms)
        middle = time.perf_counter()
        order = ct.schedule(out)
        end = time.perf_counter()
        gc.enable()
        builds.append(middle - start)
        schedules.append(end - middle)
        counts.append(len(order))
        del out, order
    terms = counts[0]
    build_s, schedule_s = statistics.median(builds), statistics.median(schedules)
    return {
        "terms": terms,
        "build_seconds": build_s,
        "schedule_seconds": schedule_s,
        "built_per_second": terms / build_s,
        "scheduled_per_second": terms / schedule_s,
    }



def main():
    args = command_line(__doc__, "build_cpu.json", repeats=5)
    result = {"benchmark": "build_and_schedule", "machine": describe(), "repeats": args.repeats}
    print(f"{'collector':>9} {'terms':>8} {'build s':>9} {'built/s':>10} {'schedule s':>11} {'scheduled/s':>12}")
    for collector in ("on", "off"):
        rows = [measure(n, args.repeats, collector == "on") for n in SIZES]
        terms = [r["terms"] for r in rows]
        result[f"collector_{collector}"] = {
            "rows": rows,
            "build_growth_exponent": growth_exponent(terms, [r["build_seconds"] for r in rows]),
            "schedule_growth_exponent": growth_exponent(terms, [r["schedule_seconds"] for r in rows]),
        }
        for r in rows:
            print(f"{collector:>9} {r['terms']:>8} {r['build_seconds']:>9.4f} {r['built_per_second']:>10.0f} "
                  f"{r['schedule_seconds']:>11.4f} {r['scheduled_per_second']:>12.0f}")
    for collector in ("on", "off"):
        fit = result[f"collector_{collector}"]
        print(f"growth exponent with the collector {collector} (1.0 = linear): "
              f"build {fit['build_growth_exponent']:.3f}, schedule {fit['schedule_growth_exponent']:.3f}")
    write_results(result, args.out)


if __name__ == "__main__":
    main()
