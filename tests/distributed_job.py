"""One rank of tests/test_gpu_distributed.py's data-parallel job, started by ``python -m cortado.launch``:

    python -m cortado.launch --gpus 2 tests/distributed_job.py OUT (mlp|cnn) GLOBAL_BATCH

Each rank trains ``STEPS`` SGD steps of the model on its shard of each global batch, with small buckets (several
all-reduces, overlapping the backward pass; the MLP's first weight gradient, made last, in two blocks of rows; the
first step eager, the second captured, then graph replays), and
saves its losses and final state to ``OUT/rank{r}.npz``. ``model`` and ``batches`` build the same model and
batches for the one-GPU step the test compares with.
"""

import sys

import numpy as np

import cortado as ct

STEPS, LEARNING_RATE = 4, 0.05
CAPS = {"bucket_bytes": 16 << 10, "first_bucket_bytes": 2 << 10}


def model(kind, batch):
    """``(loss, inputs, parameters)``: a relu MLP, or a small CNN (two 3x3 convolutions, the second of stride 2,
    global average pooling, a linear classifier), softmax cross-entropy averaged over the batch."""
    if kind == "mlp":
        x, y = ct.var("x", (batch, 256)), ct.var("y", (batch, 10))
        shapes = {"W1": (256, 96), "b1": (96,), "W2": (96, 64), "b2": (64,), "W3": (64, 10), "b3": (10,)}
        p = {name: ct.var(name, shape) for name, shape in shapes.items()}
        logits = ct.relu(ct.relu(x @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]) @ p["W3"] + p["b3"]
    else:
        x, y = ct.var("x", (batch, 3, 16, 16)), ct.var("y", (batch, 10))
        shapes = {"c1": (16, 3, 3, 3), "d1": (16,), "c2": (32, 16, 3, 3), "d2": (32,), "W": (32, 10), "b": (10,)}
        p = {name: ct.var(name, shape) for name, shape in shapes.items()}
        h = ct.relu(ct.conv2d(x, p["c1"], padding=1) + ct.reshape(p["d1"], (-1, 1, 1)))
        h = ct.relu(ct.conv2d(h, p["c2"], stride=2, padding=1) + ct.reshape(p["d2"], (-1, 1, 1)))
        logits = ct.mean(h, axis=(2, 3)) @ p["W"] + p["b"]
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * y, axis=1))
    return loss, [x, y], list(p.values())


def initial(params):
    rng = np.random.default_rng(0)
    return {v: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for v in params}


def batches(inputs, global_batch):
    """``STEPS`` global batches, as ``(x, y)`` NumPy arrays."""
    rng = np.random.default_rng(1)
    x, y = inputs
    return [(rng.standard_normal((global_batch,) + x.shape[1:]).astype(np.float32),
             np.eye(y.shape[1], dtype=np.float32)[rng.integers(0, y.shape[1], global_batch)]) for _ in range(STEPS)]


def program(kind, batch, global_batch, **options):
    loss, inputs, params = model(kind, batch)
    grads = ct.grad(loss, params)
    step = ct.compile(loss, inputs=inputs, state=initial(params),
                      updates={v: v - LEARNING_RATE * g for v, g in zip(params, grads)}, backend="cupy",
                      autotune=False, **options)
    return step, batches(model(kind, global_batch)[1], global_batch), params


def main(out, kind, global_batch):
    import cupy

    world = ct.distributed.init()
    shard = global_batch // world.size
    step, data, params = program(kind, shard, global_batch, data_parallel=CAPS)
    rows = slice(world.rank * shard, (world.rank + 1) * shard)
    losses = [float(step(x=cupy.asarray(x[rows]), y=cupy.asarray(y[rows]))) for x, y in data]
    np.savez(f"{out}/rank{world.rank}.npz", losses=np.array(losses), buckets=len(step.buckets),
             **{v.name: cupy.asnumpy(step.state[v.name]) for v in params})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
