"""Where torch.compile's GPT training step spends its time on the GPU, kernel by kernel: the peer's side of
``profile_gpu.py --models gpt``, to set each of our kernels' classes against the peer's.

    python benchmarks/profile_peer_gpt.py [--sizes small,large] [--mode default] [--steps 5]
                                          [--out results/profile_peer_gpt.txt]

bench_gpt_gpu.py's torch model and AdamW, compiled as its torch.compile contestants compile them (``--mode``:
"default" runs the compiled graphs' kernels one by one, the same kernels "reduce-overhead" replays as a CUDA
graph), profiled over ``--steps`` steps after ten warm-up steps by ``torch.profiler``. Printed per step: the
kernels launched, their summed time, the time of each class (matrix products, attention, generated Triton
kernels, the rest) and the kernels that take the most.
"""

import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_gpt_gpu import torch_step, workload  # noqa: E402

CLASSES = (("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")), ("attention", ("flash", "fmha", "attention")),
           ("triton", ("triton",)))


def kernel_class(name):
    """Which class a kernel's name puts it in: ``CLASSES``' first whose words it holds, else "other"."""
    lowered = name.lower()
    return next((label for label, words in CLASSES if any(w in lowered for w in words)), "other")


def profiled(size, mode, steps):
    """The report of ``steps`` profiled steps of the compiled model on ``size``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step, _, _ = torch_step(workload(size), "cuda", mode)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset"))]
    per_name = collections.defaultdict(lambda: [0, 0.0])
    per_class = collections.Counter()
    for e in kernels:
        per_name[e.name][0] += 1
        per_name[e.name][1] += e.device_time / 1e3 / steps  # ms a step
        per_class[kernel_class(e.name)] += e.device_time / 1e3 / steps
    total = sum(per_class.values())
    lines = [f"gpt {size} torch.compile mode {mode!r}: {len(kernels) / steps:.0f} kernels, {total:.3f} ms a step "
             "(kernels timed in the step, one after another)",
             "  " + ", ".join(f"{label} {ms:.3f} ms" for label, ms in per_class.most_common())]
    for name, (count, ms) in sorted(per_name.items(), key=lambda item: -item[1][1])[:40]:
        lines.append(f"  {ms:8.3f} ms {100 * ms / total:5.1f}%  x{count // steps:<3d} {kernel_class(name):9s} {name[:110]}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--mode", default="default")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "profile_peer_gpt.txt"))
    args = parser.parse_args()
    with open(args.out, "w") as out:
        for size in args.sizes.split(","):
            report = profiled(size, args.mode, args.steps)
            print(report, flush=True)
            out.write(report + "\n\n")
            out.flush()


if __name__ == "__main__":
    main()
