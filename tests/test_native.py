"""The CPU's fused regions compiled to C: the same bits as NumPy's op-by-op calls, on broadcast, strided and in-place
operands; regions C does not compute stay NumPy's; libraries come from the disk cache; no compiler, no change."""

import ctypes
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado import nn, optim, testing
from cortado.exprgraph import constructors
from cortado.backends.numpy import native

pytestmark = pytest.mark.skipif(native.toolchain() is None, reason="no C compiler here")


def _both(outputs, inputs, feeds, monkeypatch):
    """The outputs of the program compiled with native regions and without."""
    with_c = ct.compile(outputs, inputs=inputs)
    with monkeypatch.context() as patch:
        patch.setattr(native, "toolchain", lambda: None)
        without = ct.compile(outputs, inputs=inputs)
    assert without._executor.native is None
    return with_c, with_c(**feeds), without(**feeds)


def test_an_arithmetic_region_is_one_c_call_with_numpys_bits(monkeypatch):
    x, b = ct.var("x", (64, 33)), ct.var("b", (33,))
    out = ct.maximum(x * 1.7 - b / 3.0, 0.0) + ct.sqrt(ct.abs(x)) * ct.where(x < b, x, -b)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((64, 33)).astype(np.float32), "b": rng.standard_normal(33).astype(np.float32)}
    program, (ours,), (numpy,) = _both([out], [x, b], feeds, monkeypatch)
    assert len(program._executor.native.names) == 1
    np.testing.assert_array_equal(ours, numpy)
    np.testing.assert_array_equal(ours, ct.evaluate(out, feeds))


def test_nans_and_infinities_pass_as_numpy_passes_them(monkeypatch):
    x, y = ct.var("x", (6,), "float64"), ct.var("y", (6,), "float64")
    out = [ct.maximum(x, y), ct.minimum(x, y), ct.relu(x) / y, ct.cast(x > y, "float64")]
    feeds = {"x": np.array([np.nan, 1, -np.inf, 0.0, -0.0, 2]), "y": np.array([1, np.nan, 1, -0.0, 0.0, np.inf])}
    _, ours, numpy = _both(out, [x, y], feeds, monkeypatch)
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


def bool_arithmetic():
    """Outputs of arithmetic on bools, their feeds and NumPy's values: ``+`` is NumPy's ``or``, ``/`` a float64's."""
    a, b = ct.var("a", (4,), "bool"), ct.var("b", (4,), "bool")
    av, bv = np.array([False, False, True, True]), np.array([False, True, False, True])
    outputs = [ct.cast(a + b, "float32"), (a + b) * 1.5, ct.argmax(a + a), a / b + 0.5, a * b * 2.0,
               ct.maximum(a, b) * 1.0, ct.equal(a + b, np.True_)]
    with np.errstate(all="ignore"):
        expected = [(av + bv).astype(np.float32), (av + bv) * 1.5, np.argmax(av + av), av / bv + 0.5, av * bv * 2.0,
                    np.maximum(av, bv) * 1.0, np.equal(av + bv, True)]
    return outputs, [a, b], {"a": av, "b": bv}, expected


def test_arithmetic_on_bools_is_numpys_not_cs_on_their_bytes(monkeypatch):
    """C's ``+`` on the bytes that hold bools made True + True 2 (an argmax past the end of its row), and its ``/``
    divided them as integers, True / False killing the process (SIGFPE): such terms stay NumPy's."""
    outputs, inputs, feeds, expected = bool_arithmetic()
    with np.errstate(all="ignore"):
        _, ours, numpy = _both(outputs, inputs, feeds, monkeypatch)
    for a, b, want in zip(ours, numpy, expected):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("shape", [(3, 2), (8, 8), (64, 4), (2, 2, 4), (5, 7), (16, 16)])
