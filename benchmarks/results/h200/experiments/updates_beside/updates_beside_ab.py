"""The large GPT step (bench_float8_gpt_gpu.py's model, bfloat16 and float8) with its updates beside the step and in
order (``overlap_updates=False``), in turns: device ms a step (the median of ``--repeats`` runs of 50 steps), the
kernels run beside and the arena's bytes.

    python benchmarks/results/h200/experiments/updates_beside/updates_beside_ab.py [--rounds 1] [--repeats 5]

Each round takes both dtypes; within a dtype, in order first in even rounds, beside first in odd ones.
"""

import argparse
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "examples")]

import numpy as np  # noqa: E402

import bench_float8_gpt_gpu as bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    text = open(bench.TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    data = np.array([alphabet.index(c) for c in text], np.int32)
    x, y = bench.windows(data, 8, 1024, np.random.default_rng(0))
    x, y = bench._device(x, "cupy"), bench._device(y, "cupy")
    for round_ in range(args.rounds):
        for dtype in ("bfloat16", "float8"):
            for overlap in ((False, True) if round_ % 2 == 0 else (True, False)):
                step = bench.program("large", dtype, "cupy", data, overlap_updates=overlap)[0]
                for _ in range(10):
                    step(tokens_in=x, labels=y)
                print(dtype, "beside" if overlap else "in order", len(step._executor.beside), "kernels beside",
                      f"arena {step.memory.peak_bytes / 2**20:.1f} MiB",
                      f"{bench.step_ms(step, x, y, args.repeats):.3f} ms", flush=True)
                del step


if __name__ == "__main__":
    main()
