"""Terms: hash-consing, immutability, the interning table's lifetime, operators, deep graphs."""

import gc
import sys

import numpy as np
import pytest
from hypothesis import given

import cortado as ct
from cortado.exprgraph import interned_count
from cortado.testing import graphs


def test_equal_constructions_are_identical():
    x = ct.var("x", (3, 4))
    W = ct.var("W", (4, 2))
    assert ct.var("x", (3, 4)) is not x  # each declaration is a variable of its own
    assert (x @ W + 1.0) is (x @ W + 1.0)
    assert ct.sum(x, axis=1) is ct.sum(x, axis=-1) is ct.sum(x, axis=(1,))
    assert ct.transpose(x) is ct.transpose(x, (1, 0)) is x.T
    assert ct.reshape(x, (-1,)) is ct.reshape(x, 12)
    assert ct.einsum("ij,jk", x, W) is ct.einsum("ab , bc -> ac", x, W)
    assert ct.const(np.arange(3)) is ct.const(np.arange(3))
    assert ct.var("x", (3, 4), "float64") is not x


@given(graphs())
def test_rebuilding_a_random_graph_gives_the_same_terms(graph):
    rebuilt = graph.replay(ct, {v.name: v for v in graph.inputs})
    assert all(a is b for a, b in zip(rebuilt, graph.outputs))
    for term in ct.schedule(graph.outputs):
        assert term.rebuild(term.args) is term


def test_constants_compare_by_dtype_shape_and_bits():
    assert ct.const(0.0) is not ct.const(-0.0)
    assert ct.const(np.float32(np.nan)) is ct.const(np.float32(np.nan))
    assert ct.const(np.arange(3, dtype=np.int32)) is not ct.const(np.arange(3, dtype=np.int64))
    assert ct.const(np.zeros((2, 3))) is not ct.const(np.zeros((3, 2)))
    assert ct.const(2.0) is not ct.const(2.0, dtype="float64")  # weak versus strong


def test_terms_are_immutable_and_cannot_be_built_directly():
    x = ct.var("x", (2,))
    with pytest.raises(AttributeError):
        x.shape = (3,)
    with pytest.raises(TypeError):
        ct.Term()
    with pytest.raises(TypeError, match="truth value"):
        bool(x > 0)
    value = ct.const(np.ones(3)).attrs[0].array
    with pytest.raises(ValueError):
        value[0] = 5.0


def test_constants_copy_their_value():
    source = np.ones(3)
    c = ct.const(source)
    source[0] = 7.0
    assert ct.evaluate(c, {})[0] == 1.0


def _build_and_drop(n):
    x = ct.var("leak_probe_x", (n,))
    t = x
    for k in range(200):
        t = ct.tanh(t * float(k) + np.full(n, k, dtype=np.float32))
    return ct.sum(t).shape


def test_the_interning_table_frees_unreferenced_terms():
    gc.collect()
    before = interned_count()
    _build_and_drop(7)
    gc.collect()
    assert interned_count() == before


def test_a_kept_term_keeps_exactly_its_subgraph():
    gc.collect()
    before = interned_count()
    x = ct.var("keep_probe", (3,))
    kept = ct.exp(x) + 1.0
    ct.log(kept) * 2.0  # dropped at once
    gc.collect()
    alive = interned_count() - before
    assert alive == len(ct.schedule(kept))  # x, exp, the constant 1.0, add
    del kept, x
    gc.collect()
    assert interned_count() == before


def test_a_chain_of_100k_terms_builds_schedules_evaluates_and_frees():
    gc.collect()
    before = interned_count()
    x = ct.var("deep", ())
    t = x
    for _ in range(100_000):
        t = t + 1.0
    assert len(ct.schedule(t)) == 100_002  # x, the constant, 100k additions
    assert sys.getrecursionlimit() < 100_000  # so the walks above cannot have recursed
    assert ct.evaluate(t, {"deep": np.float32(0.5)}) == np.float32(100_000.5)
    del t, x
    gc.collect()
    assert interned_count() == before


def test_operators_follow_numpy_and_mix_with_arrays():
    x = ct.var("x", (2, 3))
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    feeds = {"x": a + 1}
    exprs = {
        "x + a": (x + a, (a + 1) + a), "a + x": (a + x, a + (a + 1)), "a - x": (a - x, a - (a + 1)),
        "a * x": (a * x, a * (a + 1)), "a / x": (a / x, a / (a + 1)), "2 ** x": (2 ** x, 2 ** (a + 1)),
        "-x": (-x, -(a + 1)), "+x": (+x, a + 1), "abs(-x)": (abs(-x), a + 1),
        "x < 3": (x < 3, (a + 1) < 3), "x >= a": (x >= a, (a + 1) >= a), "x.T @ x": (x.T @ x, (a + 1).T @ (a + 1)),
        "a.T @ x": (a.T @ x, a.T @ (a + 1)), "x.sum(0)": (x.sum(0), (a + 1).sum(0)),
        "x.reshape(3, 2)": (x.reshape(3, 2), (a + 1).reshape(3, 2)), "x.astype": (x.astype("int32"), (a + 1).astype("int32")),
    }
    for label, (term, expected) in exprs.items():
        got = ct.evaluate(term, feeds)
        assert got.dtype == expected.dtype, label
        np.testing.assert_array_equal(got, expected, err_msg=label)