def test_a_choice_reading_a_reversed_operand_is_numpys(shape, monkeypatch):
    """GCC 12.2 at -O3 vectorized ``where(y > 0, y, x[:, ::-1])`` over short rows wrongly (rows reversed or shifted
    onto others): a loop nest reading an array backwards is compiled unvectorized."""
    x, y = ct.var("x", shape), ct.var("y", shape)
    flipped = x[..., ::-1]
    outputs = [ct.where(y > 0, y, flipped), ct.where(flipped > 0, flipped * 2, y)]
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "y": rng.standard_normal(shape).astype(np.float32)}
    _, ours, numpy = _both(outputs, [x, y], feeds, monkeypatch)
    xv, yv = feeds["x"][..., ::-1], feeds["y"]
    for got, theirs, want in zip(ours, numpy, [np.where(yv > 0, yv, xv), np.where(xv > 0, xv * 2, yv)]):
        np.testing.assert_array_equal(theirs, want)
        np.testing.assert_array_equal(got, want)


def test_a_transcendental_is_numpys_own_loop_called_from_c_between_loop_nests_where_that_saves_passes_or_calls(
        monkeypatch):
    """A region whose C makes as many passes as NumPy's calls is C where every piece is (one call from Python instead
    of one a pass), its transcendental written straight into its output; where NumPy's loop is not found (or differs
    from the ufunc), the transcendental is NumPy's call instead."""
    from cortado.backends.numpy import loops

    x = ct.var("x", (64, 16))
    feeds = {"x": np.linspace(-6, 6, 1024, dtype=np.float32).reshape(64, 16)}
    few, (ours,), (numpy,) = _both([ct.tanh(x * 2.0)], [x], feeds, monkeypatch)  # NumPy: 2 passes; C: 2, one call
    assert sorted(name.split("_")[0] for name in few._executor.native.names) == ["loop", "region", "sequence"]
    np.testing.assert_array_equal(ours, numpy)
    gelu = ct.gelu(x) * x + 1.0  # spelled out: exp between a dozen arithmetic ops
    program, (ours,), (numpy,) = _both([gelu], [x], feeds, monkeypatch)
    names = sorted(name.split("_")[0] for name in program._executor.native.names)
    assert names == ["loop", "region", "region", "sequence"]  # the loop nests before and after exp, in one call
    np.testing.assert_array_equal(ours, numpy)
    monkeypatch.setattr(loops, "unary", lambda ufunc, dtype: None)
    program, (ours,), _ = _both([gelu], [x], feeds, monkeypatch)
    assert sorted(name.split("_")[0] for name in program._executor.native.names) == ["region", "region"]
    np.testing.assert_array_equal(ours, numpy)


@pytest.mark.parametrize("shape", [(), (5, 3)])
def test_a_transcendental_written_over_an_operand_waits_for_every_other_output_read_from_it(shape, monkeypatch):
    """``log(2 + relu(x))`` written over ``x`` (its last reader) by NumPy's loop, after the loop nest that keeps
    ``2 + relu(x)`` for it: ``relu(x)``, another output, is computed by the last loop nest from ``x`` again, so the
    log cannot go straight into ``x``'s place (it did, and ``relu(0)`` read ``log(2)``; found by 2000 examples of the
    edge-value programs)."""
    x = ct.var("x", shape)
    outputs = [-x, ct.log(ct.relu(x) + 2.0)]
    total = sum(ct.sum(ct.cast(o, "float64")) for o in outputs)
    outputs += ct.grad(total, [x])  # -1 + (relu(x) <= 0 ? 0 : 1 / (relu(x) + 2)): reads relu(x)
    feeds = {"x": np.linspace(-1.0, 1.0, max(1, int(np.prod(shape))), dtype=np.float32).reshape(shape)}
    program, ours, numpy = _both(outputs, [x], feeds, monkeypatch)
    assert "(in place of x)" in program.explain()
    for a, b, said in zip(ours, numpy, ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, said)


