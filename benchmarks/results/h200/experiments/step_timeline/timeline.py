"""The GPT large step's kernels as a replayed CUDA graph runs them (CUPTI, through torch.profiler): where the
device is idle, which kernels run beside which, and the kernels' times in the replay against alone.

    python3 timeline.py --dtype bfloat16 --out DIR      (run from the repository root, on the GPU machine)

A step is one graph launch; steps are taken one at a time with a pause between them, so the last step's kernels
are those after the last pause. Writes DIR/timeline_<dtype>.txt (the summary, then every kernel of the last step:
start and duration in us from the step's first kernel, its stream) and DIR/timeline_<dtype>.json.
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import cupy  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_float8_gpt_gpu import SIZES, program  # noqa: E402
from gpt import TEXT, windows  # noqa: E402

PAUSE_S = 0.005


def generated_names(step):
    """Each generated kernel's name (``ct_`` and its text's hash): what it computes, as words."""
    names = {}
    for term, made in step._executor.runners.items():
        for source in getattr(made, "sources", ()):
            try:
                names[source.name] = describe(term, getattr(made, "detail", ""))
            except Exception as error:  # a diagnostic: a term it cannot describe is named by its error
                names[source.name] = f"({error!r})"
        for operand, _, copy in getattr(made, "copies", ()):  # a library call's copies of operands it cannot read
            if copy.kernel is not None:
                names[copy.kernel.name] = (f"copy of {operand.shape} {operand.dtype.name} for {term.op.name} "
                                           f"{getattr(made, 'detail', '')} {term.shape}")
    return names


def describe(term, detail):
    """A fused term's results (shape, dtype) and the ops of its region, most frequent first."""
    outputs = getattr(term.attrs, "outputs", None) if hasattr(term, "attrs") else None
    if not outputs:
        return f"{term.op.name} {detail} {term.shape}"
    boundary, ops, seen = set(map(id, term.args)), collections.Counter(), set()
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if id(t) in boundary or id(t) in seen or not hasattr(t, "op"):
            continue
        seen.add(id(t))
        ops[t.op.name] += 1
        stack.extend(t.args)
    results = ", ".join(f"{o.shape} {o.dtype.name}" for o in outputs[:4]) + (" ..." if len(outputs) > 4 else "")
    return f"{detail} -> {results}; ops " + " ".join(f"{n}x{c}" for n, c in ops.most_common(8))


def kernels_of_trace(path):
    with open(path) as f:
        trace = json.load(f)
    found = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    return sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"]),
                    "stream": e.get("args", {}).get("stream", e.get("tid"))} for e in found), key=lambda k: k["ts"])


def last_step(kernels):
    """The kernels after the last pause of more than half ``PAUSE_S`` between one kernel's end and the next's start."""
    start, end = 0, kernels[0]["ts"] + kernels[0]["dur"]
    for i, k in enumerate(kernels[1:], 1):
        if k["ts"] - end > PAUSE_S * 1e6 / 2:
            start = i
        end = max(end, k["ts"] + k["dur"])
    return kernels[start:]


def union(intervals):
    total, current = 0.0, None
    for a, b in sorted(intervals):
        if current is None or a > current[1]:
            if current:
                total += current[1] - current[0]
            current = [a, b]
        else:
            current[1] = max(current[1], b)
    return total + (current[1] - current[0] if current else 0.0)


def kind(name):
    if name.startswith("ct_"):
        return "generated"
    if "nvjet" in name or "gemm" in name.lower() or "cublas" in name.lower() or "sm90_xmma" in name:
        return "products (cuBLASLt)"
    if "cudnn" in name.lower() or "fmha" in name.lower() or "sdpa" in name.lower() or "attention" in name.lower():
        return "attention (cuDNN)"
    if "Memset" in name or "Memcpy" in name:
        return "memset/memcpy"
    return "other: " + name[:40]


def idle_gaps(step_kernels):
    """``(gap us, the kernel starting after it)`` for each stretch in which no kernel runs."""
    gaps, end = [], None
    for k in step_kernels:
        if end is not None and k["ts"] > end:
            gaps.append((k["ts"] - end, k))
        end = k["ts"] + k["dur"] if end is None else max(end, k["ts"] + k["dur"])
    return gaps


