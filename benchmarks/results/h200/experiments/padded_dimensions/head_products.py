"""The GPT head's three bfloat16 products, for a vocabulary of 63 (the built-in text's) and of 50257 (GPT-2's): the
logits ``x @ w^T``, the input gradient ``dy @ w`` and the weight gradient ``dy^T @ x``, over 8192 tokens of width
768, compiled as one program; beside them torch's three ``matmul`` calls (cuBLAS) where torch is installed.

    python3 head_products.py          (from the repository root, on the GPU machine; prints one line a contestant)

Device time of 50 calls back to back between two events, the median of 5; the operands are the program's state.
"""

import os
import statistics
import sys

sys.path.insert(0, os.getcwd())

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import cortado as ct  # noqa: E402

TOKENS, WIDTH, CALLS, REPEATS = 8192, 768, 50, 5


def timed(call, stream):
    call()
    times = []
    for _ in range(REPEATS):
        start = stream.record()
        for _ in range(CALLS):
            call()
        end = stream.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / CALLS)
    return statistics.median(times)


def ours(vocab, values):
    import ml_dtypes

    x, w = ct.var("x", (TOKENS, WIDTH), "bfloat16"), ct.var("w", (vocab, WIDTH), "bfloat16")
    dy = ct.var("dy", (TOKENS, vocab), "bfloat16")
    outputs = [ct.matmul(x, ct.transpose(w)), ct.matmul(dy, w), ct.matmul(ct.transpose(dy), x)]
    state = {v: values[v.name].astype(ml_dtypes.bfloat16) for v in (x, w, dy)}
    program = ct.compile(outputs, inputs=[], state=state, backend="cupy")
    padded = "product written padded" in program.explain()
    ms = timed(program, cupy.cuda.get_current_stream())
    return ms, padded


def torch_matmuls(values):
    try:
        import torch
    except ImportError:
        return None
    x, w, dy = (torch.as_tensor(values[k], device="cuda").to(torch.bfloat16) for k in ("x", "w", "dy"))
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    return timed(lambda: (x @ w.T, dy @ w, dy.T @ x), stream)


def main():
    rng = np.random.default_rng(0)
    for vocab in (63, 50257):
        shapes = {"x": (TOKENS, WIDTH), "w": (vocab, WIDTH), "dy": (TOKENS, vocab)}
        values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
        ms, padded = ours(vocab, values)
        print(f"vocabulary {vocab}: cortado {ms * 1e3:.1f} us ({'padded' if padded else 'as it is'})", flush=True)
        peer = torch_matmuls(values)
        print(f"vocabulary {vocab}: torch {peer * 1e3:.1f} us" if peer is not None
              else f"vocabulary {vocab}: torch not installed", flush=True)


if __name__ == "__main__":
    main()
