"""random_uniform on the CPU: the C of backends/numpy/philox.py against NumPy's definition, alone and in an MLP step
with a dropout, one after another in one process (median of repeats).

    PYTHONPATH=. python3 benchmarks/results/cpu/experiments/philox/probe.py
"""

import time

import numpy as np

import cortado as ct
from cortado import nn, optim
from cortado.backends.numpy import philox
from cortado.exprgraph.ops.random import uniform


def median_us(call, repeats):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1e6 * float(np.median(times))


for shape in ((64, 64), (256, 1024)):
    out = np.empty(shape, np.float32)
    c = median_us(lambda out=out: philox.uniform_into(out, 1, 2, 0), 50)
    numpy = median_us(lambda shape=shape: uniform(1, 2, shape, 0), 20)
    print(f"random_uniform {shape}: C {c:.1f} us, NumPy {numpy:.1f} us ({numpy / c:.1f}x)")

model = nn.Sequential(nn.Linear(32, 64), nn.Function(ct.relu), nn.Dropout(0.1), nn.Linear(64, 4))
x, y = ct.var("x", (64, 32)), ct.var("y", (64,), "int32")
loss = nn.cross_entropy(model(x), y)
params = model.parameters()
state, updates = optim.SGD(0.1).updates(params, ct.grad(loss, list(params.values())))
step = ct.compile([loss], inputs=[x, y], state={**model.initial_values(), **state},
                  updates={**updates, **model.state_updates(loss)})
rng = np.random.default_rng(0)
xv, yv = rng.standard_normal((64, 32)).astype(np.float32), rng.integers(0, 4, 64).astype(np.int32)
for _ in range(20):
    step(x=xv, y=yv)
with_c = median_us(lambda: step(x=xv, y=yv), 500)
original = philox.uniform_into
philox.uniform_into = lambda *args: False
with_numpy = median_us(lambda: step(x=xv, y=yv), 500)
philox.uniform_into = original
print(f"MLP 32-64-4 step with Dropout(0.1), batch 64: C {with_c:.1f} us, NumPy's random {with_numpy:.1f} us")
