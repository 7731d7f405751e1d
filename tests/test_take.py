"""``take`` and ``take_along_axis``: NumPy's results from the reference interpreter and the CPU backend on random
shapes, axes, index dtypes and values (negative ones too); out-of-range indices and ill-typed ones refused
clearly; gradients that add the adjoint back where it was taken (repeated indices summed), checked against
NumPy's ``add.at`` and against finite differences to second order; the GPU's kernel moving whole rows a 16-byte
vector a thread where it can; and, on a GPU, the cupy backend equal to the CPU's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from cortado.backends.cupy.codegen import Operand
from cortado.backends.cupy.index_kernels import take_source
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.gradcheck import check_grads

VALUE_DTYPES = ["float32", "float64", "int32", "bool", "float16", "bfloat16"]
INDEX_DTYPES = ["int8", "int32", "int64", "uint8"]


def _values(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "int32":
        return rng.integers(-100, 100, shape).astype(np.int32)
    return rng.standard_normal(shape).astype(BFLOAT16 if dtype == "bfloat16" else dtype)


def _indices(rng, shape, size, dtype):
    low = 0 if dtype == "uint8" else -min(size, 128)
    return rng.integers(low, min(size, 128), shape).astype(dtype)


@st.composite
def takes(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1))
    index_shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    return shape, axis, index_shape, draw(st.sampled_from(VALUE_DTYPES)), draw(st.sampled_from(INDEX_DTYPES)), \
        draw(st.integers(0, 2 ** 31))


@st.composite
def along_axis(draw):
    """An operand and indices of as many axes, each axis off ``axis`` equal in both or 1 in one of them."""
    ndim = draw(st.integers(1, 3))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape, index_shape = [], []
    for a in range(ndim):
        size = draw(st.integers(1, 4))
        if a == axis % ndim:
            shape.append(size)
            index_shape.append(draw(st.integers(0, 4)))
        else:
            pair = draw(st.sampled_from([(size, size), (1, size), (size, 1)]))
            shape.append(pair[0])
            index_shape.append(pair[1])
    return tuple(shape), axis, tuple(index_shape), draw(st.sampled_from(VALUE_DTYPES)), \
        draw(st.sampled_from(INDEX_DTYPES)), draw(st.integers(0, 2 ** 31))


def _numpy_take_along_axis(a, indices, axis):
    """NumPy's ``take_along_axis`` with the operand and the indices broadcast against each other off ``axis``."""
    axis %= a.ndim
    off = np.broadcast_shapes(a.shape[:axis] + (1,) + a.shape[axis + 1:],
                              indices.shape[:axis] + (1,) + indices.shape[axis + 1:])
    a = np.broadcast_to(a, off[:axis] + (a.shape[axis],) + off[axis + 1:])
    indices = np.broadcast_to(indices, off[:axis] + (indices.shape[axis],) + off[axis + 1:])
    return np.take_along_axis(a, indices.astype(np.int64), axis=axis)


def _both_ways(out, inputs, feeds):
    """``out`` evaluated by the reference interpreter and by a program compiled for the CPU."""
    program = ct.compile([out], inputs=inputs, backend="numpy")
    return ct.evaluate(out, feeds), program(**feeds)[0]


def gathers():
    """``(name, *case)`` of ``take`` and ``take_along_axis`` cases alike."""
    return st.one_of(takes().map(lambda case: ("take", *case)), along_axis().map(lambda case: ("take_along_axis", *case)))


GATHERS = {"take": (ct.take, lambda a, indices, axis: np.take(a, indices.astype(np.int64), axis=axis)),
           "take_along_axis": (ct.take_along_axis, _numpy_take_along_axis)}


@settings(max_examples=160, deadline=None)
@given(gathers())
def test_gathers_are_numpys(case):
    name, shape, axis, index_shape, dtype, index_dtype, seed = case
    ours, numpys = GATHERS[name]
    rng = np.random.default_rng(seed)
    x, i = ct.var("x", shape, dtype), ct.var("i", index_shape, index_dtype)
    feeds = {"x": _values(rng, shape, dtype), "i": _indices(rng, index_shape, shape[axis], index_dtype)}
    expected = numpys(feeds["x"], feeds["i"], axis)
    for result in _both_ways(ours(x, i, axis=axis), [x, i], feeds):
        assert result.dtype == expected.dtype
        np.testing.assert_array_equal(result, expected)


