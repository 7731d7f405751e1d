"""Why the large bfloat16 MLP step is slower with tuned GEMMs: each GEMM's candidates timed briefly (as tuning does)
and under sustained load, then the tuned and the heuristic's programs in turns, the card's clocks and power sampled
all along. Run from the repository root on the GPU machine: python3 <this file>."""

import functools
import subprocess
import sys

import cupy

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "examples")
import bench_mlp_gpu as mlp  # noqa: E402

from cortado.backends.cupy.calls import cublaslt, timing  # noqa: E402

SAMPLES = "/tmp/clocks.csv"


def timed(call, stream, ms, calls):
    timing.TIMED_MS, timing.TIMED_CALLS = ms, calls
    return timing.time_graph(call, stream)


def candidates(step, feeds):
    """Each distinct GEMM's candidates: 30 ms of calls (the least of three), then 600 ms after 600 ms of warm-up."""
    executor = step._executor
    pointers = executor._resolved([feeds[t.name].data.ptr for t in executor.feeds])
    seen = set()
    for made, workspace in executor.tuned:
        gemm = made.library
        if not isinstance(gemm, cublaslt.Gemm) or gemm.key in seen:
            continue
        seen.add(gemm.key)
        chosen, gemm.candidates = gemm.choice, cublaslt._heuristics[gemm.key]
        arguments = made._arguments([pointers[v] for v in made.values], workspace)
        call = functools.partial(gemm.call, *arguments, executor.stream.ptr)
        times = []
        for k in range(len(gemm.candidates)):
            gemm.choice = k
            try:
                brief = min(timed(call, executor.stream, 30.0, 20) for _ in range(3))
                timed(call, executor.stream, 600.0, 1000)
                times.append(f"{k}: {1e3 * brief:.0f}/{1e3 * timed(call, executor.stream, 600.0, 1000):.0f} us")
            except cublaslt._lt().cuBLASLtError:
                times.append(f"{k}: refused")
        print(f"  GEMM {hash(gemm.key) % 10000}, tuned choice {chosen}: " + "; ".join(times), flush=True)
    timing.TIMED_MS, timing.TIMED_CALLS = 30.0, 20


def step_ms(step, feeds, calls=20):
    step(**feeds)
    stream = step._executor.stream
    start = stream.record()
    for _ in range(calls):
        step(**feeds)
    end = stream.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / calls


def main():
    query = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader",
             "-lms", "200"]
    with open(SAMPLES, "w") as samples:
        sampler = subprocess.Popen(query, stdout=samples)
        work = mlp.workload("large", "bfloat16")
        tuned = mlp.compiled_step(work.values, work.batch, work.sizes, work.dtype)
        dtype = tuned.state["W1"].dtype
        feeds = {"x": cupy.asarray(work.x.astype(dtype)), "y": cupy.asarray(work.y.astype(dtype))}
        candidates(tuned, feeds)
        programs = {"tuned": mlp.compiled_step(work.values, work.batch, work.sizes, work.dtype),  # its choices again
                    "heuristic": mlp.compiled_step(work.values, work.batch, work.sizes, work.dtype, autotune=False)}
        for turn in range(4):
            for name in list(programs)[::1 if turn % 2 == 0 else -1]:
                print(f"  round {turn} {name}: {step_ms(programs[name], feeds):.3f} ms", flush=True)
        sampler.terminate()
    lines = open(SAMPLES).read().splitlines()
    print(f"clocks and power, every 400 ms of {len(lines)} samples:")
    for line in lines[::2]:
        print("  ", line)


main()
