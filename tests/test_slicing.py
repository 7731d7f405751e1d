"""Basic indexing (``x[...]``), ``ct.concatenate`` and ``ct.split``: against NumPy's own on random shapes, keys and
dtypes, in the reference and compiled for the CPU; their gradients (zeros where a slice took nothing), to second
order; their errors; and, on a GPU, the cupy backend against the numpy backend."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.gradcheck import check_grads

DTYPES = ["float32", "float64", "int32", "bool", "bfloat16"]
MIXABLE = [["float32", "float64", "int32", "bool"], ["bfloat16", "float32", "bool"]]  # each has a common dtype
LOWERED_TO = {"var", "pad", "flip", "windows", "reshape"}


def values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return (rng.standard_normal(shape) * 10).astype(BFLOAT16 if dtype == "bfloat16" else dtype)


def assert_same(ours, expected):
    assert ours.shape == expected.shape and ours.dtype == expected.dtype
    np.testing.assert_array_equal(ours.astype(np.float64), expected.astype(np.float64))


def both_ways(outputs, inputs, feeds):
    """The outputs' values by the reference interpreter and by a program compiled for the CPU (fed the inputs that
    the outputs read: an empty operand of concatenate, or an index that takes everything, leaves some unread)."""
    read = {t.name for t in ct.schedule(outputs) if t.op.name == "var"}
    inputs = [x for x in inputs if x.name in read]
    feeds = {name: value for name, value in feeds.items() if name in read}
    program = ct.compile(outputs, inputs=inputs, backend="numpy")
    return ct.evaluate(outputs, feeds), program(**feeds)


def ops_of(term):
    return {t.op.name for t in ct.schedule(term)}


# -- strategies ------------------------------------------------------------------------------

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def bounds(size):
    return st.none() | st.integers(-size - 2, size + 2)


def entries(size):
    """One index of an axis of ``size``: an int (negative ones too) or a slice with any start, stop and step."""
    steps = st.none() | st.integers(-4, 4).filter(bool)
    sliced = st.builds(slice, bounds(size), bounds(size), steps)
    return (st.integers(-size, size - 1) | sliced) if size else sliced


@st.composite
def keys(draw, shape):
    """A basic index of a tensor of ``shape``: some leading axes (or an ellipsis and some trailing ones) indexed,
    with ``None``s among them; a lone entry sometimes unwrapped from its tuple."""
    count = draw(st.integers(0, len(shape)))
    ellipsis = draw(st.booleans())
    axes = shape[len(shape) - count:] if ellipsis else shape[:count]
    key = [draw(entries(size)) for size in axes]
    for _ in range(draw(st.integers(0, 2))):
        key.insert(draw(st.integers(0, len(key))), None)
    if ellipsis:  # before the first entry, so that the entries index the trailing axes
        first = next((i for i, entry in enumerate(key) if entry is not None), len(key))
        key.insert(draw(st.integers(0, first)), Ellipsis)
    return key[0] if len(key) == 1 and draw(st.booleans()) else tuple(key)


@st.composite
def indexed(draw, dtypes=DTYPES):
    shape = draw(shapes)
    return shape, draw(st.sampled_from(dtypes)), draw(keys(shape))


# -- indexing against NumPy ------------------------------------------------------------------


@settings(max_examples=100)
@given(indexed(), st.integers(0, 2**32 - 1))
def test_indexing_is_numpys_in_the_reference_and_compiled(case, seed):
    shape, dtype, key = case
    x = ct.var("x", shape, dtype)
    xv = values(shape, dtype, seed)
    y = x[key]
    expected = xv[key]
    assert y.shape == expected.shape and y.dtype == xv.dtype
    assert ops_of(y) <= LOWERED_TO
    (reference,), (compiled,) = both_ways([y], [x], {"x": xv})
    assert_same(reference, expected)
    assert_same(compiled, expected)


@pytest.mark.parametrize("key", [np.s_[:], np.s_[...], np.s_[:, :], np.s_[0:3, ::1], np.s_[-9:9], np.s_[..., :]],
                         ids=repr)
def test_an_index_that_takes_everything_is_the_term_itself(key):
    x = ct.var("x", (3, 4))
    assert x[key] is x


def test_each_kind_of_index_lowers_to_the_ops_it_needs():
    x = ct.var("x", (6, 5))
    assert ops_of(x[1:4]) == {"var", "pad"}
    assert ops_of(x[::-1]) == {"var", "flip"}
    assert ops_of(x[None]) == ops_of(x[None, :, None]) == {"var", "reshape"}
    assert ops_of(x[2]) == {"var", "pad", "reshape"}
    assert ops_of(x[:, ::2]) == {"var", "windows", "reshape"}  # its steps end on the last element: nothing to crop
    assert ops_of(x[:, 1::2]) == {"var", "pad", "windows", "reshape"}
    assert ops_of(x[::-2, 1]) == LOWERED_TO


# -- concatenate and split against NumPy -------------------------------------------------------


@st.composite
def concatenations(draw):
    """Operands of one rank that agree off ``axis`` (lengths along it from 0), of dtypes with a common one."""
    ndim = draw(st.integers(1, 3))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape = list(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    dtypes = draw(st.sampled_from(MIXABLE))
    operands = []
    for _ in range(draw(st.integers(1, 4))):
        shape[axis] = draw(st.integers(0, 4))
        operands.append((tuple(shape), draw(st.sampled_from(dtypes))))
    return operands, axis


@settings(max_examples=80)
@given(concatenations(), st.integers(0, 2**32 - 1))
def test_concatenate_is_numpys_in_the_reference_and_compiled(case, seed):
    operands, axis = case
    xs = [ct.var(f"x{i}", shape, dtype) for i, (shape, dtype) in enumerate(operands)]
    feeds = {x.name: values(x.shape, x.dtype.name, seed + i) for i, x in enumerate(xs)}
    y = ct.concatenate(xs, axis=axis)
    expected = np.concatenate(list(feeds.values()), axis=axis)
    assert y.shape == expected.shape and y.dtype == expected.dtype
    (reference,), (compiled,) = both_ways([y], xs, feeds)
    assert_same(reference, expected)
    assert_same(compiled, expected)


def test_concatenate_takes_arrays_flattens_with_axis_none_and_one_operand_is_itself():
    x = ct.var("x", (2, 3), "float64")
    xv, constant = values((2, 3), "float64", 0), np.arange(6.0).reshape(2, 3)
    assert ct.concatenate([x]) is x and ct.concatenate((x,), axis=-1) is x
    joined = ct.concatenate([x, constant], axis=1)
    np.testing.assert_array_equal(ct.evaluate(joined, {"x": xv}), np.concatenate([xv, constant], axis=1))
    flat = ct.concatenate([x, ct.var("s", (), "int32")], axis=None)
    feeds = {"x": xv, "s": np.array(7, np.int32)}
    assert_same(ct.evaluate(flat, feeds), np.concatenate([xv, feeds["s"]], axis=None))


def test_concatenate_keeps_negative_zeros_and_zero_d_ints_count_as_ints():
    a, b = ct.var("a", (2,)), ct.var("b", (1,))
    feeds = {"a": np.float32([-0.0, 1.0]), "b": np.float32([-0.0])}
    for joined in both_ways([ct.concatenate([a, b])], [a, b], feeds):
        np.testing.assert_array_equal(np.signbit(joined[0]), [True, False, True])
    assert [p.shape for p in ct.split(ct.var("s", (6,)), np.array(3))] == [(2,), (2,), (2,)]
    assert x[np.array(1)].shape == (4,) and x[:, np.int64(-1)].shape == (3,)


@st.composite
def splits(draw):
    """A shape, an axis, and an int that divides it or a list of points anywhere from before the start to past the
    end (NumPy's slices cut there)."""
    shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[axis]
    divisors = [k for k in range(1, 7) if size % k == 0]
    points = st.lists(st.integers(-size - 2, size + 2), max_size=4)
    return shape, axis, draw(st.sampled_from(divisors) | points)


@settings(max_examples=80)
@given(splits(), st.sampled_from(DTYPES), st.integers(0, 2**32 - 1))
def test_split_is_numpys_in_the_reference_and_compiled(case, dtype, seed):
    shape, axis, cuts = case
    x = ct.var("x", shape, dtype)
    xv = values(shape, dtype, seed)
    pieces = ct.split(x, cuts, axis=axis)
    expected = np.split(xv, cuts, axis=axis)
    assert [p.shape for p in pieces] == [e.shape for e in expected]
    references, compiled = both_ways(pieces, [x], {"x": xv})
    for ours, theirs, piece in zip(references, expected, compiled):
        assert_same(ours, theirs)
        assert_same(piece, theirs)


def test_split_into_one_piece_is_the_term_itself():
    x = ct.var("x", (4, 3))
    assert ct.split(x, 1) == [x] and ct.split(x, [], axis=1) == [x]


# -- gradients -------------------------------------------------------------------------------

GRADIENT_KEYS = [np.s_[1:4], np.s_[::-1], np.s_[::2, 1], np.s_[-1, ::-2], np.s_[None, 4:0:-3, ..., None],
                 np.s_[..., 1::2], np.s_[-2:, None, :2]]


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("key", GRADIENT_KEYS, ids=repr)
def test_gradients_of_slices_to_second_order(key, order):
    x = ct.var("x", (5, 4), "float64")
    check_grads(ct.tanh(x[key]), x, {"x": values((5, 4), "float64", 0) / 10}, order=order)


@pytest.mark.parametrize("order", [1, 2])
def test_gradients_of_concatenate_and_split_to_second_order(order):
    a, b = ct.var("a", (2, 3), "float64"), ct.var("b", (2, 1), "float64")
    feeds = {"a": values((2, 3), "float64", 1) / 10, "b": values((2, 1), "float64", 2) / 10}
    joined = ct.concatenate([a, ct.tanh(b), a * a], axis=-1)
    check_grads(ct.tanh(joined), [a, b], feeds, order=order)
    first, _, last = ct.split(joined, [2, 1], axis=1)
    check_grads(ct.tanh(first) * ct.sum(last), [a, b], feeds, order=order)


@settings(max_examples=60)
@given(indexed(dtypes=["float32", "float64"]), st.integers(0, 2**32 - 1))
def test_the_gradient_of_a_slice_puts_the_adjoint_where_it_took_and_zeros_elsewhere(case, seed):
    shape, dtype, key = case
    a = ct.var("a", shape, dtype)
    w = ct.var("w", a[key].shape, dtype)
    feeds = {"a": values(shape, dtype, seed), "w": values(w.shape, dtype, seed + 1)}
    expected = np.zeros_like(feeds["a"])
    expected[key] += feeds["w"]
    (gradient,) = ct.grad(ct.sum(a[key] * w), [a])
    (reference,), (compiled,) = both_ways([gradient], [a, w], feeds)
    assert_same(reference, expected)
    assert_same(compiled, expected)


# -- errors ----------------------------------------------------------------------------------

x = ct.var("x", (3, 4))

ERRORS = {
    "int out of range": (lambda: x[3], r"float32\[3,4\]\[3\]: index 3 is out of bounds for axis 0 with size 3"),
    "negative int out of range": (lambda: x[:, -5], r"index -5 is out of bounds for axis 1 with size 4"),
    "too many indices": (lambda: x[0, 1, 2], r"too many indices: the tensor has 2 dimension\(s\), but 3 were indexed"),
    "two ellipses": (lambda: x[..., 0, ...], r"a single ellipsis"),
    "list": (lambda: x[[0, 2]], r"advanced indexing\) is not supported; .*ct\.take\(.*ct\.take_along_axis\("),
    "array": (lambda: x[:, np.array([1, 2])], r"advanced indexing.*ct\.take_along_axis"),
    "term": (lambda: x[ct.var("i", (2,), "int64")], r"float32\[3,4\]\[int64\[2\]\]: .*advanced indexing.*ct\.take"),
    "bool": (lambda: x[True], r"a bool index .* is not supported; select with ct\.where, .*ct\.take"),
    "float": (lambda: x[1.0], r"only ints, slices .* are valid indices, not 1\.0"),
    "zero step": (lambda: x[::0], r"slice step cannot be zero"),
    "mismatched shapes": (lambda: ct.concatenate([x, ct.var("y", (2, 3))]),
                          r"concatenate\(float32\[3,4\], float32\[2,3\]\): the shapes \(3, 4\), \(2, 3\) must agree"),
    "mismatched ranks": (lambda: ct.concatenate([x, ct.var("v", (4,))]), r"same number of dimensions, not \[1, 2\]"),
    "nothing": (lambda: ct.concatenate([]), r"concatenate: needs at least one tensor"),
    "not a list": (lambda: ct.concatenate(x), r"takes a list or tuple of tensors, not float32\[3,4\]"),
    "scalars": (lambda: ct.concatenate([ct.var("s", ())]), r"zero-dimensional tensors cannot be concatenated"),
    "bad axis": (lambda: ct.concatenate([x, x], axis=2), r"concatenate\(.*\): axis 2 is out of range for a tensor of rank 2"),
    "no common dtype": (lambda: ct.concatenate([ct.var("b", (2,), "bfloat16"), ct.var("h", (2,), "float16")]),
                        r"no common dtype for bfloat16 and float16"),
    "sections": (lambda: ct.split(x, 3, axis=1), r"split\(float32\[3,4\]\): 3 sections do not divide the axis of length 4"),
    "no sections": (lambda: ct.split(x, 0), r"the number of sections must be at least 1"),
    "split axis": (lambda: ct.split(x, 2, axis=-3), r"axis -3 is out of range"),
    "split by a term": (lambda: ct.split(x, ct.var("p", (2,), "int64")), r"split points must be known"),
}


@pytest.mark.parametrize("build, message", ERRORS.values(), ids=ERRORS.keys())
def test_errors_name_what_was_wrong_and_where(build, message):
    with pytest.raises(ct.CortadoError, match=message) as info:
        build()
    assert "built at " in str(info.value) and "test_slicing.py:" in str(info.value)


def test_terms_are_not_iterable():
    with pytest.raises(TypeError, match="not iterable; index it"):
        list(x)


# -- the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_slices_concatenate_and_split_on_the_gpu_match_the_numpy_backend():
    a, b = ct.var("a", (6, 5, 4), "float64"), ct.var("b", (6, 2, 4), "float64")  # float64: exact but for sums' order
    left, right = ct.split(ct.concatenate([a[:, ::-1], b], axis=1), [3], axis=1)
    y = ct.tanh(left[1::2, :, None, ::-2]) * right[..., -1:0:-2, None].sum()
    outputs = [y, *ct.grad(ct.sum(y * y), [a, b])]
    feeds = {"a": values(a.shape, "float64", 0) / 10, "b": values(b.shape, "float64", 1) / 10}
    on_cpu = ct.compile(outputs, inputs=[a, b], backend="numpy")(**feeds)
    gpu = ct.compile(outputs, inputs=[a, b], backend="cupy")
    for _ in range(2):  # eager, then captured
        for ours, expected in zip(gpu(**feeds), on_cpu):
            ours = ours.get() if hasattr(ours, "get") else ours
            np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pads_read_inside_fused_kernels_on_the_gpu_match_the_numpy_backend(dtype):
    """A concatenation, a split's gradient, a padding value, a crop on both sides and a shift of one value read
    beside the value itself (which no output may overwrite in place), each inside a generated kernel."""
    qkv, x = ct.var("qkv", (3, 7, 24), dtype), ct.var("x", (5, 9), dtype)
    q, k, v = ct.split(qkv, 3, axis=-1)
    h = ct.exp(x)
    shifted = h * 2.0 + ct.pad(h, ((0, 0), (1, -1)))
    framed = ct.pad(x[1:-1, 2:-3], ((2, 1), (0, 3)), constant_values=1.5) - 1.0
    joined = ct.concatenate([ct.tanh(x), x[:2], h[::2]], axis=0)
    loss = ct.sum(ct.cast(ct.tanh(q) * k * v, "float32")) + ct.sum(ct.cast(shifted, "float32"))
    outputs = [shifted, framed, joined, *ct.grad(loss, [qkv, x])]
    feeds = {"qkv": values(qkv.shape, dtype, 0), "x": values(x.shape, dtype, 1) / 4}
    on_cpu = ct.compile(outputs, inputs=[qkv, x], backend="numpy")(**feeds)
    gpu = ct.compile(outputs, inputs=[qkv, x], backend="cupy")
    assert not [k for k in gpu.kernels if k.term.op.name == "pad"]
    tolerance = 1e-4 if dtype == "float32" else 2e-2  # values near 10, fused products contracted into FMAs
    for _ in range(2):  # eager, then captured
        for ours, expected in zip(gpu(**feeds), on_cpu):
            ours = ours.get() if hasattr(ours, "get") else ours
            np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(expected, np.float32),
                                       rtol=tolerance, atol=tolerance)
