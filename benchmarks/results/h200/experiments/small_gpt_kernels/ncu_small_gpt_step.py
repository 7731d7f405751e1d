"""One small-GPT training step (bench_gpt_gpu.py's small sizes, two layers) inside ncu's profiling window, each
kernel's name and what it reads and writes printed first (KERNEL lines), so that ncu's rows can be named:

    ncu --clock-control none --profile-from-start off --kernel-name regex:ct_ --csv --page details \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/results/h200/experiments/small_gpt_kernels/ncu_small_gpt_step.py > ncu.csv
"""
import sys

import cupy

sys.path.insert(0, "benchmarks")
import bench_gpt_gpu as bench  # noqa: E402
from profile_gpu import kernel_lines  # noqa: E402

import cortado as ct  # noqa: E402

bench.SIZES["two"] = bench.Size(layers=2, width=384, heads=6, context=256, batch=64, warmup=0, steps=0)
work = bench.workload("two")
loss, tokens, labels, state, updates = bench.cortado_graph(work)
step = ct.compile(loss, inputs=[tokens, labels], state=state, updates=updates, backend="cupy")
for line in kernel_lines(step):
    print(line)
feeds = {"tokens_in": cupy.asarray(work.tokens), "labels": cupy.asarray(work.labels)}
for _ in range(3):
    step(**feeds)
cupy.cuda.runtime.deviceSynchronize()
print(step.profile(**feeds))
cupy.cuda.profiler.start()
step.profile(**feeds)
cupy.cuda.runtime.deviceSynchronize()
cupy.cuda.profiler.stop()
