"""gelu on the GPU over values of different ranges: cortado's compiled gelu against torch's
``F.gelu(approximate="tanh")``, bfloat16 at the GPT's shape.

    python benchmarks/bench_gelu_gpu.py [--repeats 100] [--out benchmarks/results/gelu_gpu.json]

A kernel's time should not depend on its values. Three inputs of 8 x 1024 x 3072 bfloat16 values: N(0, 1); N(0, 64),
the range of a trained model's pre-activations; and N(0, 1) with one value in 100 at -13, where gelu's sigmoid
meets a subnormal exponential (gelu's argument is beyond -87). Ours is one compiled program (its kernel and the
graph's launch), fed the CuPy array where it lies; torch runs eagerly. Each call is timed alone between CUDA events
after a warm-up (``bench_fused_gpu.time_calls``), the median kept; each result is checked against torch's. Where
torch is not installed its column says so.
"""

import importlib.util
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, print_table, require_gpu, time_calls  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, write_results  # noqa: E402

import cortado as ct  # noqa: E402

SHAPE = (8, 1024, 3072)
TOLERANCE = 2 ** -7  # bfloat16's rounding of the result, relative to the largest magnitude


def inputs(rng):
    """The three float32 inputs, by name (rounded to bfloat16 by each contestant alike)."""
    normal = rng.standard_normal(SHAPE, np.float32)
    return {"N(0, 1)": normal, "N(0, 64)": normal * 8,
            "1% at -13": np.where(rng.random(SHAPE) < 0.01, np.float32(-13), normal)}


def ours(values, repeats):
    """Our compiled gelu: device ms a call, and its kernel's alone (``Program.profile``, the least of 5)."""
    import cupy

    x = ct.var("x", SHAPE, "bfloat16")
    program = ct.compile([ct.gelu(x)], inputs=[x], backend="cupy")
    fed = cupy.asarray(values.astype(x.dtype))
    result = cupy.asnumpy(program(x=fed)[0]).astype(np.float64)
    kernel_ms = min(float(program.profile(x=fed).split()[2]) for _ in range(5))  # "N kernels, T ms in all: ..."
    device, _ = time_calls(lambda: program(x=fed), clock("cupy"), repeats)
    return {"ms": 1e3 * device, "kernel_ms": kernel_ms, "result": result}


def torch_gelu(values, repeats):
    import torch
    import torch.nn.functional as F

    x = torch.tensor(values, dtype=torch.bfloat16, device="cuda")

    def call():
        return F.gelu(x, approximate="tanh")

    result = call().float().cpu().numpy().astype(np.float64)
    device, _ = time_calls(call, clock("torch"), repeats)
    return {"ms": 1e3 * device, "result": result}


def main():
    args = command_line(__doc__, "gelu_gpu.json", 100)
    _, name = require_gpu()
    log(f"gelu on {name}")
    torch_installed = importlib.util.find_spec("torch") is not None
    rows = []
    for label, values in inputs(np.random.default_rng(0)).items():
        row = {"values": label, "cortado": attempt(f"{label} cortado", ours, values, args.repeats)}
        row["torch"] = (attempt(f"{label} torch", torch_gelu, values, args.repeats) if torch_installed
                        else {"error": "torch is not installed"})
        mine, theirs = row["cortado"].pop("result", None), row["torch"].pop("result", None)
        if mine is not None and theirs is not None:
            row["max_rel_error"] = float(np.abs(mine - theirs).max() / np.abs(theirs).max())
            row["mismatch"] = not row["max_rel_error"] <= TOLERANCE
        rows.append(row)
    table = [{"values": r["values"], "ours_us": 1e3 * r["cortado"]["ms"] if "ms" in r["cortado"] else None,
              "kernel_us": 1e3 * r["cortado"]["kernel_ms"] if "kernel_ms" in r["cortado"] else None,
              "torch_us": 1e3 * r["torch"]["ms"] if "ms" in r["torch"] else None} for r in rows]
    print_table(table, [("values", "values", "12s"), ("ours us", "ours_us", "9.1f"), ("kernel us", "kernel_us", "10.1f"),
                        ("torch us", "torch_us", "9.1f")])
    if not torch_installed:
        print("torch is not installed: its column is not measured")
    write_results({"machine": describe(), "shape": list(SHAPE), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
