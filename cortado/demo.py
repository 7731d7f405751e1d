"""The demo: ``examples/mlp_numpy.py``, an MLP trained by gradient descent, its step compiled.

The demo *is* the example a user copies from, run from this checkout, so the two never drift
apart. Where CuPy sees an NVIDIA GPU, the step runs there (``backend="cupy"``).
"""

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mlp_numpy.py"


def run(seed=0, epochs=60, dot_path=None, plan_path="memory_plan.png"):
    if not EXAMPLE.exists():
        raise SystemExit(f"the demo runs {EXAMPLE}, which this installation lacks: install cortado from "
                         f"a checkout (python -m pip install -e .) to run it")
    spec = importlib.util.spec_from_file_location("mlp_numpy", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from .backends import gpu_visible

    backend, where = ("cupy", "the GPU") if gpu_visible() else ("numpy", "the CPU")
    print(f"Training a tanh MLP on three spirals: {EXAMPLE.name}; gradients by ct.grad, "
          f"the training step compiled by ct.compile for {where}\n")
    example.train(epochs=epochs, seed=seed, dot_path=dot_path, plan_path=plan_path, backend=backend)
