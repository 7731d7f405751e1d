"""Where the GPU MLP step's time goes: ``Program.profile`` of the benchmark's steps, kernel by kernel.

    python benchmarks/profile_mlp_gpu.py [--sizes small,large] [--dtypes float32,bfloat16]
                                         [--out results/profile_mlp_gpu.txt]

Each kernel is timed alone between device events (no CUDA graph), so the sum is more than a
replayed step takes: it says which kernels to work on, not how fast the step is.
"""

import argparse
import os

import cupy

from bench_mlp_gpu import CASES, workload
from mlp_gpu import compiled_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "profile_mlp_gpu.txt"))
    args = parser.parse_args()
    reports = []
    for size in args.sizes.split(","):
        for dtype in args.dtypes.split(","):
            work = workload(size, dtype)
            step = compiled_step(work.values, work.batch, work.sizes, dtype)
            stored = step.state["W1"].dtype
            x, y = cupy.asarray(work.x.astype(stored)), cupy.asarray(work.y.astype(stored))
            for _ in range(3):
                step(x=x, y=y)
            layers = "-".join(map(str, CASES[size][0]))
            report = (f"{size} {dtype} ({layers}, batch {work.batch}; {step.device_bytes / 2**20:.1f} MiB on the device): "
                      + step.profile(x=x, y=y))
            print(report, flush=True)
            reports.append(report)
            del step
    with open(args.out, "w") as out:
        out.write("\n\n".join(reports) + "\n")


if __name__ == "__main__":
    main()