def test_axis_none_takes_from_the_flattened_operand_and_lists_are_indices():
    x = ct.var("x", (3, 4))
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(ct.evaluate(ct.take(x, [11, -12, 5]), {"x": value}), np.take(value, [11, -12, 5]))
    np.testing.assert_array_equal(ct.evaluate(ct.take(x, 2, axis=1), {"x": value}), value[:, 2])
    flat = ct.take_along_axis(x, np.array([0, 11, 3]), axis=None)
    np.testing.assert_array_equal(ct.evaluate(flat, {"x": value}), value.reshape(-1)[[0, 11, 3]])


@pytest.mark.parametrize("build, message", [
    (lambda x, i: ct.take(x, ct.cast(i, "float32"), axis=0), r"take needs indices of an integer dtype, not float32"),
    (lambda x, i: ct.take(x, i, axis=2), r"axis 2 is out of range for a tensor of rank 2"),
    (lambda x, i: ct.take_along_axis(x, i, axis=1), r"take_along_axis needs indices with as many axes as the operand"),
    (lambda x, i: ct.take(ct.var("e", (0, 3)), i, axis=0), r"axis 0 has size 0, so no index can be taken from it"),
    (lambda x, i: ct.take_along_axis(x, ct.var("j", (2, 4), "int32"), axis=1), r"do not broadcast"),
    (lambda x, i: ct.take(x, i, axis=(0, 1)), r"axis must be an int, not \(0, 1\)"),
    (lambda x, i: ct.take_along_axis(x, ct.var("j", (2, 2), "int32"), axis=None),
     r"with axis=None the indices must have one dimension"),
])
def test_ill_formed_takes_are_refused_where_they_are_built(build, message):
    x, i = ct.var("x", (5, 3)), ct.var("i", (4,), "int32")
    with pytest.raises(ct.CortadoError, match=message):
        build(x, i)


@pytest.mark.parametrize("backend", ["reference", "numpy"])
def test_an_index_out_of_range_is_an_error_on_the_cpu(backend):
    x, i = ct.var("x", (5, 3)), ct.var("i", (2, 1), "int8")
    out = ct.take_along_axis(x, i, axis=0)
    feeds = {"x": np.zeros((5, 3), np.float32), "i": np.array([[1], [-6]], np.int8)}
    run = (lambda: ct.evaluate(out, feeds)) if backend == "reference" else \
        (lambda: ct.compile([out], inputs=[x, i], backend="numpy")(**feeds))
    with pytest.raises(ct.IndexRangeError, match=r"take_along_axis\(float32\[5,3\], int8\[2,1\], axis=0\): index -6 is out "
                                                 r"of range for axis 0 of size 5"):
        run()
    with pytest.raises(ct.IndexRangeError, match=r"index 9 is out of range for axis 0 of size 5"):
        ct.take(x, [0, 9], axis=0)  # constant indices are checked when the term is folded


@pytest.mark.parametrize("backend", ["reference", "numpy"])
def test_a_gradients_gather_out_of_range_is_named_as_the_users_even_when_the_users_term_is_gone(backend):
    """Only the gradient kept: its own gather (places picked with the user's indices) meets the index first, and the
    error still names the call the user wrote, on the user's line."""
    x, i = ct.var("x", (3,), "float64"), ct.var("i", (3,), "int64")
    (gradient,) = ct.grad(ct.sum(ct.take(x, i)), [x])  # the take itself is held by nothing after this line
    feeds = {"i": np.array([0, 3, 1])}
    run = (lambda: ct.evaluate(gradient, feeds)) if backend == "reference" else \
        (lambda: ct.compile([gradient], inputs=[i], backend="numpy")(**feeds))
    with pytest.raises(ct.IndexRangeError, match=r"take\(float64\[3\], int64\[3\], axis=None\): index 3 is out of "
                                                 r"range for the flattened operand of size 3"):
        run()


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
def test_one_label_a_row_on_the_cpu_is_numpys_pick_and_checks_its_indices(dtype):
    """A cross-entropy's pick of each row's label logit (one index a row along the last axis), the CPU's one-take
    path: NumPy's values, negative indices counted from the end, and an index out of range named."""
    x, i = ct.var("x", (3, 4, 5)), ct.var("i", (3, 4, 1), dtype)
    step = ct.compile([ct.take_along_axis(x, i, axis=-1)], inputs=[x, i], backend="numpy")
    values = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    low = 0 if dtype == "uint8" else -5
    places = np.random.default_rng(2).integers(low, 5, (3, 4, 1)).astype(dtype)
    np.testing.assert_array_equal(step(x=values, i=places)[0], np.take_along_axis(values, places.astype(np.int64) % 5, -1))
    places[1, 2, 0] = 5
    with pytest.raises(ct.IndexRangeError, match=r"index 5 is out of range for axis 2 of size 5"):
        step(x=values, i=places)


