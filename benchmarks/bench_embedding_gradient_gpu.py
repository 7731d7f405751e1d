"""An embedding's gradient on the GPU: the adjoint's rows added back at the token ids (``take``'s gradient, an
``add_at``), against the same sums as a product with the ids' one-hot matrix (tokens x vocabulary) and against
torch's embedding backward.

    python benchmarks/bench_embedding_gradient_gpu.py [--repeats 100] [--out benchmarks/results/embedding_gradient_gpu.json]

Contestants, each given the same token ids and output gradient ``dy`` (tokens x width):

- cortado, ``add_at``: ``ct.grad`` of ``sum(take(table, ids) * dy)``, what every embedding's gradient is (sorted runs of
  equal ids summed in the ids' order: deterministic, no atomics);
- cortado, one-hot product: ``einsum("iv,iq->vq", one_hot(ids), dy)``, a GEMM (deterministic too), written out;
- torch: ``aten.embedding_dense_backward``, what ``F.embedding``'s backward runs, and ``index_add_`` into zeros.

Each cortado case is one compiled program (its arena in the results); every result is checked against the
add_at's before timing (float32 sums: to the last bits of their rounding); each call is timed alone between CUDA
events after a warm-up (``bench_fused_gpu.time_calls``), the median kept. torch, where missing, is reported as not
measured.
"""

import argparse
import importlib.util
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, clock, log, print_table, require_gpu, time_calls  # noqa: E402
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

import cortado as ct  # noqa: E402

CASES = [  # tokens, vocabulary, width, dtype
    (8192, 63, 768, "bfloat16"),  # the GPT benchmark's
    (8192, 50257, 768, "bfloat16"),  # GPT-2's vocabulary
    (8192, 50257, 768, "float32"),
]


def cortado_contestant(form, tokens, vocabulary, width, dtype, values):
    import cupy

    ids, dy = ct.var("ids", (tokens,), "int32"), ct.var("dy", (tokens, width), dtype)
    if form == "add_at":
        table = ct.var("table", (vocabulary, width), dtype)
        (gradient,) = ct.grad(ct.sum(ct.take(table, ids, axis=0) * dy), [table])
    else:
        one_hot = ct.cast(ct.equal(ids[:, None], ct.const(np.arange(vocabulary, dtype=np.int32))), dtype)
        gradient = ct.einsum("iv,iq->vq", one_hot, dy)
    program = ct.compile([gradient], inputs=[ids, dy], backend="cupy")
    feeds = {"ids": cupy.asarray(values["ids"]), "dy": cupy.asarray(values["dy"].astype(program.inputs[1].dtype))}
    result = cupy.asnumpy(program(**feeds)[0]).astype(np.float64)
    profiles = [program.profile(feeds).split() for _ in range(5)]  # "N kernels, T ms in all: ..."
    device, wall = time_calls(lambda: program(**feeds), clock("cupy"), ARGS.repeats)
    return {"ms": 1e3 * device, "wall_ms": 1e3 * wall, "kernels": int(profiles[0][0]),
            "kernel_ms": min(float(words[2]) for words in profiles),
            "arena_mib": program.memory.peak_bytes / 2 ** 20, "result": result}


def torch_contestant(form, tokens, vocabulary, width, dtype, values):
    import torch

    kind = getattr(torch, dtype)
    ids = torch.tensor(values["ids"], dtype=torch.int64, device="cuda")
    dy = torch.tensor(values["dy"], dtype=torch.float32, device="cuda").to(kind)

    def call():
        if form == "embedding_dense_backward":
            return torch.ops.aten.embedding_dense_backward(dy, ids, vocabulary, -1, False)
        return torch.zeros(vocabulary, width, dtype=kind, device="cuda").index_add_(0, ids, dy)

    result = call().float().cpu().numpy().astype(np.float64)
    device, wall = time_calls(call, clock("torch"), ARGS.repeats)
    return {"ms": 1e3 * device, "wall_ms": 1e3 * wall, "result": result}


CONTESTANTS = [("cortado add_at", cortado_contestant, "add_at"), ("cortado one-hot product", cortado_contestant, "one_hot"),
               ("torch embedding backward", torch_contestant, "embedding_dense_backward"),
               ("torch index_add_", torch_contestant, "index_add_")]


def run_case(tokens, vocabulary, width, dtype, rng):
    values = {"ids": rng.integers(0, vocabulary, tokens).astype(np.int32),
              "dy": rng.standard_normal((tokens, width)).astype(np.float32)}
    label = f"{tokens} tokens, vocabulary {vocabulary}, width {width}, {dtype}"
    case = {"tokens": tokens, "vocabulary": vocabulary, "width": width, "dtype": dtype, "contestants": {}}
    reference = None
    for name, contestant, form in CONTESTANTS:
        if contestant is torch_contestant and importlib.util.find_spec("torch") is None:
            case["contestants"][name] = {"error": "not installed: torch", "not_installed": True}
            log(f"{label}: {name}: not installed; not measured")
            continue
        result = attempt(f"{label}: {name}", contestant, form, tokens, vocabulary, width, dtype, values)
        if "result" in result:
            got = result.pop("result")
            reference = got if reference is None else reference
            scale = max(np.abs(reference).max(), 1e-30)
            result["max_rel_error"] = float(np.abs(got - reference).max() / scale)
        case["contestants"][name] = result
    ours = case["contestants"]["cortado add_at"].get("ms")
    for result in case["contestants"].values():
        if ours and "ms" in result:
            result["over_add_at"] = result["ms"] / ours
    return case


COLUMNS = [("case", "case", "34s"), ("contestant", "contestant", "26s"), ("us", "us", "10.1f"),
           ("kernel us", "kernel_us", "10.1f"), ("/ add_at", "over", "9.2f"), ("arena MiB", "arena", "10.1f"),
           ("max rel err", "error", "12.1e")]


def table(cases):
    rows = []
    for case in cases:
        label = f"{case['tokens']}x{case['vocabulary']}x{case['width']} {case['dtype']}"
        for name, result in case["contestants"].items():
            rows.append({"case": label, "contestant": name, "us": result.get("ms", 0) * 1e3 or None,
                         "kernel_us": result.get("kernel_ms", 0) * 1e3 or None, "over": result.get("over_add_at"),
                         "arena": result.get("arena_mib"), "error": result.get("max_rel_error"),
                         "note": result.get("error", "").splitlines()[0] if "error" in result else ""})
    print_table(rows, COLUMNS)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "embedding_gradient_gpu.json"))
    ARGS = parser.parse_args()
    device = require_gpu()
    log(f"{device}: an embedding's gradient, add_at against a one-hot product and torch")
    rng = np.random.default_rng(0)
    cases = [run_case(*case, rng) for case in CASES]
    table(cases)
    write_results({"benchmark": "embedding_gradient_gpu", "machine": describe(), "repeats": ARGS.repeats,
                   "cases": cases}, ARGS.out)


ARGS = None

if __name__ == "__main__":
    main()
