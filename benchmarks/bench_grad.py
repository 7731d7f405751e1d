"""``ct.grad`` of an L-layer MLP, L = 2 to 64: the gradient graph and the time to build it should
grow linearly in L.

    python benchmarks/bench_grad.py [--repeats 5] [--out benchmarks/results/grad_cpu.json]

The model is a tanh MLP of width 64 on a batch of 32 with a softmax cross-entropy loss; the
gradient is taken with respect to every weight and bias. Reported per L: the terms of the model,
of the gradients alone, and of both together (the gradients reuse the model's terms), and the
median time of ``ct.grad`` (simplifying the model, the reverse sweep, simplifying the
gradients) over ``repeats`` fresh builds. Least-squares fits of log(terms) and log(time) on
log(L) give the growth exponents: 1.0 is linear.
"""

import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, growth_exponent, measured_rows, write_results  # noqa: E402

DEPTHS = (2, 4, 8, 16, 32, 64)
BATCH, WIDTH, CLASSES = 32, 64, 10


def mlp(layers):
    """``(loss, parameters)`` of a ``layers``-layer tanh MLP with softmax cross-entropy."""
    h = ct.var("x", (BATCH, WIDTH))
    y = ct.var("y", (BATCH, CLASSES))
    parameters = []
    for i in range(layers):
        fan_out = CLASSES if i == layers - 1 else WIDTH
        W, b = ct.var(f"W{i}", (WIDTH, fan_out)), ct.var(f"b{i}", (fan_out,))
        parameters += [W, b]
        h = h @ W + b
        if i < layers - 1:
            h = ct.tanh(h)
    return ct.mean(ct.logsumexp(h, axis=1) - ct.sum(h * y, axis=1)), parameters


def measure(layers, repeats):
    times = []
    for _ in range(repeats):
        loss, parameters = mlp(layers)
        gc.collect()
        start = time.perf_counter()
        gradients = ct.grad(loss, parameters)
        times.append(time.perf_counter() - start)
        model, alone, both = len(ct.Graph(loss)), len(ct.Graph(gradients)), len(ct.Graph([loss, *gradients]))
        del loss, parameters, gradients  # the next build makes its terms afresh
    seconds = statistics.median(times)
    return {"layers": layers, "model_terms": model, "gradient_terms": alone, "joint_terms": both,
            "grad_seconds": seconds, "microseconds_per_gradient_term": 1e6 * seconds / alone}


def main():
    args = command_line(__doc__, "grad_cpu.json", repeats=5)
    rows = measured_rows(DEPTHS, lambda layers: measure(layers, args.repeats), [
        ("layers", "layers", "6d"), ("model", "model_terms", "6d"), ("grads", "gradient_terms", "6d"),
        ("joint", "joint_terms", "6d"), ("seconds", "grad_seconds", "9.4f"),
        ("us/term", "microseconds_per_gradient_term", "8.1f")])
    depths = [r["layers"] for r in rows]
    terms_exponent = growth_exponent(depths, [r["gradient_terms"] for r in rows])
    time_exponent = growth_exponent(depths, [r["grad_seconds"] for r in rows])
    print(f"growth exponents in L (1.0 = linear): gradient terms {terms_exponent:.3f}, time {time_exponent:.3f}")
    write_results({"benchmark": "grad", "machine": describe(), "repeats": args.repeats, "rows": rows,
                   "terms_growth_exponent": terms_exponent, "time_growth_exponent": time_exponent},
                  args.out)


if __name__ == "__main__":
    main()
