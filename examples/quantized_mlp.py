"""Quantize a trained MLP to int8: train it in float32, calibrate its activations' scales on a few batches,
quantize its weights per output channel, and run int8 inference as plain expressions; then fine-tune it
with ``fake_quantize``, whose straight-through gradients let the quantized model train.

    python examples/quantized_mlp.py [--epochs 60] [--seed 0] [--finetune 10] [--gpu-batch 4096]

Each int8 layer is ``cast(matmul(int32(qa), int32(qw)), float32) * (scale_a * scale_w) + b``: an exact
integer product of int8 activations and weights, rescaled once, the pattern the GPU lowering takes as
one int8 GEMM with its epilogue (the tanh and the next layer's quantize folded into it). Where a GPU is
visible, the int8 inference program is timed against the same model's float32 and bfloat16 programs
(wall time per call, the feed on the device; a model this small is bound by its launches, so the
figures show the overhead of each program more than the tensor cores: ``benchmarks/bench_int8_gpu.py``
times a 784-1024-1024-10 MLP).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from mlp_numpy import predict, spirals, training_step  # noqa: E402

SIZES = (2, 32, 32, 3)
BATCH = 60


def train(step, points, onehot, epochs, rng):
    """Run ``epochs`` of ``step`` over shuffled batches; the mean loss of each epoch."""
    history = []
    for _ in range(epochs):
        order = rng.permutation(len(points))
        losses = [float(step(x=points[rows], y=onehot[rows])[0])
                  for rows in (order[i:i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH))]
        history.append(float(np.mean(losses)))
    return history


def layer_inputs(points, weights):
    """The input of every layer of the float model on ``points``, as NumPy computes them."""
    inputs, h = [], points
    for k, (w, b) in enumerate(weights):
        inputs.append(h)
        h = h @ w + b
        if k < len(weights) - 1:
            h = np.tanh(h)
    return inputs


def int8_model(batch, weights, activation_scales, backend="numpy"):
    """The int8 inference program: per layer, activations quantized per tensor, weights per output channel."""
    x = ct.var("x", (batch, SIZES[0]))
    h = x
    for k, ((w, b), scale_a) in enumerate(zip(weights, activation_scales)):
        scale_w = np.abs(w).max(axis=0) / 127  # one scale per output column
        qw = np.clip(np.rint(w / scale_w), -127, 127).astype(np.int8)
        qa = ct.quantize(h, scale_a)
        product = ct.matmul(ct.cast(qa, "int32"), ct.cast(ct.const(qw), "int32"))  # exact
        h = ct.cast(product, "float32") * (scale_a * scale_w).astype(np.float32) + b
        if k < len(weights) - 1:
            h = ct.tanh(h)
    return ct.compile([h], inputs=[x], backend=backend)


def float_model(batch, weights, dtype):
    """The float inference program on the GPU, in ``dtype``."""
    x = ct.var("x", (batch, SIZES[0]), dtype)
    h = x
    for k, (w, b) in enumerate(weights):
        h = ct.matmul(h, ct.cast(ct.const(w), dtype)) + ct.cast(ct.const(b), dtype)
        if k < len(weights) - 1:
            h = ct.tanh(h)
    return ct.compile([h], inputs=[x], backend="cupy")


def us_per_call(program, feed, count=500):
    """Wall time per call of ``program`` over ``count`` calls back to back, the GPU drained before and after."""
    import cupy

    program(x=feed)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(count):
        program(x=feed)
    cupy.cuda.Device().synchronize()
    return 1e6 * (time.perf_counter() - start) / count


def gpu_speed(weights, activation_scales, batch, rng):
    """int8 inference against the float32 and bfloat16 programs on the GPU, or why it cannot run here."""
    from cortado.backends import gpu_visible

    if not gpu_visible():
        print("GPU speed: no NVIDIA GPU is visible (run it where one is)")
        return
    import cupy

    from cortado.exprgraph.dtypes import BFLOAT16

    points = cupy.asarray(rng.standard_normal((batch, SIZES[0])).astype(np.float32))
    programs = {"int8": (int8_model(batch, weights, activation_scales, "cupy"), points),
                "float32": (float_model(batch, weights, "float32"), points),
                "bfloat16": (float_model(batch, weights, "bfloat16"), points.astype(BFLOAT16))}
    times = {name: us_per_call(program, feed) for name, (program, feed) in programs.items()}
    print(f"GPU inference, batch {batch}, us per call: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    print("int8 program's products: " + "; ".join(
        runner.describe() for runner in programs["int8"][0]._executor.choices.values()))


def fake_quantized_step(weights, activation_scales, learning_rate):
    """A training step whose weights (per column) and activations (per tensor) pass through ``fake_quantize``."""
    x, y = ct.var("x", (BATCH, SIZES[0])), ct.var("y", (BATCH, SIZES[-1]))
    parameters, h = [], x
    for k, ((w, b), scale_a) in enumerate(zip(weights, activation_scales)):
        W, B = ct.var(f"W{k + 1}", w.shape), ct.var(f"b{k + 1}", b.shape)
        parameters += [W, B]
        scale_w = (np.abs(w).max(axis=0) / 127).astype(np.float32)
        h = ct.fake_quantize(h, scale_a) @ ct.fake_quantize(W, scale_w, axis=1) + B
        if k < len(weights) - 1:
            h = ct.tanh(h)
    loss = ct.mean(ct.logsumexp(h, axis=1) - ct.sum(h * y, axis=1))
    gradients = ct.grad(loss, parameters)
    state = {p: v for p, v in zip(parameters, (a for pair in weights for a in pair))}
    return ct.compile([loss], inputs=[x, y], state=state,
                      updates={p: p - learning_rate * g for p, g in zip(parameters, gradients)})


def trained(step):
    """A training step's weights and biases, layer by layer, as NumPy arrays."""
    return [(np.asarray(step.state[f"W{k}"]), np.asarray(step.state[f"b{k}"])) for k in range(1, len(SIZES))]


