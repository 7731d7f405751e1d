"""Which calls a second process times again although a first one remembered their choices: the GPU test's program
(tests/test_gpu_choices.py) built in this process, each recall and each timing logged by the call's key digest.

    CORTADO_CACHE_DIR=/tmp/probe python3 probe.py; CORTADO_CACHE_DIR=/tmp/probe python3 probe.py
"""

import hashlib
import sys

import numpy as np

import cortado as ct
from cortado.backends.cupy.calls import choices, cublaslt, cudnn_conv


def digest(kind, key):
    return hashlib.sha256(repr((kind, repr(key))).encode()).hexdigest()[:10]


recall, remember = choices.recall, choices.remember


def logged_recall(kind, key):
    found = recall(kind, key)
    print("recall", kind, digest(kind, key), "found" if found is not None else "none",
          str(found)[:60] if found is not None else "")
    return found


def logged_remember(kind, key, value):
    print("remember", kind, digest(kind, key), str(value)[:60])
    if kind == "cudnn":
        print("   key", repr(key)[:400])
    return remember(kind, key, value)


choices.recall, choices.remember = logged_recall, logged_remember
for kind, what in ((cublaslt.Gemm, "cublaslt"), (cudnn_conv.Conv, "cudnn")):
    def timed(self, *arguments, _time=kind._time, _what=what):
        key = self.key if _what == "cublaslt" else self.tuned_key
        print("time", _what, digest(_what, key))
        return _time(self, *arguments)
    kind._time = timed
    tune = kind.tune

    def tuned(self, pointers, stream, _tune=tune, _what=what):
        offered = [c.tobytes().hex()[:16] for c in self.candidates] if _what == "cublaslt" else \
            [self.graph.get_plan_name_at_index(i) for i in self.plans] if self.graph is not None else []
        print("tune", _what, "offered", offered)
        return _tune(self, pointers, stream)
    kind.tune = tuned

x, w, v = ct.var("x", (8, 3, 16, 16)), ct.var("w", (8, 3, 3, 3)), ct.var("v", (8 * 16 * 16, 40))
y = ct.reshape(ct.relu(ct.conv(x, w, padding=1)), (8, 8 * 16 * 16)) @ v
outputs = [y] + ct.grad(ct.sum(y * y), [x, w, v])
program = ct.compile(outputs, inputs=[x, w, v], backend="cupy")
rng = np.random.default_rng(0)
feeds = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in (x, w, v)}
results = [r.get() for r in program(**feeds)]
print("results", [hashlib.sha256(r.tobytes()).hexdigest()[:10] for r in results])
sys.stdout.flush()
