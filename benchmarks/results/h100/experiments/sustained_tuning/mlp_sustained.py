"""Why the large bf16 MLP step is slower with tuned GEMMs: each GEMM's candidates timed briefly (as tuning does) and
under sustained load; the GPU's clocks and power while the two programs run in turns."""
import sys, subprocess, time, statistics
sys.path.insert(0, 'benchmarks'); sys.path.insert(0, 'examples')
import numpy as np, cupy
import bench_mlp_gpu as M
from cortado.backends.cupy.calls import timing
from cortado.backends.cupy.calls.cublaslt import Gemm

smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader", "-lms", "200"], stdout=open("/tmp/smi.txt", "w"))
work = M.workload("large", "bfloat16")
progs = {}
for name, options in (("tuned", {}), ("heuristic", {"autotune": False})):
    step = M.compiled_step(work.values, work.batch, work.sizes, work.dtype, **options)
    progs[name] = step
dtype = progs["tuned"].state["W1"].dtype
feeds = {"x": cupy.asarray(work.x.astype(dtype)), "y": cupy.asarray(work.y.astype(dtype))}
ex = progs["tuned"]._executor
print("tuned GEMMs:", flush=True)
gemms = [(made, ws) for made, ws in ex.tuned if isinstance(made.library, Gemm)]
seen = {}
for made, ws in gemms:
    lib = made.library
    if lib.key in seen: continue
    seen[lib.key] = (made, ws)
    print("  key", hash(lib.key) % 10000, "choice", lib.choice, "of", len(lib.candidates), flush=True)
# time each distinct GEMM's candidates: brief (tuning's 30 ms) and sustained (~600 ms after ~600 ms of warm-up)
pointers_all = ex._resolved([feeds[t.name].data.ptr for t in ex.feeds])
stream = ex.stream
for key, (made, ws) in seen.items():
    lib = made.library
    full = lib.candidates
    import cortado.backends.cupy.calls.cublaslt as L
    heur = L._heuristics[lib.key]
    lib.candidates = heur
    args = made._arguments([pointers_all[v] for v in made.values], ws)
    res = []
    for k in range(min(len(heur), 8)):
        lib.choice = k
        try:
            timing.TIMED_MS, timing.TIMED_CALLS = 30.0, 20
            brief = min(timing.time_graph(lambda: lib.call(*args, stream.ptr), stream) for _ in range(3))
            timing.TIMED_MS, timing.TIMED_CALLS = 600.0, 1000
            timing.time_graph(lambda: lib.call(*args, stream.ptr), stream)
            sustained = timing.time_graph(lambda: lib.call(*args, stream.ptr), stream)
        except Exception as e:
            brief = sustained = float('inf')
        res.append((k, brief, sustained))
    lib.candidates = full
    print(f"  GEMM {hash(key) % 10000}: " + "; ".join(f"{k}: {b*1e3:.0f}/{s*1e3:.0f} us" for k, b, s in res), flush=True)
    lib.choice = 0
timing.TIMED_MS, timing.TIMED_CALLS = 30.0, 20
# note: choices above were reset to 0; rebuild the tuned program to time it in turns
del progs["tuned"]
progs["tuned"] = M.compiled_step(work.values, work.batch, work.sizes, work.dtype)
def step_ms(p, n=20):
    p(**feeds); s = p._executor.stream
    a = s.record()
    for _ in range(n): p(**feeds)
    b = s.record(); b.synchronize()
    return cupy.cuda.get_elapsed_time(a, b) / n
for rnd in range(4):
    for name in (["tuned", "heuristic"] if rnd % 2 == 0 else ["heuristic", "tuned"]):
        t0 = time.time()
        print(f"  round {rnd} {name}: {step_ms(progs[name]):.3f} ms  (t={t0:.1f})", flush=True)
smi.terminate()
lines = open("/tmp/smi.txt").read().splitlines()
print("clocks/power samples (every 200 ms):", len(lines))
for l in lines[::2]: print("  ", l)
