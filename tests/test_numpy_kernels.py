"""NumPy kernels that take another road than the obvious call compute the same bits: a max over a few elements a
place (a pooling window) taken slice by slice."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends.numpy.kernels import SMALL_WINDOW, Emitter, emit


def _max_by_emitter(x, axes, keepdims):
    term = ct.max(ct.var("x", x.shape, x.dtype.name), axis=axes, keepdims=keepdims)
    out = np.empty(term.shape, x.dtype)
    em = Emitter()
    emit(em, term, [x], out)
    for call in em.calls:
        call()
    return out, len(em.calls)


@pytest.mark.parametrize("axes", [(4, 5), (1, 3), (0,), (2, 4, 5)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_a_max_over_windows_is_numpys_to_the_bit_nans_and_signed_zeros_included(axes, keepdims):
    rng = np.random.default_rng(0)
    x = rng.choice(np.array([-1.5, -0.0, 0.0, 2.0, np.nan, np.inf, -np.inf], np.float32), size=(3, 2, 5, 2, 2, 2))
    windows = np.lib.stride_tricks.sliding_window_view(x, (2, 2), axis=(4, 5))[..., 0, 0, :, :]  # a strided view
    for source in (x, windows):
        ours, calls = _max_by_emitter(source, axes, keepdims)
        expected = np.max(source, axis=axes, keepdims=keepdims)
        np.testing.assert_array_equal(ours, expected)
        np.testing.assert_array_equal(np.signbit(ours), np.signbit(expected))
        window = int(np.prod([source.shape[a] for a in axes]))
        assert calls == (window if 1 < window <= SMALL_WINDOW else 1)


def test_an_einsum_of_two_floating_operands_runs_as_one_matmul_on_the_cpu():
    a, b = ct.var("a", (1024, 63)), ct.var("b", (1, 1024, 64))
    out = ct.einsum("ti,bte->bie", a, b)
    program = ct.compile(out, inputs=[a, b])
    assert "einsum-as-matmul x1" in program.explain()
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((1024, 63)).astype(np.float32),
             "b": rng.standard_normal((1, 1024, 64)).astype(np.float32)}
    np.testing.assert_allclose(program(**feeds), np.einsum("ti,bte->bie", *feeds.values()), rtol=1e-4, atol=1e-4)
    i, j = ct.var("i", (3, 4), "int32"), ct.var("j", (4, 5), "int32")
    integers = ct.compile(ct.einsum("ij,jk->ik", i, j), inputs=[i, j])  # no BLAS for integers: np.einsum's
    assert [k.term.op.name for k in integers.kernels if not k.is_load] == ["einsum"]


def test_a_stack_of_matrices_times_one_matrix_is_one_product_of_all_rows(monkeypatch):
    from cortado.backends.numpy import native

    x, w = ct.var("x", (4, 6, 5)), ct.var("w", (5, 3))
    program = ct.compile(ct.matmul(x, w) + 1.0, inputs=[x, w])
    calls = [c for c, k in zip(program._executor.calls, program._executor.call_kernel) if k.term.op.name == "matmul"]
    assert len(calls) == 1  # NumPy's matmul, or its BLAS call from C (``blas``)
    monkeypatch.setattr(native, "toolchain", lambda: None)
    numpy_only = ct.compile(ct.matmul(x, w) + 1.0, inputs=[x, w])
    calls = [c for c, k in zip(numpy_only._executor.calls, numpy_only._executor.call_kernel)
             if k.term.op.name == "matmul"]
    assert [c.args[0].shape for c in calls] == [(24, 5)]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 6, 5)).astype(np.float32), "w": rng.standard_normal((5, 3)).astype(np.float32)}
    np.testing.assert_allclose(program(**feeds), feeds["x"] @ feeds["w"] + 1.0, rtol=1e-6)
    transposed = ct.compile(ct.matmul(ct.transpose(x, (1, 0, 2)), w), inputs=[x, w])  # no view of rows: a stack
    np.testing.assert_allclose(transposed(**feeds), feeds["x"].transpose(1, 0, 2) @ feeds["w"], rtol=1e-6)


def test_a_small_window_sum_of_booleans_is_added_slice_by_slice_and_exactly(monkeypatch):
    """As NumPy calls (no C compiler), a window of four places is a copy and three additions; with C, the window's
    sum is C's (``csource.blocked_sums``). Exact either way."""
    from cortado.backends.numpy import native

    x = ct.var("x", (5, 4, 6, 2, 2))
    count = ct.sum(ct.cast(ct.equal(x, ct.max(x, axis=(3, 4), keepdims=True)), "float32"), axis=(3, 4), keepdims=True)
    values = np.random.default_rng(0).integers(0, 2, (5, 4, 6, 2, 2)).astype(np.float32)  # many ties
    expected = np.sum((values == values.max(axis=(3, 4), keepdims=True)).astype(np.float32), axis=(3, 4), keepdims=True)
    np.testing.assert_array_equal(ct.compile(count, inputs=[x])(x=values), expected)
    monkeypatch.setattr(native, "toolchain", lambda: None)
    program = ct.compile(count, inputs=[x])
    np.testing.assert_array_equal(program(x=values), expected)
    adds = [c for c in program._executor.calls if getattr(c, "func", None) is np.add]
    assert len(adds) == 3  # four places of the window: a copy and three additions


@pytest.mark.parametrize("context_variable", [True, False])
def test_a_step_runs_quietly_with_small_buffers_and_leaves_numpys_settings_as_they_were(context_variable, monkeypatch):
    """Inside a step NumPy warns of nothing (an overflow is the program's value, not an event) and buffers
    ``UFUNC_BUFFER`` elements; after it, the caller's settings are back, through NumPy's context variable of ufunc
    settings or, where a NumPy lacks it, through ``np.seterr`` and ``np.setbufsize``."""
    from cortado.backends.numpy import executor

    if not context_variable:
        monkeypatch.setattr(executor, "_settings", None)
    x = ct.var("x", (4,))
    program = ct.compile([ct.exp(x) * 2.0], inputs=[x])
    seen = []
    program._executor.calls.append(lambda: seen.append((np.geterr()["over"], np.getbufsize())))
    before = (np.geterr(), np.getbufsize())
    with np.errstate(over="raise"):
        (out,) = program(x=np.array([1e3, 0, 1, 2], np.float32))
    assert out[0] == np.inf and seen == [("ignore", executor.UFUNC_BUFFER)]
    assert (np.geterr(), np.getbufsize()) == before


def test_empty_products_and_convolutions_compile_and_give_numpys_empty_or_zero_results():
    """An empty batch made the CPU's own products divide their work by zero parts."""
    x, w = ct.var("x", (0, 1, 4, 4)), ct.var("w", (2, 1, 3, 3))
    grad = ct.grad(ct.sum(ct.conv2d(x, w)), [w])[0]
    out, dw = ct.compile([ct.conv2d(x, w), grad], inputs=[x, w])(np.zeros((0, 1, 4, 4), np.float32),
                                                                 np.ones((2, 1, 3, 3), np.float32))
    assert out.shape == (0, 2, 2, 2) and not dw.any()
    a, b = ct.var("a", (2, 0)), ct.var("b", (0, 4))
    np.testing.assert_array_equal(ct.compile([a @ b], inputs=[a, b])(np.zeros((2, 0), np.float32),
                                                                     np.ones((0, 4), np.float32))[0], np.zeros((2, 4)))
