"""Train an MLP classifier by plain gradient descent: the model as expressions, its gradients by
``ct.grad``, the whole training step (forward, backward, update) compiled by ``ct.compile`` into
one Program that keeps the weights as state and runs out of one planned arena.

    python examples/mlp_numpy.py [--epochs 60] [--seed 0] [--dot graph.dot] [--plan plan.png] [--backend cupy]

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


def training_step(batch, sizes, learning_rate, rng, backend="numpy"):
    """The compiled step, and the graph it runs: it returns the loss and updates every parameter."""
    loss, _, x, y, parameters = mlp(batch, sizes)
    gradients = ct.grad(loss, parameters)
    values = initial_values(parameters, rng)
    step = ct.compile([loss], inputs=[x, y], state={p: values[p.name] for p in parameters},
                      updates={p: p - learning_rate * g for p, g in zip(parameters, gradients)}, backend=backend)
    return step, [loss, *gradients]


def train(epochs=60, seed=0, batch=60, sizes=(2, 32, 32, 3), learning_rate=0.5, dot_path=None, plan_path=None,
          log=print, backend="numpy"):
    """Train on spirals with the step compiled for ``backend``; return the loss of each epoch."""
    rng = np.random.default_rng(seed)
    points, labels = spirals(100, sizes[-1], rng)
    onehot = np.eye(sizes[-1], dtype=np.float32)[labels]
    step, graph = training_step(batch, sizes, learning_rate, rng, backend)
    log(f"model and gradients: {len(ct.Graph(graph))} terms; compiled step: {step.kernels_run} kernels")
    if dot_path:
        with open(dot_path, "w") as out:
            out.write(ct.to_dot(graph))
        log(f"graph of the loss and its gradients written to {dot_path}")
    history = []
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(points))
        losses = []
        for i in range(0, len(order) - batch + 1, batch):
            rows = order[i:i + batch]
            (loss_value,) = step(x=points[rows], y=onehot[rows])
            losses.append(float(loss_value))
        history.append(float(np.mean(losses)))
        log(f"epoch {epoch:3}  loss {history[-1]:.4f}")
    log("\nloss curve:\n" + loss_curve(history))
    log(f"\nmemory of the step: {step.memory.summary()}")
    if plan_path:
        try:
            log(f"picture of the plan written to {step.memory.plot(plan_path)}")
        except ct.PlanError as error:
            log(f"no picture of the plan: {error}")
    predictions = predict(points, step.state, sizes)
    log(f"training accuracy: {np.mean(predictions == labels):.1%} (log(3) = {np.log(3):.4f} is the loss of a guess)")
    return history


def loss_curve(history, height=8, width=60):
    """The losses as a small text chart, first epoch on the left."""
    picked = [history[int(i * len(history) / min(width, len(history)))] for i in range(min(width, len(history)))]
    top, bottom = max(picked), min(picked)
    span = (top - bottom) or 1.0
    rows = []
    for level in range(height, 0, -1):
        threshold = bottom + span * (level - 0.5) / height
        label = {height: f"{top:7.3f} |", 1: f"{bottom:7.3f} |"}.get(level, "        |")
        rows.append(label + "".join("*" if value >= threshold else " " for value in picked))
    return "\n".join(rows + ["        +" + "-" * len(picked) + f"> {len(history)} epochs"])


def predict(points, state, sizes):
    """The trained model's classes for ``points``: the same expressions at another batch size, compiled."""
    _, logits, x, _, parameters = mlp(len(points), sizes)
    predict = ct.compile(logits, inputs=[x, *parameters])
    values = {p.name: np.asarray(state[p.name].get() if hasattr(state[p.name], "get") else state[p.name])
              for p in parameters}  # a GPU program's state is CuPy arrays
    return np.argmax(predict(x=points, **values), axis=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dot", metavar="PATH", help="write the graph of the loss and its gradients as DOT")
    parser.add_argument("--plan", metavar="PATH", help="draw the step's memory plan as a PNG (needs matplotlib)")
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help="cupy: run the step on the GPU")
    args = parser.parse_args(argv)
    train(epochs=args.epochs, seed=args.seed, dot_path=args.dot, plan_path=args.plan, backend=args.backend)


if __name__ == "__main__":
    main()