def _rows_added_back(shape, axis, places, weights):
    """``take``'s adjoint by NumPy: each row of ``weights`` added to the row of ``shape`` it was taken from."""
    expected = np.zeros(shape)
    count = places.ndim
    np.add.at(np.moveaxis(expected, axis, 0), places, np.moveaxis(weights, list(range(axis, axis + count)),
                                                                  list(range(count))))
    return expected


def _picks_added_back(shape, axis, places, weights):
    """``take_along_axis``'s adjoint by NumPy: each weight added at its place in the broadcast operand, then summed
    down to ``shape``."""
    wide = np.zeros(weights.shape[:axis] + (shape[axis],) + weights.shape[axis + 1:])
    places = np.broadcast_to(places, weights.shape)
    for where in np.ndindex(weights.shape):
        wide[where[:axis] + (places[where],) + where[axis + 1:]] += weights[where]
    return wide.sum(axis=tuple(a for a in range(len(shape)) if shape[a] == 1 and wide.shape[a] != 1), keepdims=True)


ADDED_BACK = {"take": _rows_added_back, "take_along_axis": _picks_added_back}


def test_an_empty_axis_gives_an_empty_result_and_a_gradient_checks_its_indices_too():
    empty = ct.take_along_axis(ct.var("z", (0, 0)), np.zeros((0, 3), np.int64), axis=1)
    assert ct.evaluate(empty, {"z": np.zeros((0, 0), np.float32)}).shape == (0, 3)
    w, i = ct.var("w", (4, 2)), ct.var("i", (3,), "int32")
    (gradient,) = ct.grad(ct.sum(ct.take(w, i, axis=0) * 3.0), [w])  # reads the indices alone, never take's values
    with pytest.raises(ct.IndexRangeError, match=r"index 9 is out of range for axis 0 of size 4"):
        ct.compile([gradient], inputs=[i], backend="numpy")(i=np.array([0, 9, -7], np.int32))


@settings(max_examples=80, deadline=None)
@given(gathers())
def test_gradients_add_the_adjoint_back_where_it_was_taken(case):
    """Repeated indices summed, negative ones counted from the end."""
    name, shape, axis, index_shape, _, index_dtype, seed = case
    ours, _ = GATHERS[name]
    rng = np.random.default_rng(seed)
    x, i = ct.var("x", shape, "float64"), ct.var("i", index_shape, index_dtype)
    indices = _indices(rng, index_shape, shape[axis], index_dtype)
    gathered = ours(x, i, axis=axis)
    weights = rng.standard_normal(gathered.shape)
    (gradient,) = ct.grad(ct.sum(gathered * ct.const(weights)), [x])
    axis %= len(shape)
    places = np.where(indices < 0, indices.astype(np.int64) + shape[axis], indices)
    np.testing.assert_allclose(ct.evaluate(gradient, {"i": indices}), ADDED_BACK[name](shape, axis, places, weights),
                               rtol=1e-12, atol=1e-12)


GRADIENT_CASES = {
    "take rows, repeated and negative": (lambda x, i: ct.take(x, i, axis=0), (6, 3), (2, 3), [[0, -1, 2], [2, 5, 0]]),
    "take columns, negative axis": (lambda x, i: ct.take(x, i, axis=-1), (4, 5), (3,), [4, -5, 4]),
    "take_along_axis, one label a row": (lambda x, i: ct.take_along_axis(x, i, axis=1), (4, 6), (4, 1),
                                         [[0], [5], [-1], [2]]),
    "take_along_axis, several, broadcast": (lambda x, i: ct.take_along_axis(x, i, axis=1), (4, 6), (1, 3),
                                            [[0, 5, 0]]),
}


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
@pytest.mark.parametrize("order", [1, 2])
def test_gradients_agree_with_finite_differences(case, order):
    build, shape, index_shape, indices = GRADIENT_CASES[case]
    x, i = ct.var("x", shape, "float64"), ct.var("i", index_shape, "int32")
    feeds = {"x": np.random.default_rng(0).standard_normal(shape), "i": np.array(indices, np.int32)}
    check_grads(ct.tanh(build(x, i)), x, feeds, order=order, rtol=1e-6)


