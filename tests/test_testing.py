"""The public hypothesis strategies keep their promises: well-typed, bounded, replayable graphs."""

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from numpy_oracle import replay_numpy

import cortado as ct
from cortado.exprgraph.dtypes import finfo
from cortado import testing
from cortado.testing import ALL_OPS, LIMIT, feeds, graphs, graphs_with_feeds


@given(graphs_with_feeds())
def test_drawn_graphs_stay_finite_and_within_the_limit(case):
    graph, values = case
    for out in ct.evaluate(graph.outputs, values, precision="float64"):
        assert np.isfinite(out).all()
        assert np.abs(out).max(initial=0) <= LIMIT


@given(graphs_with_feeds(ops=["matmul", "add"], dtypes=("float64",), max_inputs=2))
def test_options_restrict_ops_and_dtypes(case):
    graph, values = case
    assert {s.fn for s in graph.steps} <= {"matmul", "add"}
    assert all(v.dtype == np.float64 for v in graph.inputs)
    assert set(values) == {v.name for v in graph.inputs} == {v.name for v in ct.Graph(graph.outputs).variables}


@pytest.mark.parametrize("name", ALL_OPS)
def test_every_op_is_drawn(name):
    """Each op can be drawn: the default strategy picks every step's op from ``ALL_OPS``, and restricted to this one
    it builds the op in a seeded, bounded search. The rarest op (conv) is in about one graph in ten, so 500 graphs
    find each whatever order a version of hypothesis draws them in; a miss means a builder that cannot fire."""

    def has_op(graph):
        return any(step.fn == name for step in graph.steps)

    found = find(graphs(ops=[name]), has_op,
                 settings=settings(max_examples=500, database=None, derandomize=True, phases=[Phase.generate]))
    assert has_op(found)


@given(graphs())
def test_repr_is_the_recipe(graph):
    text = repr(graph)
    assert text.count("\n") == len(graph.inputs) + len(graph.steps)
    assert text.splitlines()[-1].startswith("outputs: v")


@given(feeds([ct.var("a", (2, 3), "float32"), ct.var("n", (4,), "int32")], bounds=(-1, 1)))
def test_feeds_for_plain_variables(values):
    assert values["a"].shape == (2, 3) and values["a"].dtype == np.float32
    assert values["n"].dtype == np.int32 and np.abs(values["n"]).max() <= 1
    assert np.abs(values["a"]).max() <= 1


@pytest.mark.parametrize("table, name, told", [
    ("BUILDERS", "flip", "flip: it has no builder (add one to cortado.testing.BUILDERS, or list it in "
                         "cortado.testing.NOT_DRAWN"),
    ("UNARY_BOUNDS", "softplus", "softplus: it has no bounds (add them to cortado.testing.UNARY_BOUNDS"),
    ("BINARY_BOUNDS", "maximum", "maximum: it has no bounds (add them to cortado.testing.BINARY_BOUNDS)"),
    ("REDUCTION_BOUNDS", "mean", "mean: it has no bounds (add them to cortado.testing.REDUCTION_BOUNDS)"),
])
def test_an_op_without_its_builder_or_bounds_is_refused_naming_what_it_lacks(monkeypatch, table, name, told):
    """Before any draw: a draw would fail on a bare KeyError of the op's name."""
    monkeypatch.delitem(getattr(testing, table), name)
    for ops in ([name], None):
        with pytest.raises(ValueError) as refused:
            graphs(ops=ops)
        assert told in str(refused.value)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="cannot draw conv2d: it is no op of the table"):
        graphs(ops=["conv2d"])
    with pytest.raises(ValueError, match="floating"):
        graphs(dtypes=("int32",))
    with pytest.raises(ValueError, match=r"graphs: max_side=0; each is a whole number of at least 1"):
        graphs(max_side=0)


@settings(max_examples=30)
@given(st.data(), graphs(dtypes=("float64",)))
def test_feeds_keep_within_the_bounds_given_for_a_graph_too(data, graph):
    for value in data.draw(feeds(graph, bounds=(0.0, 1.0))).values():
        assert ((value >= 0.0) & (value <= 1.0)).all()


@given(graphs_with_feeds(ops=["sigmoid", "softmax", "einsum"]))
def test_replay_runs_any_namespace(case):
    graph, values = case
    assert len(replay_numpy(graph, values)) == len(graph.outputs)


@settings(max_examples=50)
@given(graphs(ops=["einsum", "broadcast_to"], max_rank=5))
def test_high_rank_values_do_not_break_the_builders(graph):
    assert all(0 <= t.ndim for t in graph.outputs)


@pytest.mark.parametrize("dtype, bounds", [("uint8", (-2, 2)), ("float32", (0.1, 1.0)), ("float16", (-1e5, 1e5)),
                                          ("bfloat16", (0.1, 1e39))])
def test_feed_bounds_are_fitted_to_the_dtype(dtype, bounds):
    @settings(max_examples=20, database=None)
    @given(feeds([ct.var("v", (4,), dtype)], bounds=bounds))
    def check(values):
        v = values["v"]
        assert v.dtype == np.dtype(dtype)
        info = np.iinfo(dtype) if v.dtype.kind in "iu" else finfo(v.dtype)
        wide = v.astype(np.float64)
        assert np.isfinite(wide).all()
        assert (wide >= max(bounds[0], float(info.min))).all() and (wide <= min(bounds[1], float(info.max))).all()

    check()


def test_empty_integer_bounds_are_refused():
    with pytest.raises(ValueError, match="no int8 value lies in"):
        feeds([ct.var("i", (2,), "int8")], bounds=(0.5, 0.9))