def summary(step_kernels, alone_ms, names):
    t0 = step_kernels[0]["ts"]
    span = max(k["ts"] + k["dur"] for k in step_kernels) - t0
    busy = union([(k["ts"], k["ts"] + k["dur"]) for k in step_kernels])
    total = sum(k["dur"] for k in step_kernels)
    gaps = idle_gaps(step_kernels)
    small = sum(g for g, _ in gaps if g <= 3)
    kinds = collections.defaultdict(lambda: [0, 0.0])
    for k in step_kernels:
        kinds[kind(k["name"])][0] += 1
        kinds[kind(k["name"])][1] += k["dur"]
    streams = collections.Counter(k["stream"] for k in step_kernels)
    lines = [f"last step: {len(step_kernels)} kernels, {span / 1e3:.3f} ms from the first kernel's start to the last's "
             f"end (timed without the profiler, 50 steps back to back: {alone_ms:.3f} ms a step)",
             f"kernels' durations summed {total / 1e3:.3f} ms; device busy (some kernel running) {busy / 1e3:.3f} ms, "
             f"so {(total - busy) / 1e3:.3f} ms of kernels ran beside others",
             f"idle {(span - busy) / 1e3:.3f} ms in {len(gaps)} gaps: {small / 1e3:.3f} ms in gaps of 3 us or less, "
             f"{(span - busy - small) / 1e3:.3f} ms in {sum(g > 3 for g, _ in gaps)} longer ones",
             f"streams as reported: {dict(streams)}",
             "by kind: count, ms of kernels"]
    for name, (count, time_us) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {name:40s} {count:4d} {time_us / 1e3:8.3f}")
    lines.append("gaps by the kind of the kernel after them: count, ms")
    after = collections.defaultdict(lambda: [0, 0.0])
    for g, k in gaps:
        after[kind(k["name"])][0] += 1
        after[kind(k["name"])][1] += g
    for name, (count, time_us) in sorted(after.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {name:40s} {count:4d} {time_us / 1e3:8.3f}")
    lines.append("longest gaps (us, the kernel after):")
    lines += [f"  {g:8.1f}  {k['name'][:100]}" for g, k in sorted(gaps, key=lambda g: -g[0])[:15]]
    lines.append("generated kernels by time in the replay (ms, count, name: what it computes):")
    generated = collections.defaultdict(lambda: [0, 0.0])
    for k in step_kernels:
        if k["name"].startswith("ct_"):
            generated[k["name"]][0] += 1
            generated[k["name"]][1] += k["dur"]
    lines += [f"  {t / 1e3:7.3f} {c:4d} {n}: {names.get(n, '?')[:200]}"
              for n, (c, t) in sorted(generated.items(), key=lambda kv: -kv[1][1])]
    lines.append("kernels (start us, duration us, stream, name):")
    lines += [f"  {k['ts'] - t0:9.1f} {k['dur']:8.1f} {k['stream']!s:>4} {k['name'][:110]}" for k in step_kernels]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float8"])
    parser.add_argument("--size", default="large")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    text = open(TEXT, encoding="utf-8").read()
    alphabet = sorted(set(text))
    data = np.array([alphabet.index(c) for c in text], np.int32)
    step, _ = program(args.size, args.dtype, "cupy", data)
    shape = SIZES[args.size]
    x, y = windows(data, shape.batch, shape.context, np.random.default_rng(0))
    x, y = cupy.asarray(x), cupy.asarray(y)
    for _ in range(20):
        step(tokens_in=x, labels=y)
    stream = cupy.cuda.get_current_stream()
    start = stream.record()
    for _ in range(50):
        step(tokens_in=x, labels=y)
    end = stream.record()
    end.synchronize()
    alone_ms = cupy.cuda.get_elapsed_time(start, end) / 50
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(4):
            step(tokens_in=x, labels=y)
            cupy.cuda.runtime.deviceSynchronize()
            time.sleep(PAUSE_S)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        profile.export_chrome_trace(path)
        kernels = kernels_of_trace(path)
    step_kernels = last_step(kernels)
    names = generated_names(step)
    report = summary(step_kernels, alone_ms, names)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"timeline_{args.dtype}.txt"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(args.out, f"timeline_{args.dtype}.json"), "w") as f:
        json.dump({"alone_ms": alone_ms, "kernels": step_kernels, "names": names}, f)
    print("\n".join(report.splitlines()[:40]), flush=True)


if __name__ == "__main__":
    main()