@pytest.mark.parametrize("labels_dtype", ["int32", "int64"])
def test_integers_compared_with_their_own_kind_are_read_by_c_loop_nests(labels_dtype, monkeypatch):
    """A cross-entropy's gradient compares each label with every class's index: that region is C, with NumPy's bits;
    integers in any other op (a label plus one, an integer compared with a float) leave their region NumPy's."""
    logits, labels = ct.var("logits", (6, 50, 11)), ct.var("labels", (6, 50), labels_dtype)
    classes = ct.var("classes", (11,), labels_dtype)
    outputs = [*ct.grad(nn.cross_entropy(logits, labels), [logits]),
               ct.cast(ct.equal(labels[..., None], classes), "float32") * 2.0 - logits]
    rng = np.random.default_rng(6)
    feeds = {"logits": rng.standard_normal((6, 50, 11)).astype(np.float32),
             "labels": rng.integers(0, 11, (6, 50)).astype(labels_dtype), "classes": np.arange(11, dtype=labels_dtype)}
    program, ours, numpy = _both(outputs, [logits, labels, classes], feeds, monkeypatch)
    assert not _numpys_fused_calls(program)
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    for kept_numpys in ([ct.cast(labels + 1, "float32") * 2.0 - logits[..., 0]],
                        [ct.cast(ct.less(ct.cast(labels, "float32"), logits[..., 0]), "float32") * 2.0 + logits[..., 1]]):
        program, ours, numpy = _both(kept_numpys, [logits, labels], {k: feeds[k] for k in ("logits", "labels")},
                                     monkeypatch)
        assert _numpys_fused_calls(program)
        np.testing.assert_array_equal(ours[0], numpy[0])


def _numpys_fused_calls(program):
    """The calls of NumPy's that run fused regions' ops."""
    return [call for call, k in zip(program._executor.calls, program._executor.call_kernel)
            if k.term.op.name == "fused" and not isinstance(getattr(call, "func", call), ctypes._CFuncPtr)]


@pytest.mark.usefixtures("blas_products")
def test_convolution_windows_and_their_gradients_taps_are_c_copies_with_numpys_bits(monkeypatch):
    """A convolution's windows copied into columns, and a pooling gradient's windows added back tap by tap
    (overlapping windows too, a stride smaller than the window), are C loop nests: the same bits as NumPy's copies."""
    x, w = ct.var("x", (4, 3, 9, 9)), ct.var("w", (5, 3, 3, 3))
    h = ct.conv(x, w, strides=(1, 1), padding=((1, 1), (1, 1)))
    pooled = ct.max_pool2d(ct.relu(h), 2) + ct.sum(ct.windows(h, (3, 3), strides=(2, 2)), axis=(4, 5))
    loss = ct.sum(pooled * pooled)
    outputs = [loss, *ct.grad(loss, [x, w])]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3, 9, 9)).astype(np.float32),
             "w": rng.standard_normal((5, 3, 3, 3)).astype(np.float32)}
    program, ours, numpy = _both(outputs, [x, w], feeds, monkeypatch)
    executor = program._executor
    calls = {}  # each kernel's calls apart, as ``profile`` makes them
    for call, kernel in zip(executor.kernel_calls, executor.kernel_of_call):
        calls.setdefault(kernel.term.op.name, []).append(getattr(call, "func", call))
    overlap_adds = sum(k.term.op.name == "overlap_add" for k in program.kernels)
    assert overlap_adds and all(isinstance(f, ctypes._CFuncPtr) for f in calls.get("overlap_add", []))  # fill and taps
    conv_kernels = sum(k.term.op.name == "conv" for k in program.kernels)
    assert sum(isinstance(f, ctypes._CFuncPtr) for f in calls["conv"]) >= conv_kernels  # each one's window copy, a pad
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_attentions_scores_are_shifted_in_c_with_numpys_bits_infinities_and_nans_included(causal, monkeypatch):
    q, k, v = (ct.var(name, (2, 3, 7, 4)) for name in "qkv")
    out = constructors.attention(q, k, v, 0.37, causal)  # what the rules make of softmax(q k^T * s) @ v
    loss = ct.sum(out * out)
    outputs = [out, *ct.grad(loss, [q, k, v])]
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal((2, 3, 7, 4)).astype(np.float32) for name in "qkv"}
    feeds["q"][0, 0, 2, 1], feeds["k"][1, 2, 5, 0], feeds["q"][1, 1, 3, 2] = np.inf, -np.inf, np.nan
    program, ours, numpy = _both(outputs, [q, k, v], feeds, monkeypatch)
    assert any(name.startswith("shift_") for name in program._executor.native.names)
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


