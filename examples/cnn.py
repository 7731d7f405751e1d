"""Train a small convolutional network on images it draws itself, built from ``cortado.nn``: convolutions, batch
norms, relu, pooling and a linear head, its gradients by ``ct.grad`` (the data gradient of each convolution a plain
convolution again), the whole training step (SGD with momentum and the batch norms' running statistics included)
compiled by ``ct.compile``.

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
from cortado import nn, optim

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


class CNN(nn.Module):
    """Two 3x3 convolutions, each batch-normalised and rectified, pooling between them, the strongest response of
    each filter wherever it is, and a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm(8)
        self.conv2, self.norm2 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm(16)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x):
        h = ct.max_pool2d(ct.relu(self.norm1(self.conv1(x))), 2)  # 8 x 8 x 8
        h = ct.relu(self.norm2(self.conv2(h)))  # 16 x 8 x 8
        return self.head(ct.max(h, axis=(2, 3)))


def training_step(model, seed, backend):
    """The compiled step: one call returns the batch's loss, updates every parameter by SGD with momentum and the
    batch norms' running statistics."""
    x, labels = ct.var("x", (BATCH, 1, SIDE, SIDE)), ct.var("labels", (BATCH,), "int32")
    loss = nn.cross_entropy(model(x), labels)
    params = model.parameters()
    sgd = optim.SGD(LEARNING_RATE, momentum=0.9)
    state, updates = sgd.updates(params, ct.grad(loss, list(params.values())))
    return ct.compile([loss], inputs=[x, labels], state={**model.initial_values(seed), **state},
                      updates={**updates, **model.state_updates(loss)}, backend=backend)


def accuracy(model, step, x, labels):
    """The trained model's accuracy on ``x``, in inference (the batch norms' running statistics), at another batch
    size, on the CPU: a program of its own, given the step's trained values by name (docs/training.md)."""
    xv = ct.var("x", x.shape)
    model.eval()
    predict = ct.compile([model(xv)], inputs=[xv], state=model.initial_values())
    model.train()
    ct.load_state_dict(predict, step.state, strict=False)  # a GPU step's CuPy arrays too
    (scores,) = predict(x=x)
    return float(np.mean(np.argmax(scores, axis=1) == labels))


def train(epochs=8, seed=0, backend=None, log=print):
    """Train on 2048 drawn images, test on 512 others; return ``(losses per epoch, train accuracy, test accuracy)``."""
    from cortado.backends import gpu_visible

    backend = backend or ("cupy" if gpu_visible() else "numpy")
    rng = np.random.default_rng(seed)
    x, labels = images(2048, rng)
    x_test, labels_test = images(512, rng)
    model = CNN()
    step = training_step(model, seed, backend)
    log(f"a CNN on {SIDE}x{SIDE} images of {CLASSES} strokes, its step compiled for {backend}: "
        f"{step.kernels_run} kernels, {step.memory.summary()}")
    history = []
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(x))
        losses = [float(step(x=x[rows], labels=labels[rows].astype(np.int32))[0])
                  for rows in (order[i:i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH))]
        history.append(float(np.mean(losses)))
        log(f"epoch {epoch:3}  loss {history[-1]:.4f}")
    trained, tested = accuracy(model, step, x, labels), accuracy(model, step, x_test, labels_test)
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