def int8_accuracy(points, labels, weights, activation_scales):
    return float(np.mean(np.argmax(int8_model(len(points), weights, activation_scales)(x=points)[0], axis=1) == labels))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--finetune", type=int, default=10, help="epochs of quantization-aware fine-tuning")
    parser.add_argument("--gpu-batch", type=int, default=4096, help="batch of the GPU speed comparison")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    points, labels = spirals(100, SIZES[-1], rng)
    onehot = np.eye(SIZES[-1], dtype=np.float32)[labels]

    step, _ = training_step(BATCH, SIZES, 0.5, rng)
    history = train(step, points, onehot, args.epochs, rng)
    print(f"float32 training: loss {history[0]:.4f} -> {history[-1]:.4f} over {args.epochs} epochs")
    weights = trained(step)

    calibration = points[rng.permutation(len(points))[:3 * BATCH]]  # three batches
    activation_scales = [np.float32(np.abs(h).max() / 127) for h in layer_inputs(calibration, weights)]
    print("activation scales from 3 calibration batches: " + ", ".join(f"{s:.5f}" for s in activation_scales))
    accuracy = float(np.mean(predict(points, step.state, SIZES) == labels))
    quantized = int8_accuracy(points, labels, weights, activation_scales)
    print(f"accuracy: float32 {accuracy:.1%}, int8 {quantized:.1%} ({100 * (quantized - accuracy):+.1f} points)")

    tuned = fake_quantized_step(weights, activation_scales, 0.1)
    history = train(tuned, points, onehot, args.finetune, rng)
    print(f"quantization-aware fine-tuning (fake_quantize, straight-through gradients): loss {history[0]:.4f} -> "
          f"{history[-1]:.4f} over {args.finetune} epochs")
    print(f"int8 accuracy after fine-tuning: {int8_accuracy(points, labels, trained(tuned), activation_scales):.1%}")
    gpu_speed(weights, activation_scales, args.gpu_batch, rng)


if __name__ == "__main__":
    main()
