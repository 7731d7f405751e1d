"""The compiler's side of kernels run beside the step (``Backend.beside``; the GPU's updates): what each reads stays
in place until the step that waits for it, the plan holding no more bytes at any step than it would without them.
Checked on the CPU through a backend that names every update written over its state as beside (its executor runs
them in order): the plan verified, its lower bound unchanged, the same values."""

import numpy as np

import cortado as ct
from cortado import backends, nn, optim
from cortado.backends.numpy import NumpyBackend


class _Beside(NumpyBackend):
    name = "numpy-beside"

    def __init__(self):
        self.seen = {}  # what the executor was given (the instance, and so these terms, die with the test)

    def beside(self, kernels, steps, sinks, options):
        return [i for i, s in enumerate(steps) if s.view_of is None and s.defines and all(d in sinks for d in s.defines)]

    def executor(self, kernels, steps, plan, signature, outputs, updates, sinks, beside, **options):
        self.seen.update(steps=steps, beside=beside)
        return super().executor(kernels, steps, plan, signature, outputs, updates, sinks, beside, **options)


def _step(backend):
    model = nn.MLP(12, 32, 32, 4)
    x, labels = ct.var("x", (16, 12)), ct.var("labels", (16,), "int32")
    loss = nn.cross_entropy(model(x), labels)
    params = model.parameters()
    state, updates = optim.AdamW(lr=1e-2).updates(params, ct.grad(loss, list(params.values())))
    return ct.compile([loss], inputs=[x, labels], state={**model.initial_values(0), **state}, updates=updates,
                      backend=backend, debug=True)


def test_what_a_kernel_beside_reads_stays_in_place_until_it_is_waited_for(monkeypatch):
    engine = _Beside()
    monkeypatch.setitem(backends._REGISTRY, "numpy-beside", engine)
    beside, plain = _step("numpy-beside"), _step("numpy")
    steps, joins = engine.seen["steps"], engine.seen["beside"]
    assert joins  # the AdamW updates
    placed = {p.key: p for p in beside.memory.placements}
    for i, j in joins.items():
        assert i < j <= len(steps)
        for value in steps[i].reads:
            if value in placed:
                assert placed[value].end >= j, (value, i, j)
    assert beside.memory.lower_bound_bytes <= plain.memory.lower_bound_bytes
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((16, 12)).astype(np.float32), "labels": rng.integers(0, 4, 16).astype(np.int32)}
    for _ in range(3):
        assert beside(**feeds)[0] == plain(**feeds)[0]
    for name in plain.state:
        np.testing.assert_array_equal(beside.state[name], plain.state[name])
