"""The demo: ``examples/mlp_numpy.py``, an MLP trained by gradient descent, its step compiled (or, with
``--model cnn``, ``examples/cnn.py``, a small convolutional network).

The demo *is* the example a user copies from, run from this checkout, so the two never drift
apart. Where CuPy sees an NVIDIA GPU, the step runs there (``backend="cupy"``).
"""

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "mlp_numpy.py"


def _example(path):
    """The example at ``path``, imported from this checkout."""
    if not path.exists():
        raise SystemExit(f"the demo runs {path}, which this installation lacks: install cortado from "
                         f"a checkout (python -m pip install -e .) to run it")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def run_cnn(seed=0, epochs=8):
    """The convolutional network of ``examples/cnn.py``, on the GPU where one is visible."""
    print(f"Training a CNN on drawn images: {EXAMPLES / 'cnn.py'}; gradients by ct.grad, the step compiled by "
          f"ct.compile\n")
    _example(EXAMPLES / "cnn.py").train(epochs=epochs, seed=seed)


def run(seed=0, epochs=60, dot_path=None, plan_path="memory_plan.png"):
    example = _example(EXAMPLE)
    from .backends import gpu_visible

    backend, where = ("cupy", "the GPU") if gpu_visible() else ("numpy", "the CPU")
    print(f"Training a tanh MLP on three spirals: {EXAMPLE.name}; gradients by ct.grad, "
          f"the training step compiled by ct.compile for {where}\n")
    example.train(epochs=epochs, seed=seed, dot_path=dot_path, plan_path=plan_path, backend=backend)
