"""The distinct generated kernels of the large GPT step, float8 and bfloat16, as the GPU backend plans them (on any
machine: no GPU is asked), pickled with their operands' shapes and dtypes for ``bench.py`` to time alone:
``python3 dump.py kernels.pkl`` from the repository root."""

import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "benchmarks")]

import cortado as ct  # noqa: E402
from bench_gpt_gpu import SIZES  # noqa: E402
from cortado import compiler, nn, optim  # noqa: E402
from cortado.backends.cupy import backend as gpu_backend  # noqa: E402
from cortado.backends.cupy import sources  # noqa: E402
from cortado.backends.cupy.codegen import Operand, contiguous_strides  # noqa: E402
from cortado.exprgraph.graph import post_order  # noqa: E402
from cortado.exprgraph.ops import FUSED_OP  # noqa: E402
from gpt import BETAS, GPT, WEIGHT_DECAY  # noqa: E402


def kernels(float8, size="large"):
    """``{name: {"source", "ins", "outs", "kind", "count"}}`` of the step's generated kernels."""
    shape = SIZES[size]
    model = GPT(65, shape.context, shape.width, shape.heads, None, shape.layers, float8).compute_in("bfloat16")
    tokens = ct.var("tokens_in", (shape.batch, shape.context), "int32")
    labels = ct.var("labels", (shape.batch, shape.context), "int32")
    loss = nn.cross_entropy(model(tokens), labels)
    params = model.parameters()
    adamw = optim.AdamW(lr=3e-3, betas=BETAS, weight_decay=WEIGHT_DECAY, decay=lambda name, p: p.ndim == 2)
    state, updates = adamw.updates(params, ct.grad(loss, list(params.values())))
    updates.update(model.state_updates(loss))
    roots = compiler._rewrite([loss] + list(updates.values()), gpu_backend, {})
    found = {}
    for t in post_order(roots):
        if t.op is not FUSED_OP:
            continue
        operands = [Operand(a.shape, a.dtype, contiguous_strides(a.shape)) for a in t.args]
        for s in sources.kernel_sources(t.attr("outputs"), operands, (), None, t.attr("kernel")):
            entry = found.setdefault(s.name, {"source": s, "ins": [(a.shape, str(a.dtype)) for a in t.args],
                                              "outs": [(o.shape, str(o.dtype)) for o in t.attr("outputs")],
                                              "kind": str(t.attr("kernel"))[:40], "count": 0})
            entry["count"] += 1
    return found


if __name__ == "__main__":
    with open(sys.argv[1], "wb") as file:
        pickle.dump({"float8": kernels(True), "bfloat16": kernels(False)}, file)