def test_the_softmax_familys_rows_are_shifted_in_c_with_numpys_bits(monkeypatch):
    x = ct.var("x", (6, 9))
    outputs = [ct.logsumexp(x, axis=1), ct.softmax(x, axis=-1), ct.log_softmax(x, axis=1), ct.softmax(x, axis=0)]
    outputs.append(ct.grad(ct.sum(outputs[0]), [x])[0])
    values = np.random.default_rng(2).standard_normal((6, 9)).astype(np.float32)
    values[1, 3], values[2, 0], values[3, :] = np.inf, np.nan, -np.inf
    program, ours, numpy = _both(outputs, [x], {"x": values}, monkeypatch)
    assert any(name.startswith("shifted_") for name in program._executor.native.names)
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


def test_pads_and_reshapes_no_view_can_be_are_c_copies_with_numpys_bits(monkeypatch):
    x = ct.var("x", (4, 6, 3, 5))
    merged = ct.reshape(ct.transpose(x, (0, 2, 1, 3)), (4, 3, 30))  # heads merged back: no view can be
    outputs = [ct.pad(merged, ((0, 0), (1, -1), (2, 3)), 1.5) * 2.0, merged + 1.0]
    feeds = {"x": np.random.default_rng(3).standard_normal((4, 6, 3, 5)).astype(np.float32)}
    program, ours, numpy = _both(outputs, [x], feeds, monkeypatch)
    functions = [getattr(c, "func", c) for c, k in zip(program._executor.calls, program._executor.call_kernel)
                 if k.term.op.name in ("reshape", "pad")]
    assert functions and not any(f is np.copyto for f in functions)
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("blas_products")
def test_a_pad_whose_rows_the_compiler_once_vectorised_wrongly_is_copied_right(monkeypatch):
    """A pad of 2 x 4 images of 3 x 3 by a row above and below, less their last column: a copy of 8 x 3 x 2 doubles,
    which GCC 12's AVX-512 permutes (``-O3 -march=native``) wrote with one element from the wrong row (a
    convolution's weight gradient, a stride of 2 over its cropped columns, came out wrong); every element in its
    place, and the gradient the reference's."""
    x = ct.var("x", (2, 4, 3, 3), "float64")
    padded = ct.pad(x, ((0, 0), (0, 0), (1, 1), (0, -1)))
    values = np.arange(72, dtype=np.float64).reshape(2, 4, 3, 3) + 1
    program, (ours,), (numpy,) = _both([padded], [x], {"x": values}, monkeypatch)
    np.testing.assert_array_equal(ours, numpy)
    np.testing.assert_array_equal(ours, np.pad(values, ((0, 0), (0, 0), (1, 1), (0, 0)))[..., :2])
    w = ct.var("w", (2, 2, 1, 2), "float64")
    y = ct.conv2d(x, w, stride=(1, 2), padding=(1, 0), groups=2)
    (gradient,) = ct.grad(ct.sum(y * y), [w])
    feeds = {"x": values / 72, "w": np.linspace(-1, 1, 8).reshape(2, 2, 1, 2)}
    np.testing.assert_array_equal(ct.compile([gradient], inputs=[x, w])(**feeds)[0], ct.evaluate(gradient, feeds))


def _mixed_widths_step(rows, columns, seed):
    """The outputs of a program over a float64 state ``x`` and a float32 row ``y`` broadcast against it, whose where
    reads ``-x`` from the region that makes it, with the reference's values for them."""
    x, y = ct.var("x", (rows, 1, columns), "float64"), ct.var("y", (1, columns), "float32")
    outputs = [-x, -x - 0.5, ct.where(x < y, -x, x), x + y * 2.0]
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.integers(-2, 3, (rows, 1, columns)).astype(np.float64),
             "y": rng.integers(-2, 3, (1, columns)).astype(np.float32)}
    program = ct.compile(outputs, inputs=[y], state={x: feeds["x"]})
    return program(y=feeds["y"]), ct.evaluate(outputs, feeds)


