"""Data-parallel training steps on several GPUs: cortado against PyTorch DistributedDataParallel, weak scaling.

    python benchmarks/bench_data_parallel_gpu.py [--gpus 1,2] [--models mlp,cnn] [--out benchmarks/results/data_parallel_gpu.json]

Weak scaling: each GPU keeps its batch, so N GPUs step through N times the samples. Two models: the large MLP
of bench_mlp_gpu.py (8192-8192-8192-8192, three 8192x8192 layers, bfloat16, batch 8192 a GPU, 403 MB of
gradients a step) and the ResNet-style CNN of bench_cnn_gpu.py (float32, batch 128 a GPU, 4.7 MB of gradients),
softmax cross-entropy and plain SGD. For each model, contestant and world size, one job of that many processes
(``cortado.launch``, one GPU each) runs in turn, never two at once:

- cortado: ``ct.compile(..., backend="cupy", data_parallel=parallel)``, DDP's bucket caps (1 MiB, then 25 MiB), each
  bucket's NCCL all-reduce on a second stream as soon as its gradients exist, the whole step one CUDA graph;
- torch DDP: ``DistributedDataParallel`` over the NCCL backend with its default bucketing (25 MB), eager
  forward and backward, SGD by hand (``p -= lr * p.grad``).

On one GPU each contestant runs its plain step (no all-reduce, no DDP wrapper): the baseline of scaling is the
step a user would run there. Every rank times ``repeats`` steps back to back between two CUDA events after
``warmup`` steps; a job's step time is its slowest rank's. Throughput is samples a second over all GPUs; scaling
efficiency is throughput on N GPUs over N times the contestant's own throughput on one GPU. Needs CuPy, torch
with CUDA, and as many GPUs as the largest world size; world sizes above the machine's GPU count are skipped and
said so.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import log, require_gpu, versions  # noqa: E402
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

MODELS = {  # dtype, batch a GPU, warm-up steps, timed steps
    "mlp": ("bfloat16", 8192, 3, 20),
    "cnn": ("float32", 128, 10, 50),
}
MLP_SIZES, MLP_LEARNING_RATE = (8192, 8192, 8192, 8192), 0.05
CONTESTANTS = ("cortado", "torch DDP")


# -- one rank -----------------------------------------------------------------------------------


def workload(model, dtype, batch):
    """``(values by name, x, y)`` in float32, seeded, the same on every rank (each rank its own batch)."""
    rank = int(os.environ.get("RANK", 0))
    if model == "mlp":
        from mlp_gpu import initial_values

        values = initial_values(MLP_SIZES, np.random.default_rng(0))
        rng = np.random.default_rng(1 + rank)
        x = rng.standard_normal((batch, MLP_SIZES[0]), dtype=np.float32)
        y = np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], batch)]
        return values, x, y
    from bench_cnn_gpu import cnn_workload

    work = cnn_workload(dtype, batch=batch)
    rng = np.random.default_rng(1 + rank)
    return work.values, rng.standard_normal(work.x.shape, dtype=np.float32), work.y


def cortado_step(model, dtype, values, x, y):
    """Our data-parallel step over this rank's batch on the GPU; a call returns the loss."""
    import cupy

    parallel = ct.distributed.init().size > 1
    if model == "mlp":
        from mlp_gpu import mlp

        loss, xv, yv, params = mlp(x.shape[0], MLP_SIZES, dtype)
        lr = MLP_LEARNING_RATE
    else:
        from bench_cnn_gpu import LEARNING_RATE, cortado_cnn

        loss, xv, yv, params = cortado_cnn(x.shape[0], x.shape[-1], dtype)
        lr = LEARNING_RATE
    grads = ct.grad(loss, params)
    step = ct.compile(loss, inputs=[xv, yv], state={p: values[p.name].astype(p.dtype) for p in params},
                      updates={p: p - lr * g for p, g in zip(params, grads)}, backend="cupy", data_parallel=parallel)
    x, y = cupy.asarray(x.astype(xv.dtype)), cupy.asarray(y.astype(yv.dtype))
    explained = step.explain()
    buckets = [line.strip() for line in explained[explained.find("data parallel:"):].splitlines()[1:]
               if line.strip().startswith("bucket")]
    return (lambda: step(x=x, y=y)), buckets


def ddp_step(model, dtype, values, x, y):
    """PyTorch DDP's step over this rank's batch; a call returns the loss."""
    import torch
    import torch.distributed as dist

    local, parallel = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)) > 1
    torch.cuda.set_device(local)
    if parallel and not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    if model == "mlp":
        from mlp_gpu import torch_loss as loss_of

        lr = MLP_LEARNING_RATE
    else:
        from bench_cnn_gpu import LEARNING_RATE as lr
        from bench_cnn_gpu import torch_cnn_loss as loss_of
    torch_dtype = getattr(torch, dtype)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = list(values)  # in the order the model uses them
            self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(v, dtype=torch_dtype, device="cuda"))
                                                  for v in values.values()])

        def forward(self, x, y):
            return loss_of(list(self.params) if model == "mlp" else dict(zip(self.names, self.params)), x, y)

    net = torch.nn.parallel.DistributedDataParallel(Model(), device_ids=[local]) if parallel else Model()
    xt = torch.tensor(x, dtype=torch_dtype, device="cuda")
    yt = torch.tensor(y, dtype=torch_dtype, device="cuda")

    def step():
        loss = net(xt, yt)
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
                p.grad = None
        return loss.detach()

    return step, []


