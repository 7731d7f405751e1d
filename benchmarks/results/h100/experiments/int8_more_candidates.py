"""The int8 own kernel at the mid and large shapes with many more tilings timed: is a faster one outside the
cost model's first few?"""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import bench_int8_gpu as B  # noqa: E402

from cortado.backends.cupy.calls.int8 import runner as R  # noqa: E402

R.CANDIDATES, R.WARPGROUP_CANDIDATES = 14, 14
original = R.Int8Gemm.tune


def tune(self, pointers, stream):
    original(self, pointers, stream)
    if self.times is not None:
        ranked = sorted(zip(self.times, (c.describe() for c in self.candidates)))
        print("  candidates:", "; ".join(f"{d} {t * 1e3:.2f} us" for t, d in ranked[:8]), flush=True)


R.Int8Gemm.tune = tune
B.SHAPES = [(512, 1024, 784), (2048, 1024, 1024), (4096, 4096, 4096)]
rows = B.gemm_rows(5)
for row in rows:
    ours, own = row["cortado"].get("ms", 0), row["cortado"].get("kernel_ms") or 0
    print(row["shape"], "ours", round(ours * 1e3, 2), "own", round(own * 1e3, 2), "Lt int8",
          round(row["cublaslt_int8"].get("ms", 0) * 1e3, 2), "|", row["cortado"].get("choice"), flush=True)
