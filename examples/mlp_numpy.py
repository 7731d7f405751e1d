"""Train an MLP classifier by plain gradient descent: the model as expressions, its gradients by
``ct.grad``, every step run by the NumPy reference interpreter.

    python examples/mlp_numpy.py [--epochs 60] [--seed 0] [--dot graph.dot]

The data are three interleaved spirals in the plane, which no linear model separates: the loss
falls from log(3) (a model that knows nothing) as the hidden layers learn to unroll them.
"""

import argparse

import numpy as np

import cortado as ct


def spirals(points_per_class, classes, rng):
    """``(x, labels)``: ``classes`` noisy spiral arms of points in the plane."""
    radius = np.tile(np.linspace(0.05, 1.0, points_per_class), classes)
    arm = np.repeat(np.arange(classes), points_per_class)
    angle = arm * 2 * np.pi / classes + radius * 4.0 + 0.2 * rng.standard_normal(radius.size)
    x = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)
    return x.astype(np.float32), arm


def mlp(batch, sizes):
    """A tanh MLP with layer ``sizes`` and its softmax cross-entropy: ``(loss, logits, x, y, parameters)``."""
    x = ct.var("x", (batch, sizes[0]))
    y = ct.var("y", (batch, sizes[-1]))  # one-hot labels
    parameters = []
    h = x
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:]), start=1):
        W, b = ct.var(f"W{i}", (fan_in, fan_out)), ct.var(f"b{i}", (fan_out,))
        parameters += [W, b]
        h = h @ W + b
        if i < len(sizes) - 1:
            h = ct.tanh(h)
    loss = ct.mean(ct.logsumexp(h, axis=1) - ct.sum(h * y, axis=1))
    return loss, h, x, y, parameters


def initial_values(parameters, rng):
    """Glorot-scaled weights and zero biases, in each parameter's dtype."""
    values = {}
    for p in parameters:
        if p.ndim == 2:
            values[p.name] = (rng.standard_normal(p.shape) * np.sqrt(2 / sum(p.shape))).astype(p.dtype)
        else:
            values[p.name] = np.zeros(p.shape, p.dtype)
    return values


def train(epochs=60, seed=0, batch=60, sizes=(2, 32, 32, 3), learning_rate=0.5, dot_path=None, log=print):
    """Train on spirals; return the loss of each epoch (the mean over its batches)."""
    rng = np.random.default_rng(seed)
    points, labels = spirals(100, sizes[-1], rng)
    onehot = np.eye(sizes[-1], dtype=np.float32)[labels]
    loss, _, x, y, parameters = mlp(batch, sizes)
    gradients = ct.grad(loss, parameters)
    step = [loss, *gradients]
    log(f"model: {len(ct.Graph(loss))} terms; model and gradients: {len(ct.Graph(step))} terms")
    if dot_path:
        with open(dot_path, "w") as out:
            out.write(ct.to_dot(step))
        log(f"graph of the loss and its gradients written to {dot_path}")
    values = initial_values(parameters, rng)
    history = []
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(points))
        losses = []
        for i in range(0, len(order) - batch + 1, batch):
            rows = order[i:i + batch]
            loss_value, *grads = ct.evaluate(step, {"x": points[rows], "y": onehot[rows], **values})
            for p, g in zip(parameters, grads):
                values[p.name] = values[p.name] - learning_rate * g
            losses.append(float(loss_value))
        history.append(float(np.mean(losses)))
        log(f"epoch {epoch:3}  loss {history[-1]:.4f}")
    predictions = _predict(points, values, sizes)
    log(f"training accuracy: {np.mean(predictions == labels):.1%} (log(3) = {np.log(3):.4f} is the loss of a guess)")
    return history


def _predict(points, values, sizes):
    """The trained model's classes for ``points``: the same expressions, at another batch size."""
    _, logits, _, _, parameters = mlp(len(points), sizes)
    return np.argmax(ct.evaluate(logits, {"x": points, **{p.name: values[p.name] for p in parameters}}), axis=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dot", metavar="PATH", help="write the graph of the loss and its gradients as DOT")
    args = parser.parse_args(argv)
    train(epochs=args.epochs, seed=args.seed, dot_path=args.dot)


if __name__ == "__main__":
    main()
