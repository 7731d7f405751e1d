"""Train a small convolutional network on images it draws itself: conv2d, relu, pooling and a linear head,
its gradients by ``ct.grad`` (the data gradient of each convolution a plain convolution again), the whole
training step compiled by ``ct.compile``.

    python examples/cnn.py [--epochs 8] [--seed 0] [--backend numpy|cupy]

The images are 16x16, one channel, of four classes, each a stroke at a random place and with noise: a
horizontal bar, a vertical bar, a diagonal and a cross. No pixel says which: the network must find the
strokes' shapes wherever they are, which its 3x3 filters and pooling do. The loss falls from log(4);
training and held-out accuracy are printed at the end. ``--backend cupy`` runs the step on the GPU
(cuDNN's convolutions), where CuPy sees one; the default is the GPU where one is visible.
"""

import argparse

import numpy as np

import cortado as ct

SIDE, CLASSES, BATCH, LEARNING_RATE = 16, 4, 64, 0.05


def draw(label, rng):
    """One noisy image of class ``label``: a stroke of length 7 to 11 at a random place."""
    image = rng.normal(0.0, 0.3, (SIDE, SIDE))
    length = rng.integers(7, 12)
    row, col = rng.integers(0, SIDE - length + 1, 2)
    steps = np.arange(length)
    middle = length // 2
    if label in (0, 3):  # a horizontal bar, or a cross's
        image[row + middle, col + steps] += 1.0
    if label in (1, 3):  # a vertical bar, or a cross's
        image[row + steps, col + middle] += 1.0
    if label == 2:
        image[row + steps, col + steps] += 1.0
    return image


def images(count, rng):
    """``(x, labels)``: ``count`` images as ``(count, 1, SIDE, SIDE)`` float32, classes in turn."""
    labels = np.arange(count) % CLASSES
    return np.stack([draw(label, rng) for label in labels])[:, None].astype(np.float32), labels


def network(batch):
    """The model and its loss: ``(loss, logits, x, onehot, parameters)``."""
    x, onehot = ct.var("x", (batch, 1, SIDE, SIDE)), ct.var("onehot", (batch, CLASSES))
    w1, b1 = ct.var("w1", (8, 1, 3, 3)), ct.var("b1", (8,))
    w2, b2 = ct.var("w2", (16, 8, 3, 3)), ct.var("b2", (16,))
    head, bias = ct.var("head", (16, CLASSES)), ct.var("bias", (CLASSES,))
    h = ct.relu(ct.conv2d(x, w1, padding=1) + ct.reshape(b1, (-1, 1, 1)))  # 8 x 16 x 16
    h = ct.max_pool2d(h, 2)  # 8 x 8 x 8
    h = ct.relu(ct.conv2d(h, w2, padding=1) + ct.reshape(b2, (-1, 1, 1)))  # 16 x 8 x 8
    features = ct.max(h, axis=(2, 3))  # the strongest response of each filter, wherever it is
    logits = features @ head + bias
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * onehot, axis=1))
    return loss, logits, x, onehot, [w1, b1, w2, b2, head, bias]


def initial_values(parameters, rng):
    """He-normal weights and zero biases: a filter's fan-in is its input channels times its taps, the head's its
    rows."""
    fan_in = {4: lambda shape: int(np.prod(shape[1:])), 2: lambda shape: shape[0]}
    return {p: (rng.standard_normal(p.shape) * np.sqrt(2 / fan_in[p.ndim](p.shape))).astype(np.float32)
            if p.ndim in fan_in else np.zeros(p.shape, np.float32) for p in parameters}


def training_step(rng, backend):
    """The compiled step: one call returns the batch's loss and updates every parameter by SGD."""
    loss, _, x, onehot, parameters = network(BATCH)
    gradients = ct.grad(loss, parameters)
    return ct.compile([loss], inputs=[x, onehot], state=initial_values(parameters, rng),
                      updates={p: p - LEARNING_RATE * g for p, g in zip(parameters, gradients)}, backend=backend)


def accuracy(step, x, labels):
    """The trained model's accuracy on ``x``: the same expressions at another batch size, on the CPU."""
    _, logits, xv, _, parameters = network(len(x))
    predict = ct.compile([logits], inputs=[xv, *parameters])
    state = {p.name: np.asarray(step.state[p.name].get() if hasattr(step.state[p.name], "get") else step.state[p.name])
             for p in parameters}  # a GPU program's state is CuPy arrays
    (scores,) = predict(x=x, **state)
    return float(np.mean(np.argmax(scores, axis=1) == labels))


def train(epochs=8, seed=0, backend=None, log=print):
    """Train on 2048 drawn images, test on 512 others; return ``(losses per epoch, train accuracy, test accuracy)``."""
    from cortado.backends import gpu_visible

    backend = backend or ("cupy" if gpu_visible() else "numpy")
    rng = np.random.default_rng(seed)
    x, labels = images(2048, rng)
    x_test, labels_test = images(512, rng)
    onehot = np.eye(CLASSES, dtype=np.float32)[labels]
    step = training_step(rng, backend)
    log(f"a CNN on {SIDE}x{SIDE} images of {CLASSES} strokes, its step compiled for {backend}: "
        f"{len(step.kernels)} kernels, {step.memory.summary()}")
    history = []
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(x))
        losses = [float(step(x=x[rows], onehot=onehot[rows])[0])
                  for rows in (order[i:i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH))]
        history.append(float(np.mean(losses)))
        log(f"epoch {epoch:3}  loss {history[-1]:.4f}")
    trained, tested = accuracy(step, x, labels), accuracy(step, x_test, labels_test)
    log(f"training accuracy: {trained:.1%}  held-out accuracy: {tested:.1%} "
        f"(a guess: {1 / CLASSES:.0%}, loss log({CLASSES}) = {np.log(CLASSES):.4f})")
    return history, trained, tested


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["numpy", "cupy"], help="default: cupy where a GPU is visible")
    args = parser.parse_args(argv)
    train(epochs=args.epochs, seed=args.seed, backend=args.backend)


if __name__ == "__main__":
    main()
