"""``add_at``: NumPy's ``np.add.at`` out of place, on random shapes, axes, dtypes and indices (negative and repeated
ones), from the reference interpreter and the CPU backend; ill-formed calls refused where they are built and an
index out of range named when a program runs; its gradients against finite differences; ``take``'s gradient as
``add_at``, with no one-hot matrix and an infinite adjoint kept to its own row; and, on a GPU, the cupy backend's
deterministic kernels giving the CPU's bits."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from cortado.exprgraph.dtypes import BFLOAT16
from cortado.gradcheck import check_grads

DTYPES = ["float32", "float64", "int32", "int64", "float16", "bfloat16"]
INDEX_DTYPES = ["int8", "int32", "int64", "uint8"]


def _array(rng, shape, dtype):
    if dtype.startswith("int"):
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(BFLOAT16 if dtype == "bfloat16" else dtype)


def _sums(shape, axis, places, values, dtype):
    """Each place's values summed in the order of the indices (float16 and bfloat16 in float32, rounded once)."""
    wide = np.float32 if dtype in ("float16", "bfloat16") else values.dtype
    sums = np.zeros(shape, wide)
    count = places.ndim
    np.add.at(np.moveaxis(sums, axis, 0), places,
              np.moveaxis(values.astype(wide), list(range(axis, axis + count)), list(range(count))))
    return sums.astype(values.dtype)


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1))
    index_shape = tuple(draw(st.lists(st.integers(0, 6), max_size=2)))
    return shape, axis, index_shape, draw(st.sampled_from(DTYPES)), draw(st.sampled_from(INDEX_DTYPES)), \
        draw(st.integers(0, 2 ** 31))


@settings(max_examples=120, deadline=None)
@given(cases())
def test_add_at_is_numpys_add_at_out_of_place(case):
    shape, axis, index_shape, dtype, index_dtype, seed = case
    rng = np.random.default_rng(seed)
    along = axis % len(shape)
    size = shape[along]
    taken = shape[:along] + index_shape + shape[along + 1:]
    x, i, v = ct.var("x", shape, dtype), ct.var("i", index_shape, index_dtype), ct.var("v", taken, dtype)
    low = 0 if index_dtype == "uint8" else -size
    feeds = {"x": _array(rng, shape, dtype), "i": rng.integers(low, size, index_shape).astype(index_dtype),
             "v": _array(rng, taken, dtype)}
    places = feeds["i"].astype(np.int64) % size
    expected = feeds["x"] + _sums(shape, along, places, feeds["v"], dtype)
    out = ct.add_at(x, i, v, axis=axis)
    program = ct.compile([out], inputs=[x, i, v], backend="numpy")
    for result in (ct.evaluate(out, feeds), program(**feeds)[0]):
        assert result.dtype == expected.dtype
        np.testing.assert_array_equal(result, expected)
    if dtype.startswith("int"):  # integers add exactly: NumPy's in-place np.add.at, to the bit
        in_place = feeds["x"].copy()
        np.add.at(np.moveaxis(in_place, along, 0), places, np.moveaxis(feeds["v"], list(range(along, along + len(
            index_shape))), list(range(len(index_shape)))))
        np.testing.assert_array_equal(expected, in_place)


