"""The SSA listing, the one-line form and the DOT export, on fixed and random graphs."""

import re

import numpy as np
from hypothesis import given

import cortado as ct
from cortado.testing import graphs


def test_listing_of_a_small_model():
    x, W, b = ct.var("x", (64, 784)), ct.var("W", (784, 10)), ct.var("b", (10,))
    logits = x @ W + b
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.sum(logits * 2.0, axis=1))
    text = ct.format_graph([loss])
    assert text.splitlines()[:3] == ["var x : float32[64,784]", "var W : float32[784,10]", "var b : float32[10]"]
    assert re.search(r"^%0 = matmul\(x, W\) +: float32\[64,10\]$", text, re.M)
    assert re.search(r"^%1 = add\(%0, b\) +: float32\[64,10\]$", text, re.M)
    assert re.search(r"= multiply\(%1, 2\.0\) +: float32\[64,10\]$", text, re.M)  # scalars inline
    assert re.search(r"= logsumexp\(%1, axes=\(1,\)\) +: float32\[64\]$", text, re.M)
    assert text.splitlines()[-1] == "return %6"
    assert str(ct.Graph(loss)) == text


def test_repr_is_one_line_with_its_type():
    x = ct.var("x", (2, 3))
    assert repr(ct.exp(x) + 1.0) == "<add(exp(x), 1.0) : float32[2,3]>"
    assert repr(ct.const(np.zeros((2, 2)))) == "<full(0.0) : float64[2,2]>"
    assert repr(ct.const(np.eye(2))) == "<const(float64[2,2]) : float64[2,2]>"
    deep = x
    for _ in range(10):
        deep = ct.tanh(deep)
    assert "..." in repr(deep) and len(repr(deep)) < 80


def test_variables_sharing_a_name_are_told_apart_in_listings():
    a, b = ct.var("v", (2,)), ct.var("v", (3,))
    text = ct.format_graph([ct.sum(a) + ct.sum(b)])
    assert "var v : float32[2]" in text and "var v#2 : float32[3]" in text


@given(graphs())
def test_listing_has_one_line_per_term(graph):
    g = ct.Graph(graph.outputs)
    lines = str(g).splitlines()
    shown = [t for t in g.schedule if t.op.name == "var"]
    shown += [t for t in g.schedule if t.op.name != "var" and not (t.op.name == "const" and t.ndim == 0)]
    assert len(lines) == len(shown) + 1
    assert lines[-1].startswith("return ")
    for line, term in zip(lines, shown):
        assert line.endswith(f"{term.dtype.name}[{','.join(map(str, term.shape))}]")


@given(graphs())
def test_dot_has_a_node_per_term_and_an_edge_per_argument(graph):
    g = ct.Graph(graph.outputs)
    dot = g.to_dot()
    assert dot.startswith("digraph cortado {") and dot.endswith("}")
    nodes = re.findall(r"^  (n\d+) \[label=", dot, re.M)
    edges = re.findall(r"^  (n\d+) -> (n\d+)", dot, re.M)
    assert len(nodes) == len(set(nodes)) == len(g.schedule)
    assert len(edges) == sum(len(t.args) for t in g.schedule)
    ids = {t: f"n{i}" for i, t in enumerate(g.schedule)}
    assert sorted(edges) == sorted((ids[a], ids[t]) for t in g.schedule for a in t.args)
    assert dot.count("peripheries=2") == len(set(g.outputs))
    assert dot.count("{") == dot.count("}") and dot.count('"') % 2 == 0


def test_dot_escapes_names():
    weird = ct.var('say "hi"\\', (1,))
    assert r'say \"hi\"\\' in ct.to_dot([weird + 1.0])
