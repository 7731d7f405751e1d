"""The CPU's attention in C a head at a time, its large products in two halves on two threads, NumPy's own loops
called from C: the same bits as NumPy's calls, and NumPy's where a check says otherwise."""

import numpy as np
import pytest

import cortado as ct
from cortado.backends.numpy import attention, blas, loops, native
from cortado.exprgraph import constructors

pytestmark = pytest.mark.skipif(native.toolchain() is None or blas.gemm("float32") is None,
                                reason="no C compiler or no BLAS entry point NumPy calls here")


def _attention_program(q_shape, k_shape, dtype, causal, same=False):
    """An attention and its gradients, compiled, with random feeds (some not finite): ``(program, outputs, feeds)``."""
    q, k, v = ct.var("q", q_shape, dtype), ct.var("k", k_shape, dtype), ct.var("v", k_shape, dtype)
    out = constructors.attention(q, q if same else k, v, 0.37, causal)
    inputs = [q, v] if same else [q, k, v]
    outputs = [out, *ct.grad(ct.sum(out * out), inputs)]
    rng = np.random.default_rng(7)
    feeds = {x.name: rng.standard_normal(x.shape).astype(dtype) for x in inputs}
    if q_shape[-2] > 2:
        feeds["q"][(0,) * (len(q_shape) - 2) + (2, 1)] = np.inf
        feeds["v"][(0,) * (len(k_shape) - 2) + (1, 0)] = np.nan
    return ct.compile(outputs, inputs=inputs), outputs, feeds


def _attention_functions(program):
    return sorted(name.rsplit("_", 1)[0] for name in program._executor.native.names if name.startswith("attention"))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape,k_shape,dtype", [((16, 4, 64, 16), (16, 4, 64, 16), "float32"),
                                                   ((1, 5, 16, 4), (1, 5, 16, 4), "float32"),
                                                   ((3, 32, 8), (3, 48, 8), "float64"),
                                                   ((64, 16), (64, 16), "float32")])
def test_attention_is_one_c_call_a_head_at_a_time_with_numpys_bits(q_shape, k_shape, dtype, causal):
    """Heads even and odd in number, queries and keys of other lengths, no lead axes, float64, infinities and NaNs."""
    program, outputs, feeds = _attention_program(q_shape, k_shape, dtype, causal)
    assert _attention_functions(program) == ["attention", "attention_grad"]
    for ours, numpy in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours.view(np.uint8), numpy.view(np.uint8))


@pytest.mark.parametrize("q_shape,same", [((2, 2, 1, 8), False),  # one query: NumPy's vector products
                                          ((2, 3, 7, 4), False),  # heads' row sums of other bits than all rows'
                                          ((2, 3, 16, 8), True),  # q @ q^T: NumPy's syrk
                                          ((2, 2, 600, 8), False)])  # two blocks: a product one thread changes
def test_attention_stays_numpys_where_c_would_not_give_its_bits(q_shape, same):
    k_shape = q_shape[:-2] + (16 if q_shape[-2] == 1 else q_shape[-2], q_shape[-1])
    program, outputs, feeds = _attention_program(q_shape, k_shape, "float32", True, same)
    assert _attention_functions(program) == []
    assert not isinstance(program._executor.threads, blas.one_thread)  # NumPy's products keep OpenBLAS's threads
    for ours, numpy in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours, numpy)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("keys", [1, 5, 16, 17, 63, 64, 129])
def test_the_einsum_of_the_gradients_rows_is_written_out_in_numpys_order(dtype, keys):
    assert attention.einsum_rows_agree(np.dtype(dtype), (3, 5, keys))


@pytest.mark.parametrize("ufunc", [np.exp, np.tanh, np.log, np.log1p, np.expm1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpys_own_loops_are_found_and_give_its_bits_in_stretches(ufunc, dtype):
    assert loops.unary(ufunc, np.dtype(dtype)) is not None
    assert loops.unary(np.add, np.dtype(dtype)) is None  # two operands: not a unary loop


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_products_are_two_halves_on_two_threads_with_numpys_bits(dtype):
    """Halves of rows (a tall result) and of columns (a wide one), either operand transposed; OpenBLAS's threads
    are held to one during the step and given back after it."""
    x, w, u = ct.var("x", (512, 96), dtype), ct.var("w", (96, 160), dtype), ct.var("u", (96, 700), dtype)
    outputs = [x @ w, ct.transpose(w) @ ct.transpose(x), ct.transpose(u) @ x[:96] * 2.0]
    program = ct.compile(outputs, inputs=[x, w, u])
    assert sum(name.startswith("gemm_halves_") for name in program._executor.native.names) == 3
    assert isinstance(program._executor.threads, blas.one_thread)
    rng = np.random.default_rng(8)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in (x, w, u)}
    before = blas.threads()[1]() if blas.threads() is not None else None
    for ours, numpy in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours, numpy)
    assert (blas.threads()[1]() if blas.threads() is not None else None) == before
