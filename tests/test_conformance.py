"""Conformance: every op the strategies draw, forward and gradient, on every registered backend, against the
reference interpreter. A backend registered with ``cortado.backends.register`` is checked here by name, with nothing
else to write: each op sits in a small graph found by a seeded search (``cortado.testing.graphs`` restricted to that
op), fed values within the graph's bounds from a seeded generator, and its program's outputs and the gradients of
their sum are compared element by element (``reference_checks``)."""

import functools

import numpy as np
import pytest
from hypothesis import Phase, find, settings

from cortado.testing import ALL_OPS, graphs
from reference_checks import BACKENDS, check, skip_without_device, with_gradients


@functools.cache
def _graph_with(name):
    """A small graph of float32 and float64 values holding ``name``, the same on every run and hypothesis version."""
    return find(graphs(ops=[name], dtypes=("float32", "float64"), max_steps=4),
                lambda graph: any(step.fn == name for step in graph.steps),
                settings=settings(max_examples=500, database=None, derandomize=True, phases=[Phase.generate]))


def _feed(graph):
    """Values for ``graph``'s inputs within the bounds its steps were chosen for, from a seeded generator."""
    rng = np.random.default_rng(0)
    feed = {}
    for v in graph.inputs:
        lo, hi = graph.bounds[v.name]
        values = rng.uniform(lo, hi, v.shape).astype(v.dtype)
        feed[v.name] = np.clip(values, v.dtype.type(lo), v.dtype.type(hi)).astype(v.dtype)  # rounding stays inside
    return feed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ALL_OPS)
def test_every_op_and_its_gradient_on_every_backend(name, backend):
    skip_without_device(backend)
    graph = _graph_with(name)
    check(with_gradients(graph.outputs, graph.inputs), graph.inputs, _feed(graph), backend)
