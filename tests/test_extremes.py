"""``ct.min``, ``ct.clip``, ``ct.argmax`` and ``ct.argmin`` against NumPy's: the smallest value and the first index
of the extreme, NaN counted the extreme, ties, the extremes of integer types, every axis and ``keepdims``, evaluated
by the reference and compiled on each backend."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cortado as ct
from reference_checks import BACKENDS, host, skip_without_device

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "uint8", "uint32", "bool"]


@st.composite
def cases(draw):
    """A value of a few axes, drawn from a handful of numbers so that ties are common, with the type's extremes,
    infinities and NaNs among them; an axis (or None) and keepdims."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    if dtype == "bool":
        pool = [False, True]
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        pool = [info.min, info.max, 0, 1, info.min + 1, info.max - 1]
    else:
        pool = [0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan]
    picks = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(pool) - 1)))
    kind = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    value = np.array(pool, dtype=np.float64 if dtype not in ("bool",) and not dtype.startswith(("int", "uint"))
                     else dtype)[picks].astype(kind)
    axis = draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
    return value, dtype, axis, draw(st.booleans())


def _numpy(function, value, axis, keepdims):
    wide = value.astype(np.float64) if value.dtype == ml_dtypes.bfloat16 else value  # NumPy orders bfloat16 by bits
    return getattr(np, function)(wide, axis=axis, keepdims=keepdims)


@settings(max_examples=150, deadline=None)
@given(cases(), st.sampled_from(["argmax", "argmin"]))
def test_the_first_extremes_index_as_numpy_gives_it(case, function):
    value, dtype, axis, keepdims = case
    x = ct.var("x", value.shape, dtype)
    got = ct.evaluate(getattr(ct, function)(x, axis=axis, keepdims=keepdims), {"x": value})
    expected = _numpy(function, value, axis, keepdims)
    assert got.dtype == np.int64 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_the_smallest_value_as_numpy_gives_it(case):
    value, dtype, axis, keepdims = case
    x = ct.var("x", value.shape, dtype)
    got = ct.evaluate(ct.min(x, axis=axis, keepdims=keepdims), {"x": value})
    expected = _numpy("min", value, axis, keepdims)
    assert got.dtype == value.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(got, expected.dtype), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_and_clip_compiled_with_min_gradient_split_among_ties(backend):
    """``min`` over rows and ``clip`` compiled, the integer type's smallest value kept (negating it would overflow),
    and ``min``'s gradient split evenly among a row's tied smallest values, as ``max``'s is."""
    skip_without_device(backend)
    x, n = ct.var("x", (3, 4)), ct.var("n", (4,), "int8")
    (gradient,) = ct.grad(ct.sum(ct.min(x, axis=1)), [x])
    program = ct.compile([ct.min(x, axis=1), ct.clip(x, -1.0, 2.0), ct.min(n), gradient], inputs=[x, n],
                         backend=backend)
    values = np.array([[3, -2, 5, -2], [np.nan, 1, 0, 4], [7, 0.5, 9, 8]], np.float32)
    small = np.array([5, -128, 127, 0], np.int8)
    feeds = {"x": values, "n": small}
    if backend == "cupy":
        import cupy

        feeds = {name: cupy.asarray(v) for name, v in feeds.items()}
    least, clipped, smallest, grad = (host(r) for r in program(**feeds))
    np.testing.assert_array_equal(least, np.min(values, axis=1))
    np.testing.assert_array_equal(clipped, np.clip(values, -1.0, 2.0))
    assert smallest == -128
    np.testing.assert_array_equal(grad[0], [0, 0.5, 0, 0.5])
    np.testing.assert_array_equal(grad[2], [0, 1, 0, 0])


def test_clip_needs_a_bound():
    with pytest.raises(ct.ShapeError, match="clip: give low, high or both"):
        ct.clip(ct.var("x", (2,)), None, None)
    assert ct.evaluate(ct.clip(ct.var("x", (3,)), None, 0.0), {"x": np.array([-1, 0.5, 2], np.float32)}).tolist() \
        == [-1, 0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compiled_accuracy_counts_the_rows_whose_largest_logit_is_the_label(backend):
    """The batch's accuracy as a step computes it: ties and a NaN row included, as NumPy counts them."""
    skip_without_device(backend)
    logits, labels = ct.var("logits", (6, 4)), ct.var("labels", (6,), "int32")
    accuracy = ct.mean(ct.cast(ct.equal(ct.argmax(logits, axis=-1), labels), "float32"))
    program = ct.compile([accuracy, ct.argmin(logits, axis=0)], inputs=[logits, labels], backend=backend)
    values = np.array([[0, 3, 3, 1], [2, 2, 2, 2], [np.nan, 1, 9, 9], [-1, -5, -5, -np.inf], [7, 0, 7, 1],
                       [0, 0, 1, np.nan]], np.float32)
    labels_given = np.array([1, 0, 0, 1, 0, 3], np.int32)  # the fourth row is wrong
    feeds = {"logits": values, "labels": labels_given}
    if backend == "cupy":
        import cupy

        feeds = {name: cupy.asarray(v) for name, v in feeds.items()}
    got, least = program(**feeds)
    assert host(got) == np.float32(5 / 6) == np.mean(np.argmax(values, -1) == labels_given, dtype=np.float32)
    np.testing.assert_array_equal(host(least), np.argmin(values, axis=0))


def test_an_argmax_over_nothing_or_past_the_axes_is_refused_as_the_call_written():
    with pytest.raises(ct.ShapeError, match=r"argmax\(float32\[2,0\], axis=1\): cannot reduce over axis 1, which has "
                                            r"size 0"):
        ct.argmax(ct.var("x", (2, 0)), axis=1)
    with pytest.raises(ct.ShapeError, match=r"argmin\(float32\[2,3\], axis=2\): axis 2 is out of range"):
        ct.argmin(ct.var("x", (2, 3)), axis=2)
    with pytest.raises(ct.ShapeError, match=r"argmax: axis is one int, or None for the flattened value \(NumPy's\), "
                                            r"not \(0, 1\)"):
        ct.argmax(ct.var("x", (2, 3)), axis=(0, 1))
