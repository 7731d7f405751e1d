"""One eager float8 GPT step (one layer at the large widths) inside ncu's profiling window, the kernels' names and
what each reads and writes printed first (KERNEL lines), so that ncu's rows can be named:

    ncu --clock-control none --profile-from-start off --kernel-name regex:ct_ --csv --page details \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python3 ncu_float8_gpt_step.py > ncu.csv
"""
import sys

import cupy
import numpy as np

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "examples")
import bench_float8_gpt_gpu as bench  # noqa: E402
from gpt import TEXT  # noqa: E402
from profile_gpu import kernel_lines  # noqa: E402

bench.SIZES["one"] = dict(layers=1, width=768, heads=12, context=1024, batch=8)
data = np.frombuffer(open(TEXT, "rb").read(), np.uint8)
step, _ = bench.program("one", sys.argv[1] if len(sys.argv) > 1 else "float8", "cupy", data)
for line in kernel_lines(step):
    print(line)
tokens, labels = cupy.zeros((8, 1024), np.int32), cupy.ones((8, 1024), np.int32)
for _ in range(3):
    step(tokens_in=tokens, labels=labels)
cupy.cuda.runtime.deviceSynchronize()
print(step.profile(tokens_in=tokens, labels=labels))
cupy.cuda.profiler.start()
step.profile(tokens_in=tokens, labels=labels)
cupy.cuda.runtime.deviceSynchronize()
cupy.cuda.profiler.stop()
