"""Composite ops spelled out in primitives (``rules.primitives``) mean what the reference computes, bit for bit, in
every dtype they take, at ordinary and at edge values; after the rewrite no composite is left for a backend."""

import numpy as np
import pytest

import cortado as ct
from cortado.exprgraph.graph import post_order
from cortado.exprgraph.ops import GELU, GELU_GRAD, OPS, SIGMOID, SOFTPLUS
from cortado.exprgraph.term import apply
from cortado.rules.primitives import COMPOSITES, primitives

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "bool"]


def _values(dtype):
    dtype = np.dtype(ct.var("d", (), dtype).dtype)
    if dtype.kind == "b":
        return np.array([True, False])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array(sorted({int(info.min), -3 if info.min < 0 else 0, 1, 7, int(info.max)}), dtype)
    with np.errstate(over="ignore"):
        big = float(np.float32(np.finfo(np.float32).max)) if dtype.itemsize > 2 else 60000.0
        ordinary = np.linspace(-12, 12, 49)
        edges = [0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 89.0, -104.0, big, -big, np.inf, -np.inf, np.nan]
        return np.concatenate([ordinary, edges]).astype(dtype)


def test_the_composites_are_the_ops_with_a_formula():
    assert set(COMPOSITES) == {SIGMOID, SOFTPLUS, GELU, GELU_GRAD, OPS["silu"]}


@pytest.mark.parametrize("op", COMPOSITES, ids=lambda op: op.name)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_composite_spelled_out_computes_the_references_bits(op, dtype):
    x = ct.var("x", _values(dtype).shape, dtype)
    try:
        term = apply(op, (x,))
    except ct.DTypeError:
        pytest.skip(f"{op.name} does not take {dtype}")
    spelled = primitives.run(-term)  # below another op: the walk reaches it
    assert spelled.dtype == term.dtype and spelled.shape == term.shape
    assert not {t.op for t in post_order([spelled])} & set(COMPOSITES)
    feeds = {x: _values(dtype)}
    with np.errstate(all="ignore"):
        expected, got = ct.evaluate(-term, feeds), ct.evaluate(spelled, feeds)
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("backend", ["numpy"])
def test_a_compiled_program_runs_the_spelled_out_form(backend):
    """The program computes what the reference does; its kernels hold no composite (``explain`` lists primitives)."""
    x = ct.var("x", (5, 7))
    y = ct.sum(ct.gelu(x) * ct.sigmoid(x) + ct.softplus(-x))
    step = ct.compile([y, *ct.grad(y, [x])], inputs=[x], backend=backend)
    kernels = step.explain().split("\nkernels")[1]
    assert not [op.name for op in COMPOSITES if f"{op.name}(" in kernels]
    value = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32) * 4
    got = step(value)
    expected = ct.evaluate([y, *ct.grad(y, [x])], {x: value})
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_silu_is_its_formula_and_its_gradient_comes_from_it():
    """``silu`` is declared by its record (a formula) and its constructor only: no derivative rule, no emitter. Its
    value is ``x * sigmoid(x)``, and its gradient, walked through the formula, is ``s + x s (1 - s)``, finite where
    torch's is (x = -100, 100, 1e30)."""
    x = ct.var("x", (7,), "float64")
    values = np.array([-1e30, -100.0, -1.2784645427610738, -0.5, 0.0, 3.0, 1e30])
    e = np.exp(-np.abs(values))
    s = np.where(values >= 0, 1 / (1 + e), e / (1 + e))
    (value, gradient) = ct.evaluate([ct.silu(x), ct.grad(ct.sum(ct.silu(x)), [x])[0]], {x: values})
    np.testing.assert_allclose(value, values * s, rtol=1e-15)
    np.testing.assert_allclose(gradient, s + values * s * (1 - s), rtol=1e-12, atol=1e-300)
    assert np.isfinite(gradient).all()
    step = ct.compile([ct.grad(ct.sum(ct.silu(x) * x), [x])[0]], inputs=[x])
    np.testing.assert_allclose(step(values)[0],
                               ct.evaluate(ct.grad(ct.sum(ct.silu(x) * x), [x])[0], {x: values}), rtol=1e-12)


def test_silus_second_derivative_through_its_formula_is_right_at_zero():
    """The stable sigmoid's ``exp(-|x|)`` is spelled so that each branch differentiates as itself at 0: through
    ``abs`` (derivative 0 at 0) silu's second derivative at 0 was 0, not 1/2."""
    x = ct.var("x", (6,), "float64")
    values = np.array([-0.0, 0.0, -1e-3, 1e-300, 0.5, -30.0])
    (first,) = ct.grad(ct.sum(ct.silu(x)), [x])
    (second,) = ct.grad(ct.sum(first), [x])
    s = 1 / (1 + np.exp(-values))
    expected = s * (1 - s) * (2 + values * (1 - 2 * s))
    for got in (ct.evaluate(second, {x: values}), ct.compile([second], inputs=[x])(values)[0]):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-300)


def test_an_operand_read_twice_by_a_composite_gets_both_vjps():
    """The gradient through a formula puts a stand-in in each operand's place, so ``silu`` of ``x`` read through
    ``x * x`` and a composite reading one term twice each get every place's VJP."""
    x = ct.var("x", (3,), "float64")
    values = np.array([-2.0, 0.5, 1.5])
    got = ct.evaluate(ct.grad(ct.sum(ct.silu(x * x)), [x])[0], {x: values})
    s = 1 / (1 + np.exp(-values ** 2))
    np.testing.assert_allclose(got, (s + values ** 2 * s * (1 - s)) * 2 * values, rtol=1e-12)