def worker(contestant, model, path):
    """One rank's run: warm up, time ``repeats`` steps, write ``{ms, loss, buckets}`` to ``path``."""
    dtype, batch, warmup, repeats = MODELS[model]
    values, x, y = workload(model, dtype, batch)
    build = cortado_step if contestant == "cortado" else ddp_step
    step, buckets = build(model, dtype, values, x, y)
    import cupy

    if contestant == "cortado":
        start, end, elapsed, synchronize = cupy.cuda.Event(), cupy.cuda.Event(), cupy.cuda.get_elapsed_time, \
            cupy.cuda.Device().synchronize
    else:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        elapsed, synchronize = (lambda a, b: a.elapsed_time(b)), torch.cuda.synchronize
    for _ in range(warmup):
        loss = step()
    synchronize()
    start.record()
    for _ in range(repeats):
        loss = step()
    end.record()
    synchronize()
    with open(path, "w") as f:
        json.dump({"ms": elapsed(start, end) / repeats, "loss": float(loss), "buckets": buckets}, f)
    if contestant != "cortado":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# -- the jobs ----------------------------------------------------------------------------------------


def job(contestant, model, gpus):
    """Run one job of ``gpus`` ranks; ``{ms (slowest rank), samples_per_s, losses}`` or ``{error}``."""
    from cortado.launch import launch

    dtype, batch, _, _ = MODELS[model]
    for attempt in range(2):  # a second try: the launcher's free port can be taken before rank 0 listens on it
        with tempfile.TemporaryDirectory() as folder:
            log(f"{model} {contestant} on {gpus} GPU(s) ..." if attempt == 0 else "  failed; once more")
            status = launch(gpus, [sys.executable, os.path.abspath(__file__), "--worker", contestant, model, folder])
            ranks = []
            for r in range(gpus):
                try:
                    with open(os.path.join(folder, f"rank{r}.json")) as f:
                        ranks.append(json.load(f))
                except OSError:
                    pass
        if status == 0 and len(ranks) == gpus:
            break
    if status != 0 or len(ranks) != gpus:
        log(f"{model} {contestant} on {gpus} GPU(s): FAILED (exit status {status})")
        return {"error": f"the job exited with status {status}, {len(ranks)} of {gpus} ranks reported"}
    ms = max(r["ms"] for r in ranks)
    result = {"ms": ms, "samples_per_s": gpus * batch / ms * 1e3, "rank_ms": [r["ms"] for r in ranks],
              "losses": [r["loss"] for r in ranks], "buckets": ranks[0]["buckets"]}
    for line in result["buckets"]:
        log(f"  {line}")
    log(f"{model} {contestant} on {gpus} GPU(s): {ms:.3f} ms a step, {result['samples_per_s']:.0f} samples/s")
    return result


def summarise(results, gpus):
    """Scaling efficiency against each contestant's one-GPU throughput, and ours over DDP's, per model and size."""
    for by_contestant in results.values():
        for by_size in by_contestant.values():
            base = by_size.get("1", {}).get("samples_per_s")
            for n, r in by_size.items():
                if base and "samples_per_s" in r:
                    r["scaling_efficiency"] = r["samples_per_s"] / (int(n) * base)
        for n in map(str, gpus):
            ours, theirs = by_contestant["cortado"].get(n, {}), by_contestant["torch DDP"].get(n, {})
            if "samples_per_s" in ours and "samples_per_s" in theirs:
                ours["over_ddp"] = ours["samples_per_s"] / theirs["samples_per_s"]


def print_table(results):
    print(f"\n{'model':>6} {'contestant':>10} {'GPUs':>5} {'ms/step':>9} {'samples/s':>11} {'efficiency':>11} {'/DDP':>6}")
    for model, by_contestant in results.items():
        for contestant, by_size in by_contestant.items():
            for n, r in by_size.items():
                if "error" in r:
                    print(f"{model:>6} {contestant:>10} {n:>5}   {r['error'][:60]}")
                    continue
                efficiency = f"{r['scaling_efficiency']:.3f}" if "scaling_efficiency" in r else "-"
                over = f"{r['over_ddp']:.3f}" if "over_ddp" in r else "-"
                print(f"{model:>6} {contestant:>10} {n:>5} {r['ms']:9.3f} {r['samples_per_s']:11.0f} {efficiency:>11} "
                      f"{over:>6}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1,2", help="world sizes, comma-separated")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "data_parallel_gpu.json"))
    parser.add_argument("--worker", nargs=3, metavar=("CONTESTANT", "MODEL", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        contestant, model, folder = args.worker
        worker(contestant, model, os.path.join(folder, f"rank{os.environ.get('RANK', 0)}.json"))
        return
    cupy, name = require_gpu()
    available = cupy.cuda.runtime.getDeviceCount()
    sizes = [int(n) for n in args.gpus.split(",")]
    skipped = [n for n in sizes if n > available]
    if skipped:
        log(f"skipping world sizes {skipped}: this machine has {available} GPU(s)")
    sizes = [n for n in sizes if n <= available]
    results = {model: {c: {str(n): job(c, model, n) for n in sizes} for c in CONTESTANTS}
               for model in args.models.split(",")}
    summarise(results, sizes)
    print_table(results)
    write_results({"benchmark": "data-parallel training steps, weak scaling", "machine": describe(), "gpu": name,
                   "gpus_available": available, "skipped_world_sizes": skipped,
                   "models": {m: dict(zip(("dtype", "batch_per_gpu", "warmup", "repeats"), MODELS[m])) for m in MODELS},
                   "results": results, "versions": versions("torch")}, args.out)


if __name__ == "__main__":
    main()
