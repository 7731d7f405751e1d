"""Why Adam fed its gradient lost 35 us to Adam on state in one run of bench_fused_gpu.py (486 against 451 us, where
an earlier run had 452 against 449): for the chain and Adam, fed and on state, in three rounds in turns, the host
time of a call, the call timed alone (as the benchmark times it), the time a call of 20 queued back to back, and the
kernels alone (Program.profile); then a Python profile of fed Adam calls."""

import cProfile
import pstats
import statistics
import sys
import time

import cupy
import numpy as np

import cortado as ct

N, LR, B1, B2, EPS = 2 ** 26, 1e-3, 0.9, 0.999, 1e-8
rng = np.random.default_rng(0)
x, y, p0, m0, g = (cupy.asarray(rng.standard_normal(N, dtype=np.float32)) for _ in range(5))
v0 = cupy.asarray(rng.standard_normal(N, dtype=np.float32)) ** 2


def chain(fed):
    xv, yv = ct.var("x", (N,), "float32"), ct.var("y", (N,), "float32")
    out = ct.tanh(0.5 * xv + yv) * ct.sigmoid(xv) + yv * yv
    if fed:
        step = ct.compile(out, inputs=[xv, yv], backend="cupy")
        return step, (lambda: step(x=x, y=y)), {"x": x, "y": y}
    step = ct.compile(out, state={xv: x.get(), yv: y.get()}, backend="cupy")
    return step, step, {}


def adam(fed):
    p, m, v, grad = (ct.var(name, (N,), "float32") for name in ("p", "m", "v", "g"))
    m_new = B1 * m + (1 - B1) * grad
    v_new = B2 * v + (1 - B2) * grad * grad
    p_new = p - LR * m_new / (ct.sqrt(v_new) + EPS)
    state = {p: p0.get(), m: m0.get(), v: v0.get()}
    if not fed:
        state[grad] = g.get()
    step = ct.compile([], inputs=[grad] if fed else [], state=state,
                      updates={p: p_new, m: m_new, v: v_new}, backend="cupy")
    return step, ((lambda: step(g=g)) if fed else step), ({"g": g} if fed else {})


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


programs = {f"{name} {'fed' if fed else 'state'}": make(fed) for name, make in (("chain", chain), ("adam", adam))
            for fed in (True, False)}
for _step, call, _feeds in programs.values():
    for _ in range(5):
        call()
sync()
for round_ in range(3):
    for name, (_step, call, _feeds) in programs.items():
        host, device = alone(call)
        print(f"round {round_} {name}: host {host:.1f} us a call; timed alone {device:.1f} us; "
              f"queued {queued(call):.1f} us a call", flush=True)
for name, (step, _call, feeds) in programs.items():
    print(f"{name} profile:\n" + step.profile(**feeds))
fed_adam = programs["adam fed"][1]
profiler = cProfile.Profile()
profiler.enable()
for _ in range(300):
    fed_adam()
    sync()
profiler.disable()
pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(20)
