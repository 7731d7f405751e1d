"""Layer norm and softmax cross-entropy on the GPU, forward and backward: cortado's plain expressions, fused by its
rules, against torch's ``F.layer_norm`` and ``F.cross_entropy``.

    python benchmarks/bench_norms_gpu.py [--repeats 100] [--out benchmarks/results/norms_gpu.json]

Cases, at the GPT benchmark's shapes:

- layer norm of bfloat16 rows, ``(x - mean) / sqrt(var + eps) * g + b`` as examples/gpt_by_hand.py writes it, with a
  bfloat16 gain and bias: forward, the output; backward, the output and the gradients of x, gain and bias for a
  given output gradient ``dy`` (ours: ``ct.grad`` of ``sum(y * dy)``; torch: autograd's ``y.backward(dy)``);
- softmax cross-entropy of bfloat16 logits computed in float32 (gpt_by_hand.py's ``logsumexp(logits) -
  take_along_axis(logits, labels)``, mean over rows; torch: ``F.cross_entropy`` of the float32 logits): forward,
  the loss; backward, the loss and the logits' gradient (torch: autograd from the bfloat16 logits through the cast).

Ours is one compiled program a case (cuda graphs, the cupy backend's defaults); the kernels it launches are counted
(views aside) and timed alone (``Program.profile``, the least of 5: "their us"), apart from the call, which adds
the call's host work and the graph's launch. torch runs eagerly, its
forward under ``no_grad``. Every result is checked against torch's before timing; each call is then timed alone
between CUDA events after a warm-up (``bench_fused_gpu.time_calls``), the median kept. A contestant missing here
(torch) is reported as not measured.
"""

import argparse
import importlib.util
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, print_table, require_gpu, time_calls  # noqa: E402
from gpt_by_hand import layer_norm  # noqa: E402
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

EPS = 1e-5
TOLERANCE = {"layer_norm": 3e-2, "cross_entropy": 1e-3}  # relative to each result's largest value: bfloat16 inputs
CASES = [("layer_norm", (8192, 768)), ("layer_norm", (16384, 384)),
         ("cross_entropy", (8192, 63)), ("cross_entropy", (8192, 32768))]


def feeds(kind, shape, rng):
    """The case's inputs as float32 NumPy arrays (labels as int32), drawn once for every contestant."""
    rows, n = shape
    if kind == "layer_norm":
        return {"x": rng.standard_normal(shape), "g": 1 + 0.1 * rng.standard_normal(n),
                "b": 0.1 * rng.standard_normal(n), "dy": rng.standard_normal(shape)}
    return {"logits": 3 * rng.standard_normal(shape), "labels": rng.integers(0, n, rows).astype(np.int32)}


# -- cortado ---------------------------------------------------------------------------------------


def cortado_program(kind, shape, backward):
    """The case's program and its input names: the plain expressions, with their gradients for ``backward``."""
    if kind == "layer_norm":
        x, dy = ct.var("x", shape, "bfloat16"), ct.var("dy", shape, "bfloat16")
        g, b = ct.var("g", shape[-1:], "bfloat16"), ct.var("b", shape[-1:], "bfloat16")
        y = layer_norm(x, g, b, EPS)
        outputs = [y, *ct.grad(ct.sum(ct.cast(y * dy, "float32")), [x, g, b])] if backward else [y]
        inputs = [x, g, b, dy] if backward else [x, g, b]
    else:
        logits, labels = ct.var("logits", shape, "bfloat16"), ct.var("labels", shape[:1], "int32")
        wide = ct.cast(logits, "float32")
        picked = ct.take_along_axis(wide, labels[:, None], axis=-1)[:, 0]
        loss = ct.mean(ct.logsumexp(wide, axis=-1) - picked)
        outputs = [loss, ct.grad(loss, [logits])[0]] if backward else [loss]
        inputs = [logits, labels]
    return ct.compile(outputs, inputs=inputs, backend="cupy"), [v.name for v in inputs]


def cortado_contestant(kind, shape, backward, values):
    import cupy

    program, names = cortado_program(kind, shape, backward)
    on_device = {name: cupy.asarray(values[name].astype(v.dtype))
                 for name, v in zip(names, program.inputs)}
    results = [cupy.asnumpy(r).astype(np.float64) for r in program(**on_device)]
    profiles = [program.profile(on_device).split() for _ in range(5)]  # "N kernels, T ms in all: ..."
    kernels, kernel_ms = int(profiles[0][0]), min(float(words[2]) for words in profiles)
    device, wall = time_calls(lambda: program(**on_device), clock("cupy"), ARGS.repeats)
    return {"ms": 1e3 * device, "wall_ms": 1e3 * wall, "kernels": kernels, "kernel_ms": kernel_ms, "results": results}