def test_a_region_of_float_and_double_values_the_compiler_once_vectorised_wrongly_is_computed_right():
    """``where(x < y, -x, x)`` over 3 x 1 x 3 doubles, y a float32 row broadcast along them: GCC 12.2's AVX2
    vectorization of that loop nest (``-O3 -march=native``) left two of its nine elements unwritten (and 103 of the
    153 shapes below 10 x 18 wrong). A nest holding float and double values is compiled unvectorized."""
    ours, expected = _mixed_widths_step(3, 3, 0)
    for a, b in zip(ours, expected):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 17), st.integers(0, 2 ** 31))
def test_small_regions_of_float_and_double_values_are_the_references(rows, columns, seed):
    """Over small shapes (the loops' trip counts constants in the C), as the reference computes them."""
    ours, expected = _mixed_widths_step(rows, columns, seed)
    for a, b in zip(ours, expected):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_pads_and_crops_of_strided_values_are_c_copies_with_the_references_elements(data):
    """A pad of any widths, crops (negative widths) included, of a value read in place or through a transpose or a
    slice: C copies of strided views (``_strided``) put every element where NumPy's pad puts it."""
    rank = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.integers(1, 5)) for _ in range(rank))
    dtype = data.draw(st.sampled_from(["float64", "float32", "int32", "int8"]))
    x = ct.var("x", shape, dtype)
    source = x
    if rank > 1 and data.draw(st.booleans()):
        source = ct.transpose(x, tuple(data.draw(st.permutations(range(rank)))))
    if data.draw(st.booleans()):
        source = source[tuple(slice(data.draw(st.integers(0, n - 1)), None) for n in source.shape)]
    widths = tuple((data.draw(st.integers(-(n - 1), 2)), data.draw(st.integers(-(n - 1), 2))) for n in source.shape)
    widths = tuple((low, max(high, -(n + low - 1))) for (low, high), n in zip(widths, source.shape))  # keep one
    padded = ct.pad(source * 3, widths, 7)
    values = (np.arange(np.prod(shape)) % 100 + 1).astype(dtype).reshape(shape)
    (ours,) = ct.compile([padded], inputs=[x])(x=values)
    np.testing.assert_array_equal(ours, ct.evaluate(padded, {"x": values}))


def test_regions_with_reductions_keep_numpys_sums_between_c_loop_nests(monkeypatch, capsys):
    """A layer norm forward and backward, and AdamW's updates of a gain and a bias from their gradients' column sums:
    each reduction sums in NumPy's order, its rows' means and sums in C as NumPy's pairwise sums, its column sums
    in C row after row, the elementwise work between them C too."""
    x = ct.var("x", (6, 5, 12))
    model = nn.LayerNorm(12)
    y = ct.sum(ct.tanh(model(x)) * x)
    params = {name: p.var for name, p in model.named_parameters()}
    state, updates = optim.AdamW(1e-2).updates(params, ct.grad(y, list(params.values())))
    outputs = [y, *ct.grad(y, [x]), *updates.values()]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((6, 5, 12)).astype(np.float32)}
    values = {**model.initial_values(0), **state}
    feeds.update({v.name: np.asarray(value) for v, value in values.items()})
    inputs = [x, *values]
    program, ours, numpy = _both(outputs, inputs, feeds, monkeypatch)
    names = program._executor.native.names
    assert any(n.startswith("blocked_sums_") for n in names) and any(n.startswith("leading_sum_") for n in names)
    assert "did not build" not in capsys.readouterr().err
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


