"""Train examples/mlp_gpu.py's MLP on several GPUs, data parallel: one process a GPU, each on its shard of every batch.

    python -m cortado.launch --gpus 2 examples/data_parallel.py        # two GPUs (torchrun works too)
    python examples/data_parallel.py --backend numpy                   # one process on the CPU: a world of one

What changes from a one-GPU script is two lines: ``ct.distributed.init()`` first, and ``data_parallel=True`` in
``ct.compile``; then each rank feeds its own rows of each batch. The program averages every gradient over the
ranks (NCCL all-reduces in buckets, beside the rest of the backward pass, inside the step's CUDA graph), so every
rank holds the same parameters after every step, and the step is the one-GPU step on the whole batch.
"""

import argparse

import numpy as np
from mlp_gpu import BATCH, LEARNING_RATE, SIZES, initial_values, mlp

import cortado as ct


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--backend", default="cupy", help="cupy (a GPU a rank) or numpy (a world of one)")
    args = parser.parse_args(argv)
    if args.backend == "cupy":
        import cupy

        to_device, to_host = cupy.asarray, cupy.asnumpy
    else:
        to_device = to_host = np.asarray
    world = ct.distributed.init()  # 1. join the job: this process's rank and GPU
    shard = BATCH // world.size  # every rank its own rows of each batch of BATCH
    loss, x, y, parameters = mlp(shard, SIZES)
    gradients = ct.grad(loss, parameters)
    rng = np.random.default_rng(0)  # the same weights and data on every rank
    values = initial_values(SIZES, rng)
    step = ct.compile(loss, inputs=[x, y], state={p: values[p.name] for p in parameters},
                      updates={p: p - LEARNING_RATE * g for p, g in zip(parameters, gradients)},
                      backend=args.backend, data_parallel=True)  # 2. average the gradients over the ranks
    points = rng.standard_normal((40 * BATCH, SIZES[0]), dtype=np.float32)
    labels = np.argmax(points @ rng.standard_normal((SIZES[0], SIZES[-1])), axis=1)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]
    rows = np.arange(world.rank * shard, (world.rank + 1) * shard)
    batches = [(to_device(points[i + rows]), to_device(onehot[i + rows])) for i in range(0, len(points), BATCH)]
    if world.rank == 0:
        print(f"rank 0 of {world.size}, {shard} rows a step each, {len(step.buckets)} all-reduce bucket(s); "
              f"a model that knows nothing has loss {np.log(10):.4f}")
    for i in range(1, args.steps + 1):
        xb, yb = batches[i % len(batches)]
        value = float(step(x=xb, y=yb))
        if world.rank == 0 and (i % max(args.steps // 6, 1) == 0 or i == 1):
            print(f"step {i:4d}  loss on rank 0's rows {value:.4f}")
    if world.rank == 0:
        host = {p.name: to_host(step.state[p.name]) for p in parameters}
        h = points
        for k in range(1, len(SIZES)):
            h = h @ host[f"W{k}"] + host[f"b{k}"]
            h = np.maximum(h, 0) if k < len(SIZES) - 1 else h
        print(f"training accuracy: {100 * np.mean(np.argmax(h, axis=1) == labels):.1f}%")


if __name__ == "__main__":
    main()
