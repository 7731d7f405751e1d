"""Where a GPU training step's time goes: ``Program.profile`` of the MLP and CNN benchmarks' steps, kernel by kernel.

    python benchmarks/profile_gpu.py [--models mlp,cnn,gpt] [--dtypes float32,bfloat16] [--options nhwc=True]
                                     [--out results/profile_gpu.txt]

mlp: bench_mlp_gpu.py's small and large steps; cnn: bench_cnn_gpu.py's ResNet-style step; gpt:
bench_gpt_gpu.py's small and large training steps (computing in bfloat16 whatever ``--dtypes`` says). ``--options``
are backend options (``name=value``, comma-separated) given to every program. Each kernel is timed alone
between device events (no CUDA graph), so the sum is more than a replayed step takes: it says which
kernels to work on, not how fast the step is. The explanation of each program (its rules, kernels, the
library calls chosen and the memory plan) follows its table.
"""

import argparse
import math
import os
import sys

import cupy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cortado as ct  # noqa: E402
from bench_cnn_gpu import backend_options, cnn_workload, cortado_cnn_step  # noqa: E402
from bench_gpt_gpu import cortado_graph, workload as gpt_workload  # noqa: E402
from bench_mlp_gpu import CASES, workload  # noqa: E402
from mlp_gpu import compiled_step  # noqa: E402


def mlp_steps(dtype, options):
    for size in ("small", "large"):
        work = workload(size, dtype)
        step = compiled_step(work.values, work.batch, work.sizes, dtype, **options)
        yield f"mlp {size} {dtype} ({'-'.join(map(str, CASES[size][0]))}, batch {work.batch})", step, _xy(step, work)


def cnn_steps(dtype, options):
    work = cnn_workload(dtype)
    step = cortado_cnn_step(work, "cupy", **options)
    yield f"cnn {dtype} (batch {work.x.shape[0]})", step, _xy(step, work)


def gpt_steps(dtype, options):
    if dtype != "bfloat16":
        return
    for size in ("small", "large"):
        work = gpt_workload(size)
        loss, tokens, labels, state, updates = cortado_graph(work)
        step = ct.compile(loss, inputs=[tokens, labels], state=state, updates=updates, backend="cupy", **options)
        yield f"gpt {size} bfloat16 (batch {work.batch})", step, {
            "tokens_in": cupy.asarray(work.tokens), "labels": cupy.asarray(work.labels)}


def _xy(step, work):
    """The feeds of an MLP or CNN step, in the dtype of its parameters."""
    stored = next(iter(step.state.values())).dtype
    return {"x": cupy.asarray(work.x.astype(stored)), "y": cupy.asarray(work.y.astype(stored))}


MODELS = {"mlp": mlp_steps, "cnn": cnn_steps, "gpt": gpt_steps}


def kernel_lines(step):
    """A line for each generated kernel of compiled GPU ``step``, named as ncu names it, with its shape and the
    bytes it reads and writes: what names ncu's rows (``KERNEL name shape dtype read .. MB write .. MB outputs``)."""
    def nbytes(t):
        return math.prod(t.shape) * t.dtype.itemsize

    lines = []
    for term, made in step._executor.runners.items():
        for source in getattr(made, "sources", []) or []:
            outs = term.attrs.outputs if term.op.name == "fused" else (term,)
            read = sum(nbytes(a) for a in dict.fromkeys(term.args))
            written = sum(nbytes(o) for o in outs)
            lines.append(f"KERNEL {source.name} {term.shape} {term.dtype.name} read {read / 1e6:.1f} MB write "
                         f"{written / 1e6:.1f} MB " + " ".join(f"{o.shape}{o.dtype.name}" for o in outs)[:120])
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--options", default="", help="backend options, e.g. nhwc=True")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "profile_gpu.txt"))
    args = parser.parse_args()
    options = backend_options(args.options)
    reports = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for title, step, feeds in MODELS[model](dtype, options):
                for _ in range(3):
                    step(**feeds)
                report = (f"{title}, options {options}; {step.device_bytes / 2**20:.1f} MiB on the device: "
                          + step.profile(**feeds) + "\n\n" + step.explain(examples=0))
                print(report, flush=True)
                reports.append(report)
                del step
    with open(args.out, "w") as out:
        out.write("\n\n".join(reports) + "\n")


if __name__ == "__main__":
    main()
