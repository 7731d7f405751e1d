"""``ct.grad`` and ``ct.compile`` phase by phase on graphs of 1k to 64k ops: the time per op of every phase should
stay flat as the graph grows (linear), not grow with it (quadratic).

    python benchmarks/bench_compile_scaling.py [--repeats 1] [--sizes 1000,4000,16000,64000]
        [--families chain,mlp,norms] [--cached] [--out benchmarks/results/cpu/compile_scaling.json]

Three kinds of graph, each a training step (the loss, its gradients by ``ct.grad``, gradient-descent updates of
the parameters) on small tensors, so that the time is the compiler's and not the arithmetic's:

- ``chain``: a chain of elementwise ops on an 8 x 16 input (tanh, times a broadcast row of weights, plus a constant,
  exp then times a constant, in turn), summed; the gradients of the weights and of the input (kept as state). Its
  whole forward pass is elementwise, so fusion makes long regions of it, whose values the backward pass reads;
- ``mlp``: a tanh MLP of width 16 (``bench_grad.mlp``'s loss), a product, a bias and a tanh a layer;
- ``norms``: sums and broadcasts: each block takes its rows' mean off (a ``mean(..., keepdims=True)`` broadcast
  back), scales by a broadcast row and adds a column's sum; the gradients are reductions of broadcasts again.

The size is the ops of the forward pass (one per tanh, product, sum, ...). Reported per size: the terms given to
``compile`` (forward, backward, updates), its kernels, and the seconds of each phase: ``grad``; in ``compile``,
``signature`` (scheduling and checking what the step reads), the rule stages ``simplify``, ``stability``,
``lowering``, ``primitives``, ``fusion`` (fusion and the joins after it), ``schedule`` (kernels and their
layout), ``order`` (memory-aware order), ``memplan`` (sinks, liveness, offsets), ``recompute`` (its choices and
rewrites; the plans of its candidates are counted in the phases above), ``codegen`` (the executor, the C source
of its regions) and ``cc`` (the C compiler; an empty cache of compiled C unless ``--cached``). Each phase's time
is its own: a timed function's time less the timed functions it calls. A least-squares fit of log(time) on
log(terms) per phase gives its growth exponent: 1.0 is linear, 2.0 quadratic.
"""

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cortado as ct  # noqa: E402
from cortado import compiler  # noqa: E402
from cortado.backends import backend_named  # noqa: E402
from cortado.backends.numpy import native  # noqa: E402
from machine import describe  # noqa: E402
from reporting import growth_exponent, measured_rows, write_results  # noqa: E402

SIZES = (1_000, 4_000, 16_000, 64_000)
FAMILIES = ("chain", "mlp", "norms")
PHASES = ("grad", "signature", "simplify", "stability", "lowering", "primitives", "fusion", "schedule", "order",
          "memplan", "recompute", "codegen", "cc")
ROWS, COLUMNS = 8, 16


def chain(ops):
    """``(loss, inputs, parameters)``: ``ops`` elementwise ops in a chain, summed."""
    x = ct.var("x", (ROWS, COLUMNS))
    w = ct.var("w", (COLUMNS,))
    h = x
    for i in range(ops):
        step = i % 5
        if step == 0:
            h = ct.tanh(h)
        elif step == 1:
            h = h * w
        elif step == 2:
            h = h + 0.5
        elif step == 3:
            h = ct.exp(h)
        else:
            h = h * 0.25
    return ct.sum(h), [], [x, w]