def test_axis_none_adds_into_the_flattened_operand_and_values_broadcast():
    x = ct.var("x", (2, 3))
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    flat = ct.add_at(x, [5, 0, 5], [1.0, 2.0, 3.0])
    expected = value.copy().reshape(-1)
    np.add.at(expected, [5, 0, 5], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(ct.evaluate(flat, {"x": value}), expected.reshape(2, 3))
    rows = ct.add_at(x, [1, 1], 0.5, axis=0)  # a number broadcasts to the rows the indices take
    np.testing.assert_array_equal(ct.evaluate(rows, {"x": value}), value + [[0, 0, 0], [1, 1, 1]])


@pytest.mark.parametrize("build, message", [
    (lambda x, i, v: ct.add_at(x, ct.cast(i, "float32"), v, axis=0), r"add_at needs indices of an integer dtype"),
    (lambda x, i, v: ct.add_at(x, i, v, axis=2), r"axis 2 is out of range"),
    (lambda x, i, v: ct.add_at(x, i, ct.var("w", (3, 3)), axis=0), r"(broadcast|do not)"),
    (lambda x, i, v: ct.add_at(x, i, v > 0, axis=0), r"add_at adds numbers, not bool values"),
    (lambda x, i, v: ct.add_at(x, [0, 7], ct.var("w", (2, 3)), axis=0), r"index 7 is out of range for axis 0 of size 5"),
    (lambda x, i, v: ct.add_at(ct.var("e", (0, 3)), i, v, axis=0), r"has size 0, so no index can be added into it"),
])
def test_ill_formed_add_ats_are_refused_where_they_are_built(build, message):
    x, i, v = ct.var("x", (5, 3)), ct.var("i", (4,), "int32"), ct.var("v", (4, 3))
    with pytest.raises(ct.CortadoError, match=message):
        build(x, i, v)


@pytest.mark.parametrize("backend", ["reference", "numpy"])
def test_an_index_out_of_range_is_named_as_the_users_add_at(backend):
    x, i, v = ct.var("x", (5, 3)), ct.var("i", (2,), "int64"), ct.var("v", (2, 3))
    out = ct.add_at(x, i, v, axis=0)
    feeds = {"x": np.zeros((5, 3), np.float32), "i": np.array([1, 5]), "v": np.ones((2, 3), np.float32)}
    run = (lambda: ct.evaluate(out, feeds)) if backend == "reference" else \
        (lambda: ct.compile([out], inputs=[x, i, v], backend="numpy")(**feeds))
    with pytest.raises(ct.IndexRangeError, match=r"add_at\(float32\[5,3\], int64\[2\], float32\[2,3\], axis=0\): "
                                                 r"index 5 is out of range for axis 0 of size 5"):
        run()


@pytest.mark.parametrize("order", [1, 2])
def test_gradients_agree_with_finite_differences(order):
    x, i, v = ct.var("x", (4, 3), "float64"), ct.var("i", (2, 3), "int32"), ct.var("v", (4, 2, 3), "float64")
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((4, 3)), "i": np.array([[0, -1, 2], [2, 2, 0]], np.int32),
             "v": rng.standard_normal((4, 2, 3))}
    out = ct.tanh(ct.add_at(x, i, ct.tanh(v), axis=1))
    check_grads(out, [x, v], feeds, order=order, rtol=1e-6)


def test_takes_gradient_is_add_at_summed_in_the_order_of_the_indices():
    """float32 sums of repeated rows, in the indices' order (one chunk of them): NumPy's ``np.add.at`` to the bit."""
    table, tokens = ct.var("e", (7, 5)), ct.var("t", (4, 50), "int32")
    weights = np.random.default_rng(2).standard_normal((4, 50, 5)).astype(np.float32)
    (gradient,) = ct.grad(ct.sum(ct.take(table, tokens, axis=0) * ct.const(weights)), [table])
    assert gradient.op.name == "add_at"
    places = np.random.default_rng(3).integers(-7, 7, (4, 50)).astype(np.int32)
    expected = np.zeros((7, 5), np.float32)
    np.add.at(expected, places.reshape(-1) % 7, weights.reshape(-1, 5))
    got = ct.compile([gradient], inputs=[tokens], backend="numpy")(t=places)[0]
    np.testing.assert_array_equal(got, expected)