def test_equality_operators_are_identity_so_terms_are_dict_keys():
    x, y = ct.var("x", (2,)), ct.var("y", (2,))
    assert bool(x == x) is True and bool(x == y) is False and bool(x != y) is True
    table = {x: 1, y: 2}
    assert table[x] == 1 and ct.var("x", (2,)) not in table
    assert ct.evaluate(ct.equal(x, y), {"x": np.ones(2, "f4"), "y": np.ones(2, "f4")}).all()
    assert (x == None) is False and (x != "x") is True  # noqa: E711 (what is no number stays plain inequality)


@pytest.mark.parametrize("other", [0, 0.5, np.float32(1), np.zeros(2, "f4"), True, [0, 1]])
def test_a_term_compared_with_a_number_or_an_array_is_refused_not_answered_false(other):
    """NumPy's habit, ``ct.where(x == 0, ...)``, would otherwise take the answer ``False`` for a constant condition
    and give a wrong result without a word."""
    x = ct.var("x", (2,))
    with pytest.raises(TypeError, match=r"`==` on a term is identity .* use ct\.equal\(x, y\)"):
        ct.where(x == other, 1.0, x)
    with pytest.raises(TypeError, match=r"use ct\.not_equal"):
        _ = other != x


def test_what_eq_between_two_terms_gives_is_refused_by_every_op_and_by_arithmetic():
    """``ct.where(x == y, x, y)`` was ``where(False, x, y)``: always ``y``, and an accuracy
    ``ct.mean(ct.cast(x == y, "float32"))`` or ``ct.sum(mask * (pred == labels))`` always 0, without a word. ``==``
    between terms gives an ``Identity``, a bool to ``if`` and to dicts, refused as an operand or a number."""
    x, y = ct.var("x", (2,)), ct.var("y", (2,))
    assert bool(x == x) and not bool(x == y) and {x: 1}[x] == 1 and repr(x == y) == "False"
    refused = r"an operand is False, which == or != between two terms gives: .* ct.equal\(x, y\)"
    for build in (lambda: ct.where(x == y, x, y), lambda: ct.cast(x == y, "float32"), lambda: ct.sum(x == y),
                  lambda: x * (x == y), lambda: ct.maximum(x, x == y)):
        with pytest.raises(ct.DTypeError, match=refused):
            build()
    for build in (lambda: 1 * (x == y), lambda: ct.mean(1.0 * (x == y)), lambda: np.ones(2) * (x == y)):
        with pytest.raises(TypeError, match="False here is what == or != between two terms gives"):
            build()
    rows, labels = ct.var("rows", (4, 3)), ct.var("labels", (4,), "int64")
    with pytest.raises(ct.ShapeError, match="only ints, slices"):  # an int would have taken row 0
        _ = rows[labels == labels[::-1]]
    with pytest.raises(ct.ShapeError, match="must be an int or a tuple of ints"):
        ct.sum(rows, axis=(x == y))
    flag = True  # a flag of one's own is a number, as in NumPy
    assert ct.evaluate(x * flag, {"x": np.ones(2, "f4")}).tolist() == [1.0, 1.0]
    assert ct.evaluate(ct.where(np.bool_(True), x, y), {"x": np.ones(2, "f4"), "y": np.zeros(2, "f4")}).all()


def test_users_and_schedule_order():
    x, W = ct.var("x", (2, 3)), ct.var("W", (3, 3))
    h = x @ W
    out = h * h + ct.sum(h)
    g = ct.Graph(out)
    position = {t: i for i, t in enumerate(g.schedule)}
    assert all(position[a] < position[t] for t in g.schedule for a in t.args)
    assert sorted((position[u], k) for u, k in g.users[h]) == sorted(
        [(position[h * h], 0), (position[h * h], 1), (position[ct.sum(h)], 0)])
    assert g.users[out] == [] and g.variables == [x, W]
    assert g.variables_by_name() == {"x": x, "W": W}


def test_interning_is_safe_across_threads():
    import threading

    results = []
    x = ct.var("threaded", (5,))

    def build():
        results.append(ct.tanh(x * 3.0 + 1.0))

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results)
