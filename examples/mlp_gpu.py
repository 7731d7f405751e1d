"""Train a small MLP classifier on the GPU with cortado, then time its training step against PyTorch's.

    python examples/mlp_gpu.py [--steps 300] [--seed 0]

A relu MLP 784-1024-1024-10 with softmax cross-entropy, batch 128, float32: its whole training step
(forward, backward, SGD on every weight and bias) compiled by ``ct.compile(..., backend="cupy",
cuda_graph=True)`` into one program that keeps the weights on the GPU. The task is synthetic (a point's
class is the largest of ten fixed random projections of it), so the loss visibly falls from about
log(10). Then 200 steps are timed against PyTorch eager, where torch with CUDA is installed. Needs
CuPy and an NVIDIA GPU.
"""

import argparse
import time

import numpy as np

import cortado as ct

SIZES, BATCH, LEARNING_RATE = (784, 1024, 1024, 10), 128, 0.05


def mlp(batch, sizes, dtype="float32"):
    """A relu MLP with layer ``sizes`` and its softmax cross-entropy: ``(loss, x, y, parameters)``."""
    x, y = ct.var("x", (batch, sizes[0]), dtype), ct.var("y", (batch, sizes[-1]), dtype)  # y: one-hot labels
    parameters, h = [], x
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:]), start=1):
        W, b = ct.var(f"W{i}", (fan_in, fan_out), dtype), ct.var(f"b{i}", (fan_out,), dtype)
        parameters += [W, b]
        h = h @ W + b
        h = ct.relu(h) if i < len(sizes) - 1 else h
    return ct.mean(ct.logsumexp(h, axis=1) - ct.sum(h * y, axis=1)), x, y, parameters


def initial_values(sizes, rng):
    """Glorot-normal weights and zero biases in float32, by name in layer order (W1, b1, W2, ...)."""
    values = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:]), start=1):
        values[f"W{i}"] = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.float32(np.sqrt(2 / (fan_in + fan_out)))
        values[f"b{i}"] = np.zeros(fan_out, np.float32)
    return values


def compiled_step(values, batch=BATCH, sizes=SIZES, dtype="float32", **options):
    """The whole training step as one cortado program on the GPU; a call returns the loss.
    ``options`` go to ``ct.compile`` (``autotune=False``, say)."""
    loss, x, y, parameters = mlp(batch, sizes, dtype)
    gradients = ct.grad(loss, parameters)
    return ct.compile(loss, inputs=[x, y], state={p: values[p.name].astype(p.dtype) for p in parameters},
                      updates={p: p - LEARNING_RATE * g for p, g in zip(parameters, gradients)},
                      backend="cupy", cuda_graph=True, **options)


def torch_loss(params, x, y):
    """The same model and loss in PyTorch, in tensor methods only (so torch.compile traces it as it is)."""
    h = x
    for W, b in zip(params[0:-2:2], params[1:-2:2]):
        h = (h @ W + b).relu()
    logits = h @ params[-2] + params[-1]
    return (logits.logsumexp(dim=1) - (logits * y).sum(dim=1)).mean()


def torch_step(values, dtype="float32"):
    """The same step in PyTorch eager on the GPU: forward, ``loss.backward()``, then SGD by hand."""
    import torch

    params = [torch.tensor(v, dtype=getattr(torch, dtype), device="cuda", requires_grad=True) for v in values.values()]

    def step(x, y):
        loss = torch_loss(params, x, y)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= LEARNING_RATE * p.grad
                p.grad = None
        return loss.detach()

    return step


def ms_per_step(run, synchronize, count=200):
    """Wall time per step over ``count`` steps run back to back, the GPU drained before and after."""
    run()
    synchronize()
    start = time.perf_counter()
    for _ in range(count):
        run()
    synchronize()
    return 1e3 * (time.perf_counter() - start) / count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps before the timing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()  # raises where there is no driver or no device
    except Exception as error:  # no CuPy, no driver or no device: say which, in one line
        raise SystemExit(f"mlp_gpu: needs CuPy and an NVIDIA GPU ({type(error).__name__}: {error})") from None
    rng = np.random.default_rng(args.seed)
    values = initial_values(SIZES, rng)
    points = rng.standard_normal((40 * BATCH, SIZES[0]), dtype=np.float32)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[np.argmax(points @ rng.standard_normal((SIZES[0], SIZES[-1])), axis=1)]
    batches = [(cupy.asarray(points[i:i + BATCH]), cupy.asarray(onehot[i:i + BATCH])) for i in range(0, len(points), BATCH)]
    step = compiled_step(values)
    print(f"compiled: {step.device_bytes / 2**20:.1f} MiB on the GPU; a model that knows nothing has loss {np.log(10):.4f}")
    for i in range(1, args.steps + 1):
        x, y = batches[i % len(batches)]
        loss = step(x=x, y=y)  # the program's own buffer, overwritten by the next call: read it now
        if i == 1 or i % 50 == 0:
            print(f"step {i:4}  loss {float(loss):.4f}")
    timings = {"cortado": ms_per_step(lambda: step(x=x, y=y), cupy.cuda.Device().synchronize)}
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no GPU")
    except Exception as error:
        print(f"no PyTorch with CUDA ({type(error).__name__}: {error}): timing ours alone")
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls in float32, as ours
        torch_eager, xt, yt = torch_step(values), torch.from_dlpack(x), torch.from_dlpack(y)
        timings["torch eager"] = ms_per_step(lambda: torch_eager(xt, yt), torch.cuda.synchronize)
    print(f"\n{'200 steps':12} {'ms/step':>9} {'steps/s':>9} {'cortado speed-up':>17}")
    for name, ms in timings.items():
        print(f"{name:12} {ms:9.3f} {1e3 / ms:9.0f} {ms / timings['cortado']:16.2f}x")


if __name__ == "__main__":
    main()
