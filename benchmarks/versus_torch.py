"""A CPU step against PyTorch's eager one, each contestant timed in processes of its own, in turns (never beside
PyTorch's thread pool, which slows NumPy's and ours when it shares their process): what bench_gpt_cpu.py,
bench_cnn_cpu.py and bench_step_cpu.py share."""

import argparse
import importlib.util
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time

from machine import describe
from reporting import write_results


def median_ms(step, repeats, warmup=5):
    """``{"first_loss", "first_call_s", "ms"}``: ``step()``'s first result and the seconds it took, then the median
    milliseconds of ``repeats`` calls after ``warmup`` more."""
    started = time.perf_counter()
    first = float(step())
    first_call = time.perf_counter() - started
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return {"first_loss": first, "first_call_s": first_call, "ms": 1e3 * statistics.median(seconds)}


def torch_training_step(loss_of, optimizer):
    """A torch step: ``loss_of()``, its backward pass and ``optimizer``'s update; returns the loss."""
    def step():
        loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return step


def torch_installed():
    return importlib.util.find_spec("torch") is not None


def torch_version():
    """torch's version and threads, or None where it is not installed."""
    if not torch_installed():
        return None
    import torch

    return f"{torch.__version__}, {torch.get_num_threads()} threads"


def alone(script, *arguments, cache=None):
    """The JSON that ``script`` prints last, run with ``arguments`` in a process of its own (with ``cache`` as its
    ``CORTADO_CACHE_DIR``, where given)."""
    env = None if cache is None else {**os.environ, "CORTADO_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, script, *map(str, arguments)], capture_output=True, text=True, check=True,
                          env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


ROUNDS = 3  # each contestant's process runs this many times, in turns with the others'


def in_turns(script, names, *arguments):
    """``{name: its run}`` for each of ``names``, run alone (``alone(script, "--contestant", name, *arguments)``) in
    ``ROUNDS`` rounds of turns, the order rotated each round; its run is its median round's (by ``ms``), with every
    round's ``ms`` as ``rounds_ms``. This machine has slow spells of seconds in which one process may run 1.5x
    slower than its others: one run each would rank the contestants by chance."""
    runs = {name: [] for name in names}
    for turn in range(ROUNDS):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            runs[name].append(alone(script, "--contestant", name, *arguments))
    chosen = {}
    for name, found in runs.items():
        ranked = sorted(found, key=lambda run: run["ms"])
        chosen[name] = {**ranked[len(ranked) // 2], "rounds_ms": [run["ms"] for run in found]}
    return chosen


def _compile_seconds(script):
    """``{"cold", "cached"}``: seconds to build our model, compile its step and make the first call, in a process
    whose cache of compiled C (``CORTADO_CACHE_DIR``) is empty, then in one after it was filled."""
    seconds = {}
    with tempfile.TemporaryDirectory() as cache:
        for kind in ("cold", "cached"):
            row = alone(script, "--contestant", "cortado", "--repeats", 1, cache=cache)
            seconds[kind] = row["build_s"] + row["first_call_s"]
    return seconds


def compare(doc, script, contestants, name, repeats, out, results):
    """The command line of a two-contestant benchmark (``contestants``: ``{"cortado": make, "torch": make}``, each
    ``make()`` a step returning its loss): as a child (``--contestant``), time one; else time each in turns
    (``in_turns``), check
    that their first losses agree, print the ratio and write ``results`` and the rows to ``--out`` (default
    ``out``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", default=out)
    parser.add_argument("--contestant", choices=list(contestants), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contestant:
        started = time.perf_counter()
        step = contestants[args.contestant]()
        print(json.dumps({"build_s": time.perf_counter() - started, **median_ms(step, args.repeats)}))
        return
    names = [name for name in contestants if name != "torch" or torch_installed()]
    if "torch" not in names:
        print("torch: not installed (pip install torch to time it)")
    rows = in_turns(script, names, "--repeats", args.repeats)
    for contestant, row in rows.items():
        print(f"{contestant:8s} {row['ms']:8.3f} ms a step, the median of {len(row['rounds_ms'])} processes in turns "
              f"({', '.join(f'{ms:.3f}' for ms in row['rounds_ms'])})  (first loss {row['first_loss']:.6f})")
    rows["cortado"]["compile_s"] = _compile_seconds(script)
    print("cortado's model, compile and first call: {cold:.2f} s with an empty cache of compiled C, {cached:.2f} s "
          "with it filled".format(**rows["cortado"]["compile_s"]))
    if "torch" in rows:
        first = [r["first_loss"] for r in rows.values()]
        assert max(first) - min(first) < 1e-4 * abs(first[0]), rows
        print(f"torch's time over ours: {rows['torch']['ms'] / rows['cortado']['ms']:.2f}x")
    write_results({"benchmark": name, "machine": describe(), "torch": torch_version(), "repeats": args.repeats,
                   **results, "rows": rows}, args.out)