# -- torch -----------------------------------------------------------------------------------------


def torch_contestant(kind, shape, backward, values):
    import torch
    import torch.nn.functional as F

    def tensor(name, dtype, grad=False):
        return torch.tensor(values[name], dtype=dtype, device="cuda", requires_grad=grad)

    if kind == "layer_norm":
        x, g, b = (tensor(n, torch.bfloat16, backward) for n in ("x", "g", "b"))
        dy = tensor("dy", torch.bfloat16)

        def call():
            if not backward:
                with torch.no_grad():
                    return [F.layer_norm(x, shape[-1:], g, b, EPS)]
            x.grad = g.grad = b.grad = None
            y = F.layer_norm(x, shape[-1:], g, b, EPS)
            y.backward(dy)
            return [y, x.grad, g.grad, b.grad]
    else:
        logits, labels = tensor("logits", torch.bfloat16, backward), tensor("labels", torch.int64)

        def call():
            if not backward:
                with torch.no_grad():
                    return [F.cross_entropy(logits.float(), labels)]
            logits.grad = None
            loss = F.cross_entropy(logits.float(), labels)
            loss.backward()
            return [loss, logits.grad]

    results = [r.detach().float().cpu().numpy().astype(np.float64) for r in call()]
    device, wall = time_calls(call, clock("torch"), ARGS.repeats)
    return {"ms": 1e3 * device, "wall_ms": 1e3 * wall, "results": results}


# -- the run ---------------------------------------------------------------------------------------


def max_relative_error(ours, theirs):
    """The largest difference of any result, relative to that result's largest magnitude."""
    return max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, theirs))


def run_case(kind, shape, backward, rng):
    values = {k: np.asarray(v) for k, v in feeds(kind, shape, rng).items()}
    label = f"{kind} {'x'.join(map(str, shape))} {'forward+backward' if backward else 'forward'}"
    log(f"{label} ...")
    case = {"kind": kind, "shape": list(shape), "pass": "forward+backward" if backward else "forward", "contestants": {}}
    ours = attempt(f"{label}: cortado", cortado_contestant, kind, shape, backward, values)
    if importlib.util.find_spec("torch") is None:
        theirs = {"error": "not installed: torch", "not_installed": True}
        log(f"{label}: torch: not installed; not measured")
    else:
        theirs = attempt(f"{label}: torch", torch_contestant, kind, shape, backward, values)
    if "results" in ours and "results" in theirs:
        ours["max_rel_error"] = max_relative_error(ours["results"], theirs["results"])
        ours["mismatch"] = not ours["max_rel_error"] <= TOLERANCE[kind]
        ours["torch_over_ours"] = theirs["ms"] / ours["ms"]
    for name, result in (("cortado", ours), ("torch", theirs)):
        result.pop("results", None)
        case["contestants"][name] = result
    return case


COLUMNS = [("case", "case", "14s"), ("shape", "shape", "12s"), ("pass", "pass", "17s"), ("cortado us", "ours_us", "11.1f"),
           ("kernels", "kernels", "8d"), ("their us", "kernel_us", "9.1f"), ("torch us", "torch_us", "9.1f"),
           ("torch/ours", "torch_over_ours", "11.2f"),
           ("max rel err", "max_rel_error", "12.1e")]


def table(cases):
    """One row a case; a failure or a mismatch as its note."""
    rows = []
    for case in cases:
        ours, theirs = case["contestants"]["cortado"], case["contestants"]["torch"]
        errors = [f"{name} {r['error'].splitlines()[0]}" for name, r in (("cortado", ours), ("torch", theirs)) if "error" in r]
        rows.append({"case": case["kind"], "shape": "x".join(map(str, case["shape"])), "pass": case["pass"],
                     "ours_us": ours.get("ms", 0) * 1e3 or None, "kernels": ours.get("kernels"),
                     "kernel_us": ours.get("kernel_ms", 0) * 1e3 or None,
                     "torch_us": theirs.get("ms", 0) * 1e3 or None, "torch_over_ours": ours.get("torch_over_ours"),
                     "max_rel_error": ours.get("max_rel_error"),
                     "note": "; ".join(errors) or ("MISMATCH" if ours.get("mismatch") else "")})
    print_table(rows, COLUMNS)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "norms_gpu.json"))
    ARGS = parser.parse_args()
    device = require_gpu()
    log(f"{device}: layer norm and cross-entropy, cortado against torch eager")
    rng = np.random.default_rng(0)
    cases = [run_case(kind, shape, backward, rng) for kind, shape in CASES for backward in (False, True)]
    table(cases)
    write_results({"benchmark": "norms_gpu", "machine": describe(), "repeats": ARGS.repeats, "cases": cases}, ARGS.out)


ARGS = None

if __name__ == "__main__":
    main()