def test_a_sum_over_leading_axes_is_c_in_numpys_order_and_runs_with_its_region_as_one_call(monkeypatch):
    """A bias's update from its gradient's column sum: NumPy adds the rows to 0 one after another, and so does C,
    so the sum keeps NumPy's bits (negative zeros summing to +0 included); the sum's loop and the update's are one
    call. A sum to one element is NumPy's pairwise sum and stays NumPy's."""
    g, b = ct.var("g", (37, 3, 20)), ct.var("b", (3, 20))
    outputs = [0.1 * ct.sum(ct.tanh(g) * 3.0 + g, axis=0) - b, ct.sum(ct.tanh(g) * 3.0 + g)]
    rng = np.random.default_rng(5)
    grads = (rng.standard_normal((37, 3, 20)) * 10.0 ** rng.uniform(-4, 4, (37, 1, 1))).astype(np.float32)
    grads[:, 0, :4] = -0.0
    feeds = {"g": grads, "b": rng.standard_normal((3, 20)).astype(np.float32)}
    feeds["b"][0, :4] = 0.0
    program, ours, numpy = _both(outputs, [g, b], feeds, monkeypatch)
    names = program._executor.native.names
    assert any(n.startswith("sequence_") for n in names)
    assert sum(n.startswith("leading_sum_") for n in names) == 1  # the sum to one element is NumPy's
    for a, b_ in zip(ours, numpy):
        np.testing.assert_array_equal(a.view(np.uint32), b_.view(np.uint32))  # the bits: +0 and -0 differ
    assert not np.signbit(ours[0][0, :4]).any()  # negative zeros sum to +0: 0.1 * +0 - 0 is +0


@pytest.mark.usefixtures("blas_products")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_products_of_matrices_call_numpys_blas_from_c_with_numpys_bits(dtype, monkeypatch):
    """A product of matrices (either operand transposed) is NumPy's own ?gemm call made from C; a matrix times its
    own transpose (NumPy's syrk) and a product with a single row stay NumPy's matmul."""
    from cortado.backends.numpy import blas

    if blas.gemm(dtype) is None:
        pytest.skip("no BLAS entry point NumPy calls was found in this process")
    x, w, v = ct.var("x", (40, 24), dtype), ct.var("w", (24, 17), dtype), ct.var("v", (1, 40), dtype)
    outputs = [x @ w, ct.transpose(x) @ (x @ w), (x @ w) @ ct.transpose(w), x @ ct.transpose(x), v @ x]
    rng = np.random.default_rng(6)
    feeds = {name: rng.standard_normal(shape).astype(dtype) for name, shape in (("x", (40, 24)), ("w", (24, 17)),
                                                                                 ("v", (1, 40)))}
    program, ours, numpy = _both(outputs, [x, w, v], feeds, monkeypatch)
    names = program._executor.native.names
    assert sum(n.startswith("gemm_") for n in names) == 3
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ours[0], feeds["x"] @ feeds["w"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("length", [5, 8, 100, 129, 1000])
def test_rows_sums_and_means_in_c_are_numpys_pairwise_sums_to_the_bit(dtype, length, monkeypatch, capsys):
    x = ct.var("x", (6, length), dtype)
    outputs = [ct.sum(ct.abs(x) * 2.0 - x, axis=-1) * 3.0, ct.mean(x * x + 1.0, axis=1, keepdims=True) - x]
    rng = np.random.default_rng(length)
    feeds = {"x": (rng.standard_normal((6, length)) * 10.0 ** rng.uniform(-4, 4, (6, length))).astype(dtype)}
    program, ours, numpy = _both(outputs, [x], feeds, monkeypatch)
    assert sum(n.startswith("blocked_sums_") for n in program._executor.native.names) == 2
    assert "did not build" not in capsys.readouterr().err
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a, b)


def test_consecutive_c_calls_of_several_kernels_are_one_call_and_errors_still_name_their_kernel(monkeypatch):
    """Products and loop nests one after another (each a kernel of its own) run as one C call; a gather after them
    that fails still names itself, not a kernel of the merged run."""
    x, w, v = ct.var("x", (8, 5)), ct.var("w", (5, 6)), ct.var("v", (6, 4))
    indices = ct.var("i", (3,), "int32")
    hidden = ct.relu(x @ w * 2.0 + 1.0)
    out = ct.take(ct.maximum(hidden @ v, 0.5) - 1.0, indices, axis=0)
    rng = np.random.default_rng(8)
    feeds = {"x": rng.standard_normal((8, 5)).astype(np.float32), "w": rng.standard_normal((5, 6)).astype(np.float32),
             "v": rng.standard_normal((6, 4)).astype(np.float32), "i": np.array([0, 7, 3], np.int32)}
    program, (ours,), (numpy,) = _both([out], [x, w, v, indices], feeds, monkeypatch)
    executor = program._executor
    assert any(n.startswith("sequence_") for n in executor.native.names)
    merged = [k for c, k in zip(executor.calls, executor.call_kernel) if getattr(c, "func", None) is not None
              and getattr(c.func, "__name__", "").startswith("sequence_")]
    assert len(executor.calls) == len(executor.call_kernel) and merged[0].term.op.name == "matmul"  # and what follows
    np.testing.assert_array_equal(ours, numpy)
    with pytest.raises(ct.IndexRangeError, match=r"take.*index 9 is out of range"):
        program(**{**feeds, "i": np.array([0, 9, 3], np.int32)})