def test_past_a_chunk_of_indices_the_sums_of_chunks_are_added_in_order():
    """2500 indices are three chunks (``ADD_AT_CHUNK``): each chunk's rows summed in order, then the chunks' sums, in
    order; in float64 that is np.add.at's sum but for rounding."""
    from cortado.exprgraph.gathering import ADD_AT_CHUNK

    rng = np.random.default_rng(6)
    places, rows = rng.integers(0, 9, 2500), rng.standard_normal((2500, 3)).astype(np.float32)
    x, i, v = ct.var("x", (9, 3)), ct.var("i", (2500,), "int64"), ct.var("v", (2500, 3))
    got = ct.compile([ct.add_at(x, i, v, axis=0)], inputs=[x, i, v], backend="numpy")(
        x=np.zeros((9, 3), np.float32), i=places, v=rows)[0]
    expected = np.zeros((9, 3), np.float32)
    for first in range(0, 2500, ADD_AT_CHUNK):
        chunk = np.zeros((9, 3), np.float32)
        np.add.at(chunk, places[first:first + ADD_AT_CHUNK], rows[first:first + ADD_AT_CHUNK])
        held = np.unique(places[first:first + ADD_AT_CHUNK])
        expected[held] += chunk[held]
    np.testing.assert_array_equal(got, expected)
    exact = np.zeros((9, 3))
    np.add.at(exact, places, rows.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("count", [5, 2500])
def test_add_at_into_a_strided_view_writes_its_sums_there(count):
    """``add_at_into`` an ``out`` whose rows are strided (a slice of a wider array): the sums land in it, one chunk
    of indices or several, and the elements beside it are left alone (they were once added into a copy, and ``out``
    left zeros)."""
    from cortado.exprgraph.gathering import add_at_into

    rng = np.random.default_rng(7)
    places, rows = rng.integers(-10, 10, count), rng.standard_normal((4, count))
    wide = np.full((4, 20), 7.0)
    add_at_into(wide[:, :10], rows, places, 1)
    expected = np.zeros((4, 10))
    for first in range(0, count, 1024):
        np.add.at(expected, (slice(None), places[first:first + 1024]), rows[:, first:first + 1024])
    np.testing.assert_allclose(wide[:, :10], expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(wide[:, 10:], 7.0)


def test_an_infinite_adjoint_stays_in_the_rows_it_was_taken_from():
    table, tokens = ct.var("e", (6, 2)), ct.var("t", (3,), "int32")
    (gradient,) = ct.grad(ct.sum(ct.exp(ct.take(table, tokens, axis=0))), [table])
    values = np.zeros((6, 2), np.float32)
    values[4, 0] = 100.0  # exp overflows in the row taken from place 4 alone
    got = ct.evaluate(gradient, {"e": values, "t": np.array([4, 1, 1], np.int32)})
    assert np.isinf(got[4, 0]) and np.isfinite(np.delete(got.reshape(-1), 8)).all()
    np.testing.assert_array_equal(got[1], [2.0, 2.0])


def test_an_embeddings_gradient_makes_no_tokens_by_vocabulary_matrix():
    """The gradient adds each token's row into the table's gradient: no buffer of tokens x vocabulary is made (a
    one-hot matrix of 512 x 1000 here), and the SGD step equals the reference's."""
    emb = ct.nn.Embedding(1000, 16)
    tokens = ct.var("tokens", (1, 512), "int64")
    loss = ct.mean(emb(tokens) ** 2)
    weight = emb.parameters()["weight"]
    (gradient,) = ct.grad(loss, [weight])
    step = ct.compile([loss], inputs=[tokens], state=emb.initial_values(0), updates={weight: weight - 0.1 * gradient})
    made = [line for line in step.explain().splitlines() if line.startswith("  k")]
    assert not [line for line in made if "512,1000" in line or "1000,512" in line], "\n".join(made)
    assert any("add_at(" in line for line in made), "\n".join(made)
    feed = np.random.default_rng(0).integers(0, 1000, (1, 512))
    first = emb.initial_values(0)[weight]
    expected = first - 0.1 * ct.evaluate(gradient, {"tokens": feed, "weight": first})
    step(feed)
    np.testing.assert_allclose(step.state["weight"], expected, rtol=1e-6, atol=1e-9)


GPU_CASES = {  # name: (values shape, indices shape, axis, size, dtype, index dtype, values read transposed)
    "rows into a vocabulary, several chunks": ((3000, 16), (3000,), 0, 37, "float32", "int32", True),
    "2-d token ids, bfloat16, vector loads": ((4, 700, 64), (4, 700), 0, 50, "bfloat16", "int64", False),
    "2-d token ids, bfloat16, strided": ((4, 700, 64), (4, 700), 0, 3000, "bfloat16", "int64", True),
    "float16 columns, a middle axis": ((3, 5, 2, 9), (5, 2), 1, 4, "float16", "int32", True),
    "float64, places no index names": ((5, 3), (5,), 0, 2000, "float64", "uint8", True),
    "integers": ((2, 1100, 3), (1100,), 1, 9, "int32", "int64", False),
    "no indices": ((3, 0, 4), (0,), 1, 6, "float32", "int32", True),
}


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_on_the_gpu_add_at_gives_the_cpus_bits(case):
    """The sums in the same order as the CPU's, so the same bits, in every dtype; values read through strides (a
    transposed feed); an index outside the axis clamped into it, as ``take`` clamps it."""
    shape, index_shape, axis, size, dtype, index_dtype, transposed = GPU_CASES[case]
    rng = np.random.default_rng(4)
    fed = shape[::-1] if transposed else shape
    values, i = ct.var("v", fed, dtype), ct.var("i", index_shape, index_dtype)
    read = ct.transpose(values) if transposed else values  # a transposed feed is read where it lies, by its strides
    out_shape = shape[:axis] + (size,) + shape[axis + len(index_shape):]
    x = ct.var("x", out_shape, dtype)
    out = ct.add_at(x, i, read, axis=axis)
    low = 0 if index_dtype == "uint8" else -size
    feeds = {"v": _array(rng, fed, dtype), "i": rng.integers(low, min(size, 255), index_shape).astype(index_dtype),
             "x": np.zeros(out_shape, BFLOAT16 if dtype == "bfloat16" else dtype)}
    cpu = ct.compile([out], inputs=[x, i, values], backend="numpy")(**feeds)[0]
    gpu = ct.compile([out], inputs=[x, i, values], backend="cupy")(**feeds)[0].get()
    np.testing.assert_array_equal(gpu, cpu)
    if index_shape[0] and index_dtype != "uint8":
        outside = feeds["i"].copy()
        outside.reshape(-1)[:2] = [size + 5, -size - 5]
        clamped = feeds["i"].copy()
        clamped.reshape(-1)[:2] = [size - 1, 0]
        program = ct.compile([out], inputs=[x, i, values], backend="cupy")
        np.testing.assert_array_equal(program(**{**feeds, "i": outside})[0].get(), program(**{**feeds, "i": clamped})[0].get())


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
def test_on_the_gpu_an_embeddings_training_step_equals_the_cpus():
    """A GPT-like embedding's bfloat16 gradient (8192 tokens, a vocabulary of 50257, rows of 64): the same bits as the
    CPU's, with no tokens x vocabulary matrix planned."""
    emb = ct.nn.Embedding(50257, 64, dtype="bfloat16")
    tokens = ct.var("tokens", (8, 1024), "int32")
    loss = ct.sum(ct.cast(emb(tokens), "float32") ** 2)
    weight = emb.parameters()["weight"]
    (gradient,) = ct.grad(loss, [weight])
    feed = np.random.default_rng(5).integers(0, 50257, (8, 1024)).astype(np.int32)
    feed[:, :100] = 7  # one place taking many rows, from every chunk
    state = emb.initial_values(0)
    gpu = ct.compile([gradient], inputs=[tokens], state=state, backend="cupy")
    assert gpu.memory.peak_bytes < 64 << 20, gpu.memory.summary()
    cpu = ct.compile([gradient], inputs=[tokens], state=state, backend="numpy")
    np.testing.assert_array_equal(gpu(feed)[0].get(), cpu(feed)[0])


@pytest.mark.parametrize("values", [0.5, [0.25, 1.5], np.array([2.0, 3.0])])
def test_values_that_are_not_integers_are_refused_for_an_integer_x(values):
    """Floats taken in an integer ``x``'s dtype were truncated, 0.5 to 0, leaving ``x`` silently unchanged (as
    ``np.add.at`` does, casting unsafely, where ``np.add(x, 0.5, out=x)`` refuses and ``x + 0.5`` is a float): a
    float number or array for an integer ``x`` is refused."""
    x = ct.var("x", (3,), "int32")
    with pytest.raises(ct.DTypeError, match=r"add_at\(int32\[3\].*float64 values cannot be added into int32"):
        ct.add_at(x, [0, 0], values, axis=0)
    # integers and bools into an integer x (a Python int into an unsigned one too), numbers into a float x, are
    # taken in x's dtype as before
    np.testing.assert_array_equal(ct.evaluate(ct.add_at(x, [0, 0], 2, axis=0), {"x": np.arange(3, dtype=np.int32)}),
                                  [4, 1, 2])
    u = ct.var("u", (3,), "uint8")
    np.testing.assert_array_equal(ct.evaluate(ct.add_at(u, [2], 1), {"u": np.zeros(3, np.uint8)}), [0, 0, 1])
    f = ct.var("f", (3,), "float16")
    assert ct.add_at(f, [1], np.array([0.5]), axis=0).dtype == np.float16


@pytest.mark.parametrize("axis", [2, -3, True, 1.0, (0,)])
def test_an_axis_that_is_not_one_of_xs_is_named_whatever_the_values(axis):
    """The axis is checked before the values are shaped to it: a number's values once read ``the values () need the
    indices' axes (1,)``, which names nothing the user wrote wrong."""
    x = ct.var("x", (4, 3))
    with pytest.raises(ct.ShapeError, match=r"add_at\(float32\[4,3\].*: axis"):
        ct.add_at(x, [0], 1.0, axis=axis)
    with pytest.raises(ct.ShapeError, match=r"add_at\(float32\[\].*: axis 0 is out of range"):
        ct.add_at(ct.var("s", ()), [0], 1.0, axis=0)


def test_the_gpu_refuses_an_axis_of_2_to_the_31_places_or_more():
    """The GPU's sort keeps a place in 32 bits of its key and as an int, so an axis of 2**31 places or more would be
    added at wrapped places: refused when planning (no GPU needed to see it)."""
    from cortado.backends.cupy.targets import scatter
    from cortado.exprgraph.ops import ADD_AT
    from cortado.exprgraph.term import apply

    class Kernel:
        term = apply(ADD_AT, (ct.var("v", (3, 2)), ct.var("i", (3,), "int64")), axis=0, size=2 ** 31)

    with pytest.raises(ct.BackendError, match=r"at most 2\*\*31 - 1 places along the axis of an add_at, not 2147483648"):
        scatter._workspace(Kernel, None)
    Kernel.term = apply(ADD_AT, Kernel.term.args, axis=0, size=2 ** 31 - 1)
    assert scatter._workspace(Kernel, None) > 0
