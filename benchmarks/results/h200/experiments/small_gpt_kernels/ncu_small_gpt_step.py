"""One small-GPT training step (bench_gpt_gpu.py's small sizes, two layers) inside ncu's profiling window, each
kernel's name and what it reads and writes printed first (KERNEL lines), so that ncu's rows can be named:

    ncu --clock-control none --profile-from-start off --kernel-name regex:ct_ --csv --page details \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/results/h200/experiments/small_gpt_kernels/ncu_small_gpt_step.py > ncu.csv
"""
import math
import sys

import cupy

sys.path.insert(0, "benchmarks")
import bench_gpt_gpu as bench  # noqa: E402

import cortado as ct  # noqa: E402


def nbytes(t):
    return math.prod(t.shape) * t.dtype.itemsize


bench.SIZES["two"] = bench.Size(layers=2, width=384, heads=6, context=256, batch=64, warmup=0, steps=0)
work = bench.workload("two")
loss, tokens, labels, state, updates = bench.cortado_graph(work)
step = ct.compile(loss, inputs=[tokens, labels], state=state, updates=updates, backend="cupy")
for term, made in step._executor.runners.items():
    for source in getattr(made, "sources", []) or []:
        outs = term.attrs.outputs if term.op.name == "fused" else (term,)
        read = sum(nbytes(a) for a in dict.fromkeys(term.args))
        written = sum(nbytes(o) for o in outs)
        print("KERNEL", source.name, term.shape, term.dtype.name, f"read {read / 1e6:.1f} MB write {written / 1e6:.1f} MB",
              " ".join(f"{o.shape}{o.dtype.name}" for o in outs)[:120])
feeds = {"tokens_in": cupy.asarray(work.tokens), "labels": cupy.asarray(work.labels)}
for _ in range(3):
    step(**feeds)
cupy.cuda.runtime.deviceSynchronize()
print(step.profile(**feeds))
cupy.cuda.profiler.start()
step.profile(**feeds)
cupy.cuda.runtime.deviceSynchronize()
cupy.cuda.profiler.stop()