def test_a_long_run_of_c_calls_is_sequences_of_at_most_most_calls_called_in_turn(monkeypatch):
    """A run of more C calls than one sequence makes (``MOST_CALLS``: the C compiler's time grows faster than a
    function's length) is sequences of that many, called by one more: the same calls, in the same order."""
    x = ct.var("x", (8, 8))
    h = x
    for k in range(5):
        h = ct.maximum(h @ x * 0.5 + (k + 1.0), 0.25)  # a product and a loop nest a layer, one run of C calls
    feeds = {"x": np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)}
    program, (whole,), _ = _both([h], [x], feeds, monkeypatch)
    monkeypatch.setattr(native, "MOST_CALLS", 2)
    chunked, (ours,), _ = _both([h], [x], feeds, monkeypatch)
    sources = [source for source in chunked._executor.native.sources if source.startswith("void sequence_")]
    assert len(sources) > 2 and all(source.count("((void* const*)p[") <= 2 for source in sources)
    assert any("  sequence_" in source for source in sources)  # a sequence calling sequences
    assert sum("sequence_" in getattr(getattr(c, "func", None), "__name__", "") for c in chunked._executor.calls) == \
        sum("sequence_" in getattr(getattr(c, "func", None), "__name__", "") for c in program._executor.calls)
    np.testing.assert_array_equal(ours, whole)
    np.testing.assert_allclose(ours, ct.evaluate(h, feeds), rtol=1e-5)


@pytest.mark.parametrize("shape", [(6, 5, 4, 4), (3, 8, 13, 11), (2, 3, 1, 1), (4, 1, 9, 9)])
def test_channel_sums_and_means_in_c_are_numpys_to_the_bit(shape, monkeypatch, capsys):
    """A batch norm's sums over all but the channels of an image stored channels first: for each channel, NumPy adds
    each image's pairwise sum of the channel's pixels to 0, image after image, and so does C. One channel of
    several images is one run to NumPy (a pairwise sum of them all) and stays NumPy's, as do images of one pixel."""
    x = ct.var("x", shape)
    outputs = [ct.sum(x * x - 1.0, axis=(0, 2, 3)) * 0.5, ct.mean(ct.abs(x) + x, axis=(0, 2, 3), keepdims=True) + x]
    rng = np.random.default_rng(11)
    feeds = {"x": (rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape[:2] + (1, 1))).astype(np.float32)}
    program, ours, numpy = _both(outputs, [x], feeds, monkeypatch)
    found = sum(n.startswith("blocked_sums_") for n in program._executor.native.names)
    c_sums = shape[1] > 1 and shape[2] * shape[3] > 1  # one pixel a channel: NumPy's own sum, as of a column
    assert found == (2 if c_sums else 0) and "did not build" not in capsys.readouterr().err
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_a_sum_or_mean_of_its_own_kernel_is_c_in_numpys_order_too(monkeypatch, capsys):
    """A reduction read by two regions is a kernel of its own, not part of either: it is C all the same."""
    x = ct.var("x", (4, 6, 5, 7))
    total, mean = ct.sum(x, axis=(0, 2, 3)), ct.mean(x, axis=(2, 3))
    outputs = [total * 2.0, total - 1.0, mean * 3.0, mean + 1.0]
    feeds = {"x": np.random.default_rng(12).standard_normal((4, 6, 5, 7)).astype(np.float32)}
    program, ours, numpy = _both(outputs, [x], feeds, monkeypatch)
    assert sum(n.startswith("blocked_sums_") for n in program._executor.native.names) == 2  # neither is in a region
    assert "did not build" not in capsys.readouterr().err
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_an_update_written_in_place_reads_each_element_before_writing_it():
    w, g = ct.var("w", (1000,), "float64"), ct.var("g", (1000,), "float64")
    m = ct.var("m", (1000,), "float64")
    m_new = 0.9 * m + 0.1 * g
    step = ct.compile([], inputs=[g], state={w: np.ones(1000), m: np.zeros(1000)},
                      updates={m: m_new, w: w - 0.01 * m_new / (ct.sqrt(m_new * m_new) + 1e-8)})
    grads = np.linspace(-1, 1, 1000)
    step(g=grads)
    m1 = 0.1 * grads
    np.testing.assert_array_equal(step.state["m"], m1)
    np.testing.assert_array_equal(step.state["w"], 1 - 0.01 * m1 / (np.sqrt(m1 * m1) + 1e-8))


