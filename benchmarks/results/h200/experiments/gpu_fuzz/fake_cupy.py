# ruff: noqa: E401, E402
"""The campaign with --backend cupy on a machine without a GPU: a fake ``cupy`` module (NumPy arrays with .get())
and ct.compile's "cupy" mapped to the numpy backend, so that the harness's cupy-only paths (device feeds, the
health check, the GPU's criteria, cpu_verdict) run; a check of this script, not of the GPU. Index mode then reports
unclear_errors by design (the CPU raises on the indices outside the axis the GPU clamps).

    PYTHONPATH=$PWD python3 build/gpu_fuzz/fake_cupy.py --backend cupy --modes all --seconds 60 --out /tmp/gfz_fake
"""
import sys, types
import numpy as np

class Arr(np.ndarray):
    def get(self):
        return np.array(self)

def asarray(a, dtype=None):
    return np.array(a, dtype=dtype).view(Arr)

def zeros(shape, dtype):
    return np.zeros(shape, dtype).view(Arr)

fake = types.ModuleType("cupy")
fake.asarray, fake.zeros, fake.float32, fake.ndarray = asarray, zeros, np.float32, Arr
fake.arange = lambda n, dtype=None: np.arange(n, dtype=dtype).view(Arr)
fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None))
sys.modules["cupy"] = fake
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import cortado as ct
real = ct.compile
def compile(*a, backend="numpy", **kw):
    if backend == "cupy":
        kw.pop("cuda_graph", None)
        program = real(*a, backend="numpy", **kw)
        call = program.__call__
        class Wrapped:
            def __init__(s): s.traces, s.state = program.traces, program.state
            def __call__(s, **feeds):
                feeds = {k: np.asarray(v) for k, v in feeds.items()}
                return [np.array(r).view(Arr) for r in call(**feeds)]
        return Wrapped()
    return real(*a, backend=backend, **kw)
ct.compile = compile
import campaign as C
C.main()
