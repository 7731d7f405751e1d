"""How compile's work (and ``explain``'s) grows with a graph, counted and never timed: an elementwise chain's forward
pass is one fused region with an output for each value its backward pass reads, and its backward pass one reading them
all, so any work done per result per output (or per operand) of a region is quadratic in the chain's length
(``benchmarks/bench_compile_scaling.py`` times it); and no stage recurses once a term."""

import sys

import numpy as np

import cortado as ct
from cortado import program as program_module
from cortado.exprgraph import printing
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import FUSED_OP
from cortado.exprgraph.term import HashedTuple
from cortado.memplan import ReadBeforeWrite
from cortado.rules import fusion


def chain(ops):
    """A training step of ``ops`` elementwise ops in a chain on ``x``, scaled by a broadcast ``w``, summed: ``(loss,
    state, updates)``."""
    x, w = ct.var("x", (4, 8)), ct.var("w", (8,))
    h = x
    for i in range(ops):
        h = [ct.tanh, lambda v: v * w, lambda v: v + 0.5, ct.exp, lambda v: v * 0.25][i % 5](h)
    loss = ct.sum(h)
    gx, gw = ct.grad(loss, [x, w])
    state = {x: np.full((4, 8), 0.1, np.float32), w: np.full(8, 0.5, np.float32)}
    return loss, state, {x: x - 0.01 * gx, w: w - 0.01 * gw}


def _compiled(ops):
    loss, state, updates = chain(ops)
    return ct.compile([loss], state=state, updates=updates)


def test_a_regions_results_are_made_once_and_its_kernel_decided_once(monkeypatch):
    counts = {"kernel_shape": 0, "fused results_of": 0}

    def counted(name, function):
        def call(*args):
            counts[name] += 1
            return function(*args)
        return call

    monkeypatch.setattr(fusion, "kernel_shape", counted("kernel_shape", fusion.kernel_shape))
    results_of = type(FUSED_OP).results_of
    monkeypatch.setattr(type(FUSED_OP), "results_of", lambda op, term: (
        counted("fused results_of", results_of) if op is FUSED_OP else results_of)(op, term))
    program = _compiled(300)
    fused = [k for k in program.kernels if k.term.op is FUSED_OP]
    assert max(len(k.terms) for k in fused) >= 100  # the forward region: an output for each value read backward
    assert counts["kernel_shape"] <= len(fused)  # (once for each of a region's outputs: thousands)
    assert counts["fused results_of"] <= 2 * len(fused)
    assert all(type(k.term.args) is HashedTuple and type(k.term.attr("outputs")) is HashedTuple for k in fused)


def test_a_regions_in_place_pairs_are_never_listed(monkeypatch):
    def listed(pairs):
        raise AssertionError("a region's in-place pairs were listed: as many as its outputs times its operands")

    monkeypatch.setattr(ReadBeforeWrite, "__iter__", listed)
    program = _compiled(300)
    assert any(p.takes_from is not None for p in program.memory.placements)


def test_schedule_walks_the_args_its_terms_share_once():
    walks = []

    class Args(tuple):
        def __iter__(self):
            walks.append(self)
            return super().__iter__()

    class Node:
        def __init__(self, *args):
            self.args = args

    leaves = [Node() for _ in range(50)]
    shared = Args(leaves)
    results = [Node() for _ in range(50)]
    for r in results:
        r.args = shared  # the results of one region: one tuple of operands
    order = post_order([Node(*results)])
    assert len(order) == 101 and order.index(leaves[-1]) < order.index(results[0])
    assert len(walks) == 1


def test_a_long_chain_compiles_and_runs_with_little_room_for_recursion():
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 120)  # deep enough for grad's and compile's own calls, not for a walk recursing a term
    try:
        loss, state, updates = chain(3000)  # (its gradients too)
        program = ct.compile([loss], state=state, updates=updates)
        (value,) = program()
    finally:
        sys.setrecursionlimit(old)
    assert np.isfinite(value)


def test_explain_writes_a_regions_body_once_and_grows_with_the_chain(monkeypatch):
    short, long = _compiled(300), _compiled(1200)
    assert len(long.explain()) < 6 * len(short.explain())  # 4x the ops: 4x the text (16x where bodies repeat)
    bodies = []

    def counted(term):
        bodies.append(term)
        return "{...}"

    monkeypatch.setattr(printing, "body_text", counted)
    monkeypatch.setattr(program_module, "body_text", counted)
    text = short.explain(examples=0)
    assert len(bodies) == sum(k.term.op is FUSED_OP for k in short.kernels)  # not once more for each value read
    backward = next(line for line in text.splitlines() if line.startswith("  k1 "))
    assert backward.count("k0.fused[") >= 100  # the forward region's values, by name
