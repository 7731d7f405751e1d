"""The demo: a small MLP classifier written as expressions, printed and evaluated.

The same model is the running example of the README; later stages (gradients, compile, GPU)
extend this demo rather than replace it.
"""

import numpy as np

import cortado as ct


def mlp_loss(batch=32, features=64, hidden=32, classes=10):
    """Softmax cross-entropy of a two-layer tanh MLP, as expressions: ``(loss, variables)``."""
    x = ct.var("x", (batch, features))
    y = ct.var("y", (batch, classes))  # one-hot labels
    W1, b1 = ct.var("W1", (features, hidden)), ct.var("b1", (hidden,))
    W2, b2 = ct.var("W2", (hidden, classes)), ct.var("b2", (classes,))
    h = ct.tanh(x @ W1 + b1)
    logits = h @ W2 + b2
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * y, axis=1))
    return loss, [x, y, W1, b1, W2, b2]


def random_feeds(variables, rng):
    """Gaussian inputs and small weights for every variable; one-hot rows for ``y``."""
    feeds = {}
    for v in variables:
        if v.name == "y":
            feeds["y"] = np.eye(v.shape[1], dtype=v.dtype)[rng.integers(0, v.shape[1], v.shape[0])]
        else:
            scale = 1.0 if v.name == "x" else 1 / np.sqrt(v.shape[0])
            feeds[v.name] = (scale * rng.standard_normal(v.shape)).astype(v.dtype)
    return feeds


def run(seed=0, dot_path=None):
    loss, variables = mlp_loss()
    graph = ct.Graph(loss)
    print(f"A two-layer MLP with softmax cross-entropy: {len(graph)} terms\n")
    print(graph)
    feeds = random_feeds(variables, np.random.default_rng(seed))
    value = ct.evaluate(loss, feeds)
    reference = ct.evaluate(loss, feeds, precision="float64")
    classes = variables[1].shape[1]
    print(f"\nloss on random data: {value:.6f} (float32), {reference:.6f} (float64); "
          f"log({classes}) = {np.log(classes):.6f} for a model that knows nothing")
    if dot_path:
        with open(dot_path, "w") as out:
            out.write(graph.to_dot())
        print(f"graph written to {dot_path} (render with: dot -Tpng {dot_path} -o graph.png)")
