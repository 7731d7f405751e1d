"""``Program.explain()`` on the training steps of ``bench_compile_scaling.py`` (an elementwise chain, a tanh MLP,
blocks of sums broadcast back) of 1k to 16k forward ops: its seconds and the length of its text should grow as the
terms do (linear), as compile's time does.

    python benchmarks/bench_explain_scaling.py [--repeats 1] [--sizes 1000,4000,16000] [--families chain,mlp,norms]
        [--out benchmarks/results/cpu/explain_scaling.json]

The chain is the case to watch: its forward pass is one fused region with an output for each value the backward pass
reads, and its backward pass one region reading them all, so text that writes a region's body wherever one of its
values is read grows with the square of the chain. A least-squares fit of log(seconds) and of log(characters) on
log(terms) gives the growth exponents: 1.0 is linear, 2.0 quadratic.
"""

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from bench_compile_scaling import BUILDERS, FAMILIES  # noqa: E402
from machine import describe  # noqa: E402
from reporting import growth_exponent, measured_rows, write_results  # noqa: E402

SIZES = (1_000, 4_000, 16_000)


def measure(family, ops, repeats):
    loss, inputs, parameters = BUILDERS[family](ops)
    gradients = ct.grad(loss, parameters)
    updates = {p: p - 0.1 * g for p, g in zip(parameters, gradients)}
    program = ct.compile([loss], inputs=inputs, state={p: np.zeros(p.shape, p.dtype) for p in parameters},
                         updates=updates)
    seconds = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        text = program.explain()
        seconds.append(time.perf_counter() - start)
    return {"family": family, "ops": ops, "terms": len(ct.Graph([loss, *updates.values()])),
            "kernels": len(program.kernels), "explain_seconds": statistics.median(seconds), "characters": len(text),
            "lines": text.count("\n") + 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="forward ops, comma-separated")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu",
                                                      "explain_scaling.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    columns = [("ops", "ops", "6d"), ("terms", "terms", "7d"), ("kernels", "kernels", "7d"),
               ("explain", "explain_seconds", "8.3f"), ("characters", "characters", "11d"), ("lines", "lines", "6d")]
    rows, exponents = [], {}
    for family in args.families.split(","):
        print(f"\n{family}:")
        measured = measured_rows(sizes, lambda ops, family=family: measure(family, ops, args.repeats), columns)
        rows += measured
        if len(measured) > 1:
            terms = [r["terms"] for r in measured]
            exponents[family] = {key: growth_exponent(terms, [max(r[key], 1e-6) for r in measured])
                                 for key in ("explain_seconds", "characters")}
            print("growth exponents in terms (1.0 = linear): "
                  + ", ".join(f"{key} {e:.2f}" for key, e in exponents[family].items()))
    write_results({"benchmark": "explain_scaling", "machine": describe(), "repeats": args.repeats,
                   "command": " ".join(["python", *sys.argv]), "rows": rows, "growth_exponents": exponents}, args.out)


if __name__ == "__main__":
    main()
