"""Property-test your own backend against cortado's reference, the way cortado tests itself.

    python -m pytest examples/property_test.py

The "backend" here is a tiny interpreter written by hand over a few ops; swap in your own.
"""

import numpy as np
from hypothesis import given

import cortado as ct
from cortado.testing import graphs_with_feeds

MY_OPS = {
    "add": np.add,
    "multiply": np.multiply,
    "tanh": np.tanh,
    "exp": np.exp,
    "sum": lambda x, axes, keepdims: np.sum(x, axis=axes, keepdims=keepdims),
    "matmul": np.matmul,
}


def my_backend(outputs, feeds):
    """Evaluate terms with MY_OPS, walking cortado's schedule: the shape of every real backend."""
    values = {}
    for term in ct.schedule(outputs):
        if term.op.name == "var":
            values[term] = feeds[term.name]
        elif term.op.name == "const":
            values[term] = term.attr("value").array
        else:
            args = [values[a] for a in term.args]
            values[term] = np.asarray(MY_OPS[term.op.name](*args, *term.attrs), dtype=term.dtype)
    return [values[o] for o in outputs]


@given(graphs_with_feeds(ops=list(MY_OPS), dtypes=("float64",), max_steps=6))
def test_my_backend_matches_the_reference(case):
    graph, feeds = case
    expected = ct.evaluate(graph.outputs, feeds)
    for ours, reference in zip(my_backend(graph.outputs, feeds), expected):
        np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=1e-12)
