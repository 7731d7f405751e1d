"""gelu and gelu_grad: values against the tanh formula in 150-digit decimals, the NumPy backend
bit for bit against the reference, derivatives against finite differences to the third order, the
form of gelu's gradient, and the errors."""

from decimal import Decimal, localcontext

import numpy as np
import pytest

import cortado as ct
from cortado.exprgraph.dtypes import as_dtype, finfo
from cortado.exprgraph.numerics import gelu_argument, gelu_slope
from cortado.gradcheck import check_grads

DTYPES = ["float16", "bfloat16", "float32", "float64"]
PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803482534211706")


def tanh_formula(x):
    """``(gelu(x), gelu'(x))`` as written, ``x/2 (1 + tanh u)`` and ``(1 + tanh u)/2 + x/2 (1 - tanh^2 u) u'``
    with ``u = sqrt(2/pi) (x + 0.044715 x^3)``, in decimals precise enough that ``1 + tanh u`` keeps
    its digits for ``|x| <= 10``."""
    with localcontext() as context:
        context.prec = 150
        x, a = Decimal(float(x)), Decimal("0.044715")
        k = (2 / PI).sqrt()
        e = (2 * k * (x + a * x ** 3)).exp()
        t = (e - 1) / (e + 1)
        return float(x / 2 * (1 + t)), float((1 + t) / 2 + x / 2 * (1 - t * t) * k * (1 + 3 * a * x * x))


def _sigmoid(z):
    return np.exp(-np.logaddexp(0, -z))


def _points(dtype):
    """Points across [-10, 10] in ``dtype``: both tails, gelu's minimum and around 0."""
    points = np.concatenate([np.linspace(-10, 10, 801), [-0.7524614, 1e-3, -1e-3, 0.0]])
    return points.astype(np.float32).astype(dtype)


def _both(outputs, x, values):
    """The values from the reference interpreter and from the NumPy backend."""
    return ct.evaluate(outputs, {"x": values}), ct.compile(outputs, inputs=[x])(x=values)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_and_gelu_grad_are_the_tanh_formula_to_rounding(dtype):
    """Off by a rounding of the result, and by the roundings of the argument ``z`` (a few), which
    the tails amplify by ``|z|``; gelu_grad's relative to its two terms, which cancel near -0.75."""
    dtype = as_dtype(dtype)
    values = _points(dtype)
    x = ct.var("x", values.shape, dtype)
    wide = values.astype(np.float64)
    exact = np.array([tanh_formula(v) for v in wide])
    z = gelu_argument(wide)
    terms = [np.abs(exact[:, 0]), _sigmoid(z) + np.abs(wide * gelu_slope(wide)) * _sigmoid(z) * _sigmoid(-z)]
    info, inner = finfo(dtype), float(finfo(np.float32 if dtype.itemsize == 2 else dtype).eps)  # what they compute in
    for results in _both([ct.gelu(x), ct.gelu_grad(x)], x, values):
        for k, result in enumerate(results):
            assert result.dtype == x.dtype
            error = np.abs(result.astype(np.float64) - exact[:, k])
            bound = (float(info.eps) + 2 * inner * (4 + np.abs(z))) * terms[k] + float(info.tiny)
            assert (error <= bound).all(), (k, wide[error > bound])


@pytest.mark.usefixtures("blas_products")
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_numpy_backend_computes_what_the_reference_does_bit_for_bit(dtype):
    x, w = ct.var("x", (16, 8), dtype), ct.var("w", (8, 8), dtype)
    pre = x @ w + 0.5
    outputs = [ct.gelu(pre), ct.grad(ct.sum(ct.gelu(pre) * x), w), ct.gelu_grad(x), ct.sum(ct.gelu(x), axis=1)]
    rng = np.random.default_rng(0)
    feeds = {"x": (3 * rng.standard_normal((16, 8))).astype(x.dtype), "w": rng.standard_normal((8, 8)).astype(w.dtype)}
    program = ct.compile(outputs, inputs=[x, w], debug=True)
    for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        assert ours.dtype == expected.dtype
        np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("order", [1, 2])
def test_gelu_and_gelu_grad_differentiate_as_finite_differences_say(order):
    x = ct.var("x", (41,), "float64")
    at = {"x": np.linspace(-6, 6, 41) + 0.01}
    check_grads(ct.gelu(x), x, at, order=order)
    check_grads(ct.gelu_grad(x), x, at, order=order)  # order 2: gelu's third derivative
    X, W, b = ct.var("X", (5, 4), "float64"), ct.var("W", (4, 3), "float64"), ct.var("b", (3,), "float64")
    rng = np.random.default_rng(1)
    model = {"X": rng.standard_normal((5, 4)), "W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    check_grads(ct.sum(ct.gelu(X @ W + b) ** 2), [W, b], model, order=order)


def test_the_gradient_of_gelu_is_the_adjoint_times_gelu_grad():
    """The form a GPU lowering folds into a GEMM's DGELU epilogue."""
    z, c = ct.var("z", (4, 3)), ct.var("c", (4, 3))
    assert ct.grad(ct.sum(ct.gelu(z)), z) is ct.gelu_grad(z)
    assert ct.grad(ct.sum(ct.gelu(z) * c), z) is c * ct.gelu_grad(z)
    assert "gelu_grad(z)" in str(ct.Graph(ct.grad(ct.sum(ct.gelu(z) * c), z)))


@pytest.mark.parametrize("build", [ct.gelu, ct.gelu_grad])
def test_gelu_takes_floats_only(build):
    for operand in (ct.var("n", (3,), "int32"), ct.var("b", (3,), "bool"), 2):
        with pytest.raises(ct.DTypeError, match=rf"{build.__name__}\(.*\): needs a floating operand, not (int|bool)"):
            build(operand)
    assert build(ct.var("h", (3,), "float16")).dtype == np.float16


@pytest.mark.parametrize("op", [ct.sigmoid, ct.gelu, ct.gelu_grad])
def test_sigmoid_gelu_and_its_gradient_divide_only_by_one_plus_an_exponential(op):
    """Spelled out in primitives, every division has ``1 + exp(-|z|)`` (between 1 and 2) for its divisor and 1 for
    its dividend: never the exponential itself, which is subnormal beyond -87, where a GPU divides slowly."""
    from cortado.exprgraph.graph import post_order
    from cortado.rules.primitives import primitives

    (spelled,) = primitives.run([op(ct.var("x", (4,)))])
    divisions = [t for t in post_order([spelled]) if t.op.name == "divide"]
    assert divisions and all(t.args[0].op.name == "const" and t.args[1].op.name == "add" for t in divisions)