def test_cross_entropy_of_labels_has_the_softmax_minus_one_hot_gradient():
    logits, labels = ct.var("z", (4, 7)), ct.var("y", (4, 1), "int32")
    loss = ct.mean(ct.logsumexp(logits, axis=1) - ct.reshape(ct.take_along_axis(logits, labels, axis=1), (4,)))
    (gradient,) = ct.grad(loss, [logits])
    program = ct.compile([loss, gradient], inputs=[logits, labels], backend="numpy")
    rng = np.random.default_rng(1)
    z, y = rng.standard_normal((4, 7)).astype(np.float32), np.array([[1], [6], [0], [-4]], np.int32)
    value, dz = program(z=z, y=y)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    one_hot = np.eye(7)[y[:, 0] % 7]
    np.testing.assert_allclose(value, -np.log(p[one_hot == 1]).mean(), rtol=1e-6)
    np.testing.assert_allclose(dz, (p - one_hot) / 4, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_gathers_and_their_gradients_equal_the_cpu(dtype):
    """An embedding lookup and a picked label, forward and gradient; an index beyond the axis is clamped into it."""
    table, tokens = ct.var("e", (11, 8), dtype), ct.var("t", (3, 5), "int32")
    labels = ct.var("y", (3, 5, 1), "int64")
    embedded = ct.take(table, tokens, axis=0)  # (3, 5, 8)
    picked = ct.take_along_axis(embedded, labels, axis=2)
    loss = ct.sum(ct.cast(picked, "float32") * 2.0) + ct.sum(ct.cast(embedded, "float32") ** 2)
    (gradient,) = ct.grad(loss, [table])
    rng = np.random.default_rng(3)
    feeds = {"e": _values(rng, (11, 8), dtype), "t": rng.integers(-11, 11, (3, 5)).astype(np.int32),
             "y": rng.integers(-8, 8, (3, 5, 1))}
    outputs = [embedded, picked, gradient]
    gpu = ct.compile(outputs, inputs=[table, tokens, labels], backend="cupy")(**feeds)
    cpu = ct.compile(outputs, inputs=[table, tokens, labels], backend="numpy")(**feeds)
    for ours, theirs in zip(gpu, cpu):
        np.testing.assert_allclose(ours.get().astype(np.float64), theirs.astype(np.float64), rtol=1e-2, atol=1e-2)
    clamped = ct.compile([embedded], inputs=[table, tokens, labels], backend="cupy")(
        **{**feeds, "t": np.array([[40, -40, 3, 10, -11]] * 3, np.int32)})[0].get()
    np.testing.assert_array_equal(clamped, feeds["e"][[10, 0, 3, 10, 0]][None].repeat(3, axis=0))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("shape, axis, dtype, index_dtype", [
    ((63, 768), 0, "bfloat16", "int32"), ((50, 96), 0, "float16", "int64"), ((7, 9, 32), 1, "float32", "int32"),
    ((7, 9, 2), 1, "float64", "int64"), ((63, 7), 0, "bfloat16", "int32"), ((9, 5, 3), 1, "int32", "int64"),
])
def test_on_the_gpu_takes_of_rows_whole_vectors_or_not_are_numpys(shape, axis, dtype, index_dtype):
    """Rows of whole 16-byte vectors (the first four) moved a vector a thread, the others an element a thread: the
    same values as NumPy's, negative and out-of-range indices included."""
    rng = np.random.default_rng(5)
    table, tokens = ct.var("e", shape, dtype), ct.var("t", (4, 33), index_dtype)
    values = _values(rng, shape, dtype)
    indices = rng.integers(-shape[axis] - 3, shape[axis] + 3, (4, 33)).astype(index_dtype)
    got = ct.compile([ct.take(table, tokens, axis=axis)], inputs=[table, tokens], backend="cupy")(e=values, t=indices)
    expected = np.take(values, np.clip(np.where(indices < 0, indices + shape[axis], indices), 0, shape[axis] - 1), axis)
    np.testing.assert_array_equal(got[0].get(), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_on_the_gpu_negative_labels_and_token_ids_are_clamped_to_the_last_place_not_counted_from_the_end():
    """``nn.cross_entropy`` and ``nn.Embedding`` read their labels and token ids as unsigned (on the CPU a negative
    one is an error): on the GPU, -100 (PyTorch's padding label, given without ``ignore_index``) and -1 are past
    the end, clamped to the last class or row, as a uint64 index past 2**63 is; a row kernel and a gather agree."""
    from cortado import nn

    rng = np.random.default_rng(7)
    logits, labels = ct.var("logits", (6, 300)), ct.var("labels", (6,), "int64")
    x = rng.standard_normal((6, 300)).astype(np.float32)
    step = ct.compile([nn.cross_entropy(logits, labels)], inputs=[logits, labels], backend="cupy")
    last = step(logits=x, labels=np.array([1, 299, 2, 299, 299, 0]))[0].get()
    assert step(logits=x, labels=np.array([1, -100, 2, -1, 299, 0]))[0].get() == last
    embed, tokens = nn.Embedding(300, 8), ct.var("tokens", (4,), "int32")
    lookup = ct.compile([embed(tokens)], inputs=[tokens], state=embed.initial_values(0), backend="cupy")
    rows = lookup(tokens=np.array([-1, -100, 299, 3], np.int32))[0].get()
    np.testing.assert_array_equal(rows[:3], np.repeat(rows[2:3], 3, axis=0))
    table, index = ct.var("e", (37, 4)), ct.var("i", (3,), "uint64")
    values = rng.standard_normal((37, 4)).astype(np.float32)
    past = np.array([2 ** 63 + 5, 40, 2], np.uint64)
    got = ct.compile([ct.take(table, index, axis=0)], inputs=[table, index], backend="cupy")(e=values, i=past)
    np.testing.assert_array_equal(got[0].get(), values[[36, 36, 2]])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_on_the_gpu_a_take_from_a_broadcast_row_reads_that_row_a_vector_a_thread():
    row, tokens = ct.var("r", (1, 768), "bfloat16"), ct.var("t", (4, 33), "int32")
    taken = ct.take(ct.broadcast_to(row, (63, 768)), tokens, axis=0) * 2.0
    values = _values(np.random.default_rng(6), (1, 768), "bfloat16")
    indices = np.arange(4 * 33, dtype=np.int32).reshape(4, 33) % 63
    got = ct.compile([taken], inputs=[row, tokens], backend="cupy")(r=values, t=indices)[0].get()
    np.testing.assert_array_equal(got, np.broadcast_to(values * 2.0, (4, 33, 768)).astype(got.dtype))


@pytest.mark.parametrize("shape, strides, dtype, axis, vectors", [
    ((63, 768), (768, 1), "bfloat16", 0, True),  # an embedding's rows: 96 vectors each
    ((5, 6, 4), (24, 4, 1), "float32", 1, True),  # rows of one vector after the middle axis
    ((5, 6, 4), (48, 4, 1), "float32", 1, True),  # the outer axis's stride a whole number of vectors too
    ((63, 7), (7, 1), "bfloat16", 0, False),  # rows of 14 bytes
    ((5, 6, 4), (26, 4, 1), "float32", 1, False),  # rows starting 104 bytes apart along the outer axis
    ((6, 8), (1, 6), "float32", 0, False),  # a transposed operand: its rows' elements apart
    ((6, 8), (8, 1), "float32", 1, False),  # no elements after the axis
    ((6, 32), (32, 1), "int8", 0, True),
    ((63, 768), (0, 1), "bfloat16", 0, True),  # a broadcast row: every index reads the same vectors
    ((6, 8), (8, 1), "int8", 0, False),  # rows of 8 bytes
])
def test_a_take_of_whole_rows_of_vectors_moves_a_vector_a_thread(shape, strides, dtype, axis, vectors):
    dtype = np.dtype(BFLOAT16 if dtype == "bfloat16" else dtype)
    indices = Operand((3, 2), np.dtype(np.int32), (2, 1))
    out_shape = shape[:axis] + (3, 2) + shape[axis + 1:]
    source = take_source(Operand(shape, dtype, strides), indices, Operand(out_shape, dtype, None), axis)
    assert ("uint4" in source.text) == vectors
    per = 16 // dtype.itemsize if vectors else 1
    assert f"i < {int(np.prod(out_shape)) // per};" in source.text
