"""NumPy's axis helpers and filled tensors (cortado.exprgraph.shaping): NumPy's values and shapes for every axis
form, gradients through them, and errors that name the call."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.gradcheck import check_grads

shapes = st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple)


def _value(shape):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 2.5


@settings(max_examples=60, deadline=None)
@given(shapes, st.data())
def test_axis_helpers_give_numpys_values(shape, data):
    x, value = ct.var("x", shape), _value(shape)
    rank = len(shape)
    new = data.draw(st.lists(st.integers(-rank - 2, rank + 1), min_size=1, max_size=2, unique_by=lambda a: a % (rank + 2))
                    .filter(lambda axes: len({a % (rank + len(axes)) for a in axes}) == len(axes)
                            and all(-rank - len(axes) <= a < rank + len(axes) for a in axes)))
    one, other = data.draw(st.integers(-rank, rank - 1)), data.draw(st.integers(-rank, rank - 1))
    moved = data.draw(st.permutations(range(rank)))[: data.draw(st.integers(1, rank))]
    places = data.draw(st.permutations(range(rank)))[: len(moved)]
    cases = [
        (ct.expand_dims(x, tuple(new)), np.expand_dims(value, tuple(new))),
        (ct.squeeze(x), np.squeeze(value)),
        (ct.swapaxes(x, one, other), np.swapaxes(value, one, other)),
        (ct.moveaxis(x, moved, places), np.moveaxis(value, moved, places)),
        (ct.stack([x, 2 * x, -x], axis=one), np.stack([value, 2 * value, -value], axis=one)),
        (ct.stack([x, x], axis=-1), np.stack([value, value], axis=-1)),
    ]
    for term, expected in cases:
        got = ct.evaluate(term, {"x": value})
        assert got.shape == expected.shape and term.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_gradients_pass_through_the_axis_helpers():
    x, y = ct.var("x", (2, 1, 3), "float64"), ct.var("y", (2, 1, 3), "float64")
    weights = ct.const(np.linspace(-1, 1, 18).reshape(3, 1, 3, 2))  # swapped to (2, 1, 3, 3)
    loss = ct.sum(ct.moveaxis(ct.stack([x, ct.tanh(y), x * y], axis=0), 0, 2) ** 2 * ct.swapaxes(weights, 0, 3))
    rng = np.random.default_rng(0)
    at = {"x": rng.standard_normal((2, 1, 3)), "y": rng.standard_normal((2, 1, 3))}
    assert check_grads(loss, [x, y], at).error < 1e-7


def test_filled_tensors_are_one_broadcast_scalar_of_numpys_dtypes():
    x = ct.var("x", (2, 3), "bfloat16")
    cases = [(ct.zeros((2, 3)), np.zeros((2, 3), np.float32)), (ct.ones(4, "int8"), np.ones(4, np.int8)),
             (ct.full((2,), 1.5), np.full((2,), 1.5)), (ct.zeros_like(x), np.zeros((2, 3), x.dtype)),
             (ct.ones_like(x, "float32"), np.ones((2, 3), np.float32)),
             (ct.full_like(x, 7, "int32"), np.full((2, 3), 7, np.int32)),
             (ct.arange(5), np.arange(5)), (ct.arange(1, 7, 2, "float32"), np.arange(1, 7, 2, dtype=np.float32)),
             (ct.arange(5, step=2), np.arange(0, 5, 2)),  # (a stop alone with a step: the step was dropped)
             (ct.arange(0, 1, 0.1, dtype="float32"), np.arange(0, 1, 0.1).astype(np.float32))]  # rounded, as NumPy
    for term, expected in cases:
        got = ct.evaluate(term, {})
        assert got.dtype == expected.dtype and term.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    assert ct.zeros((1000, 1000)).op.name == "broadcast_to"  # no dense constant of a million zeros


@pytest.mark.parametrize("make, message", [
    (lambda x: ct.squeeze(x, 0), r"squeeze\(float32\[2,1,3\]\): axis 0 has size 2: only axes of size 1"),
    (lambda x: ct.expand_dims(x, 5), r"expand_dims\(float32\[2,1,3\]\): axis 5 is out of range for a tensor of rank 4"),
    (lambda x: ct.expand_dims(x, None), "axis is an int or a tuple of ints, not None"),
    (lambda x: ct.stack([x, ct.var("y", (2, 3))]), r"stack\(.*\): the tensors must have one shape"),
    (lambda x: ct.stack([]), "takes a non-empty list or tuple of tensors"),
    (lambda x: ct.stack([x, x], 4), r"stack\(arrays=.*axis=4\): axis 4 is out of range"),  # the call, as written
    (lambda x: ct.moveaxis(x, 0, (1, 2)), "name different numbers of axes"),
    (lambda x: ct.moveaxis(x, (0, 0), (1, 2)), r"repeated axis in \[0, 0\]"),
    (lambda x: ct.swapaxes(x, 0, 3), "axis 3 is out of range for a tensor of rank 3"),
])
def test_axis_helpers_refuse_what_numpy_refuses_naming_the_call(make, message):
    with pytest.raises(ct.ShapeError, match=message):
        make(ct.var("x", (2, 1, 3)))


@pytest.mark.parametrize("make, error, message", [
    (lambda: ct.full((2,), 300, "int8"), ct.DTypeError, "Python integer 300 out of bounds for int8"),
    (lambda: ct.arange(0, 10, 0), ct.ShapeError, "step is not 0"),
    (lambda: ct.arange(0, np.inf), ct.ShapeError, "start, stop and step are finite"),
    (lambda: ct.arange("a"), ct.ShapeError, "start, stop and step are numbers"),
    (lambda: ct.arange(0, 300, dtype="int8"), ct.DTypeError, "int8 cannot hold the values from 0 to 299"),
])
def test_filled_tensors_refuse_values_their_dtype_cannot_hold_where_numpy_wraps_or_fails_inside(make, error, message):
    with pytest.raises(error, match=message):
        make()
