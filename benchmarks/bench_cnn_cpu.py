"""The CNN example's training step on the CPU: cortado against PyTorch's CPU eager mode.

    python benchmarks/bench_cnn_cpu.py [--repeats 100] [--out benchmarks/results/cnn_cpu.json]

The model is examples/cnn.py's (two 3x3 convolutions with batch norms and relu, pooling, a linear head; batch 64
of 16x16 images, float32), built from cortado.nn and trained by SGD with momentum; torch's is the same model
written with torch.nn.functional over the same weights by the same names, with torch.optim.SGD. Each contestant
runs in a process of its own, one after the other; each takes the same first weights and the same batch, their
first losses must agree, and the median of ``repeats`` steps after a warm-up is compared. Where torch is not
installed, its row says so. Our model's build, compile and first call are timed twice more (``compile_s``): in a
process whose cache of compiled C is empty, then in one after it was filled.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)

import cnn  # noqa: E402
from versus_torch import compare, torch_training_step  # noqa: E402


def case():
    """The model, its first values by name, and one batch: the same in every process."""
    model = cnn.CNN()
    step = cnn.training_step(model, 0, "numpy")
    values = {name: np.array(step.state[name]) for name in step.state}
    x, labels = cnn.images(cnn.BATCH, np.random.default_rng(0))
    return model, step, values, x, labels.astype(np.int32)


def cortado_step():
    _, step, _, x, labels = case()
    return lambda: float(step(x=x, labels=labels)[0])


def torch_step():
    import torch
    import torch.nn.functional as F

    _, _, values, x, labels = case()
    w = {name: torch.tensor(value, requires_grad=name.endswith(("weight", "bias"))) for name, value in values.items()
         if not name.startswith("sgd.")}
    images, y = torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))

    def norm(h, name):
        return F.batch_norm(h, w[f"{name}.running_mean"], w[f"{name}.running_var"], w[f"{name}.weight"],
                            w[f"{name}.bias"], training=True, momentum=0.1, eps=1e-5)

    def loss_of():
        h = F.max_pool2d(F.relu(norm(F.conv2d(images, w["conv1.weight"], padding=1), "norm1")), 2)
        h = F.relu(norm(F.conv2d(h, w["conv2.weight"], padding=1), "norm2"))
        logits = F.linear(h.amax(dim=(2, 3)), w["head.weight"], w["head.bias"])
        return F.cross_entropy(logits, y)

    sgd = torch.optim.SGD([p for p in w.values() if p.requires_grad], lr=cnn.LEARNING_RATE, momentum=0.9)
    return torch_training_step(loss_of, sgd)


CONTESTANTS = {"cortado": cortado_step, "torch": torch_step}


def main():
    compare(__doc__, __file__, CONTESTANTS, "cnn_cpu", 100, os.path.join(HERE, "results", "cnn_cpu.json"),
            {"batch": cnn.BATCH})


if __name__ == "__main__":
    main()