def mlp(ops):
    """A tanh MLP of ``ops // 3`` layers (a product, a bias and a tanh each), width 16, softmax cross-entropy."""
    h = x = ct.var("x", (ROWS, COLUMNS))
    y = ct.var("y", (ROWS, COLUMNS))
    parameters = []
    for i in range(max(ops // 3, 1)):
        W, b = ct.var(f"W{i}", (COLUMNS, COLUMNS)), ct.var(f"b{i}", (COLUMNS,))
        parameters += [W, b]
        h = ct.tanh(h @ W + b)
    return ct.mean(ct.logsumexp(h, axis=1) - ct.sum(h * y, axis=1)), [x, y], parameters


def norms(ops):
    """Blocks of six ops: a row mean taken off (broadcast back), scaled by a row, plus a column sum, then a tanh."""
    h = x = ct.var("x", (ROWS, COLUMNS))
    parameters = []
    for i in range(max(ops // 6, 1)):
        g = ct.var(f"g{i}", (COLUMNS,))
        parameters.append(g)
        centred = h - ct.mean(h, axis=1, keepdims=True)
        h = ct.tanh(centred * g + ct.sum(h, axis=0) * (1.0 / ROWS))
    return ct.sum(h * h), [x], parameters


BUILDERS = {"chain": chain, "mlp": mlp, "norms": norms}


class Phases:
    """Seconds by phase: each timed function's own time, less the timed functions it calls."""

    def __init__(self):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._inner = []  # per timed call in progress, the time of the timed calls within it

    def timed(self, phase, function):
        def call(*args, **kwargs):
            self._inner.append(0.0)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                inner = self._inner.pop()
                self.seconds[phase] += spent - inner
                if self._inner:
                    self._inner[-1] += spent

        return call


@contextlib.contextmanager
def patched(phases):
    """The compiler's stages timed into ``phases`` while inside."""
    engine = backend_named("numpy")
    places = [(compiler, "_signature", "signature"), (compiler.simplifier, "run", "simplify"),
              (compiler.fast_simplifier, "run", "simplify"), (compiler.stabiliser, "run", "stability"),
              (engine.lowering, "run", "lowering"), (compiler.primitives, "run", "primitives"),
              (compiler, "_rewrite", "fusion"),  # what _rewrite does besides the stages above: fusion and its joins
              (compiler, "_kernels", "schedule"), (engine, "steps", "schedule"), (compiler, "_ordered", "order"),
              (compiler, "_planned", "memplan"), (compiler, "choices", "recompute"),
              (compiler, "recomputed", "recompute"), (compiler, "into_row_kernels", "recompute"),
              (engine, "executor", "codegen"), (native, "load", "cc")]
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in places]
    for owner, name, phase in places:
        setattr(owner, name, phases.timed(phase, getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is None:
                delattr(owner, name)  # a bound method set on the instance: its class's is back
            else:
                setattr(owner, name, value)


def measure_once(family, ops, cached):
    loss, inputs, parameters = BUILDERS[family](ops)
    phases = Phases()
    gc.collect()
    start = time.perf_counter()
    gradients = ct.grad(loss, parameters)
    phases.seconds["grad"] = time.perf_counter() - start
    updates = {p: p - 0.1 * g for p, g in zip(parameters, gradients)}
    state = {p: np.zeros(p.shape, p.dtype) for p in parameters}
    terms = len(ct.Graph([loss, *updates.values()]))
    cache = None if cached else tempfile.mkdtemp(prefix="cortado-bench-cache-")
    saved_cache = os.environ.get("CORTADO_CACHE_DIR")
    if cache is not None:
        os.environ["CORTADO_CACHE_DIR"] = cache
    try:
        gc.collect()
        with patched(phases):
            start = time.perf_counter()
            program = ct.compile([loss], inputs=inputs, state=state, updates=updates)
            compile_seconds = time.perf_counter() - start
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
            if saved_cache is None:
                del os.environ["CORTADO_CACHE_DIR"]
            else:
                os.environ["CORTADO_CACHE_DIR"] = saved_cache
    row = {"family": family, "ops": ops, "terms": terms, "kernels": len(program.kernels),
           "compile_seconds": compile_seconds, **{f"{p}_seconds": s for p, s in phases.seconds.items()}}
    row["other_seconds"] = compile_seconds - sum(s for p, s in phases.seconds.items() if p != "grad")
    return row


def measure(family, ops, repeats, cached):
    runs = [measure_once(family, ops, cached) for _ in range(repeats)]
    row = {key: statistics.median(r[key] for r in runs) if key.endswith("_seconds") else value
           for key, value in runs[0].items()}
    row["grad_us_per_term"] = 1e6 * row["grad_seconds"] / row["terms"]
    row["compile_us_per_term"] = 1e6 * row["compile_seconds"] / row["terms"]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="forward ops, comma-separated")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--cached", action="store_true", help="keep the C compiler's cache (default: an empty one)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu",
                                                      "compile_scaling.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    columns = [("ops", "ops", "6d"), ("terms", "terms", "7d"), ("kernels", "kernels", "7d")]
    columns += [(p, f"{p}_seconds", f"{max(len(p), 7)}.3f") for p in PHASES]
    columns += [("other", "other_seconds", "7.3f"), ("compile", "compile_seconds", "8.3f"),
                ("us/term", "compile_us_per_term", "7.1f")]
    rows, exponents = [], {}
    for family in args.families.split(","):
        print(f"\n{family}:")
        measured = measured_rows(sizes, lambda ops, family=family: measure(family, ops, args.repeats, args.cached), columns)
        rows += measured
        if len(measured) > 1:
            terms = [r["terms"] for r in measured]
            exponents[family] = {p: growth_exponent(terms, [max(r[f"{p}_seconds"], 1e-6) for r in measured])
                                 for p in (*PHASES, "compile")}
            print("growth exponents in terms (1.0 = linear): "
                  + ", ".join(f"{p} {e:.2f}" for p, e in exponents[family].items()))
    write_results({"benchmark": "compile_scaling", "machine": describe(), "repeats": args.repeats,
                   "cached": args.cached, "command": " ".join(["python", *sys.argv]), "rows": rows,
                   "growth_exponents": exponents}, args.out)


if __name__ == "__main__":
    main()
