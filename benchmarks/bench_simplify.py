"""``simplify`` on graphs of 1k, 10k and 100k terms: the time per term should stay flat.

    python benchmarks/bench_simplify.py [--repeats 3] [--out benchmarks/results/simplify_cpu.json]

The graph is a deep network of small blocks, each written with the redundancy that generated
and hand-written code carries (a ``* 1``, a ``+ 0``, constants to collect, a transpose of a
transpose, a sum of a broadcast), so that simplify does real work at every block: about a third
of the terms go. Each size is built afresh ``repeats`` times and simplified once per build (the
engine memoises within a run, so a second run on the same graph would measure nothing). The
median is reported, with a least-squares fit of log(time) on log(terms): 1.0 is linear. Python's
cyclic collector is paused while simplifying, as schedule() does, so that CPython rescanning
live terms is not counted as the engine's work.

The time per term steps up by about a fifth between 10k and 100k terms and is flat beyond (50k:
55 us, 300k: 61 us in one run on the development machine): the working set leaves the CPU's
caches, as in bench_build.py, where building alone shows the same step.
"""

import gc
import os
import statistics
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from reporting import command_line, growth_exponent, measured_rows, write_results  # noqa: E402
from machine import describe  # noqa: E402

SIZES = (1_000, 10_000, 100_000)
TERMS_PER_BLOCK = 14


def build(n_terms):
    """A graph of about ``n_terms`` distinct terms with redundancy in every block; returns its output."""
    h = ct.var("x", (4, 4))
    for k in range(n_terms // TERMS_PER_BLOCK):
        W = ct.var(f"W{k}", (4, 4))
        z = ct.tanh(2.0 * (0.5 * (h @ W.T.T)) + 0)
        spread = ct.sum(ct.broadcast_to(z, (3, 4, 4)), axis=0)
        h = z * 1 + spread * (1.0 / (k + 2))
    return h


def measure(n_terms, repeats):
    times, before, after, rewrites = [], None, None, None
    for _ in range(repeats):
        out = build(n_terms)
        trace = ct.rules.Trace()
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        simplified = ct.rules.simplify(out, trace=trace)
        times.append(time.perf_counter() - start)
        gc.enable()
        before, after, rewrites = len(ct.schedule(out)), len(ct.schedule(simplified)), len(trace)
        del out, simplified, trace
    seconds = statistics.median(times)
    return {
        "terms": before,
        "terms_after": after,
        "rewrites": rewrites,
        "simplify_seconds": seconds,
        "microseconds_per_term": 1e6 * seconds / before,
    }



def main():
    args = command_line(__doc__, "simplify_cpu.json", repeats=3)
    rows = measured_rows(SIZES, lambda n: measure(n, args.repeats), [
        ("terms", "terms", "8d"), ("after", "terms_after", "8d"), ("rewrites", "rewrites", "9d"),
        ("seconds", "simplify_seconds", "9.3f"), ("us/term", "microseconds_per_term", "8.1f")])
    exponent = growth_exponent([r["terms"] for r in rows], [r["simplify_seconds"] for r in rows])
    print(f"growth exponent of simplify time in terms (1.0 = linear): {exponent:.3f}")
    result = {"benchmark": "simplify", "machine": describe(), "repeats": args.repeats, "rows": rows,
              "growth_exponent": exponent}
    write_results(result, args.out)


if __name__ == "__main__":
    main()
