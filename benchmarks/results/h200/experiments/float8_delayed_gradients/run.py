"""The float8 GPT benchmark with every float8 layer's gradient scale delayed (``Linear(gradient_scaling="delayed")``)
instead of the default, current scaling: ``python benchmarks/results/h200/experiments/float8_delayed_gradients/run.py
--out delayed.json`` from the repository root, on the GPU machine."""

import runpy
import sys
from pathlib import Path

from cortado.nn import layers

default_init = layers.Linear.__init__


def delayed(self, *args, **kwargs):
    kwargs.setdefault("gradient_scaling", "delayed")
    default_init(self, *args, **kwargs)


layers.Linear.__init__ = delayed
root = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(root / "benchmarks"))
sys.argv[0] = str(root / "benchmarks" / "bench_float8_gpt_gpu.py")
runpy.run_path(sys.argv[0], run_name="__main__")
