"""Where the fused chain's fed call loses to its state call (bench_fused_gpu.py: 93% against 97% of the copy floor
on an H200): host time of a call, event time of a call timed alone (as the benchmark times it), event time per call
of 20 queued back to back, the kernel alone (Program.profile), and a profile of the host's work in fed calls."""

import cProfile
import pstats
import statistics
import sys
import time

import cupy
import numpy as np

import cortado as ct

N = 2 ** 26
rng = np.random.default_rng(0)
x, y = (cupy.asarray(rng.standard_normal(N, dtype=np.float32)) for _ in range(2))
xv, yv = ct.var("x", (N,), "float32"), ct.var("y", (N,), "float32")
chain = ct.tanh(0.5 * xv + yv) * ct.sigmoid(xv) + yv * yv
fed = ct.compile(chain, inputs=[xv, yv], backend="cupy")
state = ct.compile(chain, state={xv: x.get(), yv: y.get()}, backend="cupy")
calls = {"fed": lambda: fed(x=x, y=y), "state": state}
start, end = cupy.cuda.Event(), cupy.cuda.Event()
sync = cupy.cuda.Device().synchronize


def alone(call):
    host, device = [], []
    for _ in range(50):
        sync()
        began = time.perf_counter()
        start.record()
        call()
        host.append(time.perf_counter() - began)
        end.record()
        sync()
        device.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(host) * 1e6, statistics.median(device)


def queued(call, n=20):
    times = []
    for _ in range(10):
        sync()
        start.record()
        for _ in range(n):
            call()
        end.record()
        sync()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / n)
    return statistics.median(times)


for name, call in calls.items():
    for _ in range(5):
        call()
    sync()
    host, device = alone(call)
    print(f"{name}: host {host:.1f} us a call; timed alone {device:.1f} us; queued {queued(call):.1f} us a call",
          flush=True)
print("fed profile:\n" + fed.profile(x=x, y=y))
print("state profile:\n" + state.profile())
profiler = cProfile.Profile()
profiler.enable()
for _ in range(2000):
    calls["fed"]()
profiler.disable()
sync()
pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(18)
