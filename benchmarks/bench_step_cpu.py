"""The compiled MLP training step on the CPU against the same step written by hand in NumPy, and
against PyTorch's CPU eager mode where torch is installed.

    python benchmarks/bench_step_cpu.py [--repeats 200] [--out benchmarks/results/step_cpu.json]

One step is a forward pass of a tanh MLP with softmax cross-entropy, its backward pass and a
gradient-descent update of every parameter. Three sizes: the spirals model of the examples
(2-32-32-3, batch 60), a mid-size one (784-256-256-10, batch 128) and a large one
(784-1024-1024-10, batch 256). Each contestant runs the same step from the same initial weights
on the same random batch. Each contestant runs in a process of its own, one after another (never
beside PyTorch's thread pool, which slows NumPy's and ours when it shares their process), and the
medians of ``repeats`` calls after a warm-up are compared; each contestant runs in three such processes, in turns
with the others', and the median of the three is its figure. The NumPy step is what a careful user
writes: idiomatic NumPy, its temporaries allocated by NumPy, its updates in place. Where torch is
not installed, its column says so and the rest still runs.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import cortado as ct  # noqa: E402
from machine import describe  # noqa: E402
from mlp_numpy import initial_values, mlp  # noqa: E402
from reporting import command_line, measured_rows, write_results  # noqa: E402
from versus_torch import in_turns, median_ms, torch_installed, torch_version  # noqa: E402

CASES = {"spirals": ((2, 32, 32, 3), 60), "mid": ((784, 256, 256, 10), 128), "large": ((784, 1024, 1024, 10), 256)}
LEARNING_RATE = 0.1


def compiled_step(sizes, batch, values):
    loss, _, x, y, parameters = mlp(batch, sizes)
    gradients = ct.grad(loss, parameters)
    step = ct.compile([loss], inputs=[x, y], state={p: values[p.name] for p in parameters},
                      updates={p: p - LEARNING_RATE * g for p, g in zip(parameters, gradients)})
    return lambda xv, yv: step(x=xv, y=yv)[0]


def numpy_step(sizes, values):
    weights = [values[f"W{i}"].copy() for i in range(1, len(sizes))]
    biases = [values[f"b{i}"].copy() for i in range(1, len(sizes))]

    def step(x, y):
        hidden = [x]
        for W, b in zip(weights[:-1], biases[:-1]):
            hidden.append(np.tanh(hidden[-1] @ W + b))
        logits = hidden[-1] @ weights[-1] + biases[-1]
        peak = logits.max(axis=1, keepdims=True)
        shifted = logits - peak
        exponentials = np.exp(shifted)
        total = exponentials.sum(axis=1, keepdims=True)
        loss = np.mean(np.log(total[:, 0]) + peak[:, 0] - (logits * y).sum(axis=1))
        delta = (exponentials / total - y) / len(x)
        for i in range(len(weights) - 1, -1, -1):
            grad_W, grad_b = hidden[i].T @ delta, delta.sum(axis=0)
            if i:
                delta = (delta @ weights[i].T) * (1 - hidden[i] * hidden[i])
            weights[i] -= LEARNING_RATE * grad_W
            biases[i] -= LEARNING_RATE * grad_b
        return loss

    return step


def torch_step(sizes, values):
    import torch

    weights = [torch.tensor(values[f"W{i}"], requires_grad=True) for i in range(1, len(sizes))]
    biases = [torch.tensor(values[f"b{i}"], requires_grad=True) for i in range(1, len(sizes))]
    parameters = weights + biases

    def step(x, y):
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        h = x
        for W, b in zip(weights[:-1], biases[:-1]):
            h = torch.tanh(h @ W + b)
        logits = h @ weights[-1] + biases[-1]
        loss = torch.mean(torch.logsumexp(logits, dim=1) - (logits * y).sum(dim=1))
        loss.backward()
        with torch.no_grad():
            for p in parameters:
                p -= LEARNING_RATE * p.grad
                p.grad = None
        return loss.item()

    return step


CONTESTANTS = {"cortado": lambda sizes, batch, values: compiled_step(sizes, batch, values),
               "numpy": lambda sizes, batch, values: numpy_step(sizes, values),
               "torch": lambda sizes, batch, values: torch_step(sizes, values)}


def timed(name, case, repeats):
    """In this process: contestant ``name``'s first loss and the median milliseconds of ``repeats`` calls of its
    step after a warm-up."""
    sizes, batch = CASES[case]
    rng = np.random.default_rng(0)
    _, _, _, _, parameters = mlp(batch, sizes)
    values = initial_values(parameters, rng)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]
    step = CONTESTANTS[name](sizes, batch, values)
    return median_ms(lambda: step(x, y), repeats)


def measure(case, repeats):
    """Each contestant in processes of its own, in turns (``versus_torch.in_turns``); their first losses must
    agree."""
    sizes, batch = CASES[case]
    row = {"case": case, "sizes": "-".join(map(str, sizes)), "batch": batch}
    names = [name for name in CONTESTANTS if name != "torch" or torch_installed()]
    if "torch" not in names:
        row["torch_ms"] = float("nan")
    runs = in_turns(__file__, names, "--case", case, "--repeats", repeats)
    for name, run in runs.items():
        row[f"{name}_ms"], row[f"{name}_rounds_ms"] = run["ms"], run["rounds_ms"]
    first = [run["first_loss"] for run in runs.values()]
    assert max(first) - min(first) < 1e-4 * abs(runs["numpy"]["first_loss"]), runs
    for peer in ("numpy", "torch"):
        row[f"speedup_vs_{peer}"] = row[f"{peer}_ms"] / row["cortado_ms"]
    return row


def main():
    if "--contestant" in sys.argv:  # a child: one contestant, one case
        parser = argparse.ArgumentParser()
        parser.add_argument("--contestant", choices=list(CONTESTANTS))
        parser.add_argument("--case", choices=list(CASES))
        parser.add_argument("--repeats", type=int)
        args = parser.parse_args()
        print(json.dumps(timed(args.contestant, args.case, args.repeats)))
        return
    args = command_line(__doc__, "step_cpu.json", repeats=200)
    if not torch_installed():
        print("torch is not installed: its column is nan (pip install torch to time it)")
    rows = measured_rows(list(CASES), lambda case: measure(case, args.repeats), [
        ("case", "case", "8s"), ("sizes", "sizes", "18s"), ("batch", "batch", "6d"),
        ("cortado ms", "cortado_ms", "11.3f"), ("numpy ms", "numpy_ms", "9.3f"), ("torch ms", "torch_ms", "9.3f"),
        ("vs numpy", "speedup_vs_numpy", "9.2f"), ("vs torch", "speedup_vs_torch", "9.2f")])
    write_results({"benchmark": "step_cpu", "machine": describe(), "torch": torch_version(),
                   "repeats": args.repeats, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