@settings(max_examples=40, deadline=None)
@given(testing.graphs_with_feeds(ops=["negative", "abs", "sqrt", "relu", "add", "subtract", "multiply", "divide",
                                      "maximum", "minimum", "where", "cast", "exp", "log", "tanh", "log1p",
                                      *testing.COMPARISONS], max_steps=12))
def test_random_elementwise_graphs_give_numpys_bits(case):
    graph, feeds = case
    with_c = ct.compile(list(graph.outputs), inputs=list(graph.inputs))
    with mock.patch.object(native, "toolchain", lambda: None):
        without = ct.compile(list(graph.outputs), inputs=list(graph.inputs))
    for ours, numpy in zip(with_c(**feeds), without(**feeds)):
        np.testing.assert_array_equal(ours, numpy)


def test_a_second_build_loads_the_library_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CORTADO_CACHE_DIR", str(tmp_path))
    x = ct.var("x", (8,))
    ct.compile([x * 3.0 + 1.0], inputs=[x])
    (library,) = (tmp_path / "cpu").glob("*.so")
    compiled = []
    monkeypatch.setattr(native.subprocess, "run", lambda *a, **k: compiled.append(a))
    program = ct.compile([x * 3.0 + 1.0], inputs=[x])
    assert not compiled and library.exists()
    np.testing.assert_array_equal(program(x=np.arange(8, dtype=np.float32))[0], np.arange(8) * 3 + 1)


def test_without_a_compiler_regions_stay_numpys_and_it_says_so_once(monkeypatch, capsys):
    monkeypatch.setenv("CORTADO_NATIVE", "0")
    native.toolchain.cache_clear()
    try:
        assert native.toolchain() is None
        monkeypatch.setenv("CORTADO_NATIVE", "1")
        monkeypatch.setenv("CC", "/nonexistent/cc")
        native.toolchain.cache_clear()
        assert native.toolchain() is None
        assert "fused regions run as NumPy calls" in capsys.readouterr().err
        x = ct.var("x", (4,))
        program = ct.compile([x * 2.0], inputs=[x])
        assert program._executor.native is None
        np.testing.assert_array_equal(program(x=np.ones(4, np.float32))[0], np.full(4, 2.0))
    finally:
        native.toolchain.cache_clear()


def test_a_library_that_does_not_build_leaves_its_regions_to_numpy(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CORTADO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "header", lambda: "this is not C;\n")
    x, y = ct.var("x", (5,)), ct.var("y", (5,))
    program = ct.compile([x * y + 2.0, ct.tanh(x)], inputs=[x, y])
    assert "did not build" in capsys.readouterr().err
    xv, yv = np.arange(5, dtype=np.float32), np.full(5, 3, np.float32)
    out = program(x=xv, y=yv)
    np.testing.assert_array_equal(out[0], xv * yv + 2)
    np.testing.assert_array_equal(out[1], np.tanh(xv))


def test_an_unwritable_cache_builds_in_a_folder_of_the_process(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("CORTADO_CACHE_DIR", str(blocked))
    x = ct.var("x", (3,))
    program = ct.compile([x * 5.0 - 1.0], inputs=[x])
    np.testing.assert_array_equal(program(x=np.ones(3, np.float32))[0], np.full(3, 4.0))
