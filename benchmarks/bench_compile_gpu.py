"""A GPU program's first build, its kernel cache empty: NVRTC compiling one kernel at a time against compiling them
side by side on the build's threads (``cortado/backends/cupy/kernels.py``).

    python benchmarks/bench_compile_gpu.py [--repeats 1] [--out benchmarks/results/compile_gpu.json]

Cases: the quantized MLP of ``bench_int8_gpu.py`` at batch 512 (three int8 products, each with its candidate kernels
compiled, then timed), and the GPT's large training step in bfloat16 (``bench_gpt_gpu.py``: about 500 kernels). Each
build (``ct.compile`` and the first call, which together are what a user waits for) runs in a process of its own
with a fresh cache folder, with ``CORTADO_COMPILE_THREADS=1`` and with the default, in turns.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import log, print_table, require_gpu  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, write_results  # noqa: E402

CASES = ("int8 MLP", "GPT large")


def build(case):
    """Seconds of ``ct.compile`` and the first call of ``case``."""
    import cupy
    import numpy as np

    if case == "int8 MLP":
        import bench_int8_gpu as int8

        rng = np.random.default_rng(0)
        weights = int8._mlp_weights(rng)
        scales = [np.float32(4.0 / 127), np.float32(8.0 / 127), np.float32(8.0 / 127)]
        x = np.clip(np.rint(rng.standard_normal((512, int8.MLP_SIZES[0])) / scales[0]), -128, 127).astype(np.int8)
        start = time.perf_counter()
        program = int8._int8_program(512, weights, scales)
        program(x=cupy.asarray(x))
    else:
        import bench_gpt_gpu as gpt

        import cortado as ct

        work = gpt.workload("large")
        loss, tokens, labels, state, updates = gpt.cortado_graph(work)
        start = time.perf_counter()
        program = ct.compile(loss, inputs=[tokens, labels], state=state, updates=updates, backend="cupy")
        program(tokens_in=cupy.asarray(work.tokens), labels=cupy.asarray(work.labels))
    cupy.cuda.Device().synchronize()
    return {"seconds": time.perf_counter() - start, "kernels": len(program.kernels)}


def in_child(case, threads):
    """``build(case)`` in a process of its own, with an empty cache folder and ``threads`` compiling (None: the
    default)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "CORTADO_CACHE_DIR": cache}
        env.pop("CORTADO_COMPILE_THREADS", None)
        if threads is not None:
            env["CORTADO_COMPILE_THREADS"] = str(threads)
        done = subprocess.run([sys.executable, __file__, "--child", case], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{case}: the build failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    if "--child" in sys.argv:
        print(json.dumps(build(sys.argv[sys.argv.index("--child") + 1])))
        return
    args = command_line(__doc__, "compile_gpu.json", 1)
    _, name = require_gpu()
    from cortado.backends.cupy.kernels import compiling_threads

    threads = compiling_threads()
    log(f"first builds on {name}, kernel cache empty: one compiling thread against {threads}")
    rows = []
    for case in CASES:
        rounds = {"one thread": [], f"{threads} threads": []}
        for _ in range(args.repeats):
            for label, count in (("one thread", 1), (f"{threads} threads", None)):
                result = in_child(case, count)
                rounds[label].append(result["seconds"])
                log(f"{case}, {label}: {result['seconds']:.1f} s, {result['kernels']} kernels")
        one, many = (statistics.median(rounds[label]) for label in rounds)
        rows.append({"case": case, "one_s": one, "threads_s": many, "speedup": one / many, "rounds": rounds,
                     "kernels": result["kernels"]})
    print_table(rows, [("case", "case", "10s"), ("1 thread s", "one_s", "11.1f"),
                       (f"{threads} thr. s", "threads_s", "10.1f"), ("speedup", "speedup", "8.2f")])
    write_results({"machine": describe(), "threads": threads, "cases": rows}, args.out)


if __name__ == "__main__":
    main()
