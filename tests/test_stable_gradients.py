"""Gradients of numerically fragile forms are those of their stable ops: finite at logits near ±1000,
where differentiating ``log(sum(exp(x)))`` as written gives nan, and equal to the analytic ones."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cortado as ct
from cortado.rules import Trace, simplify
from cortado.rules.stability import stabiliser

DTYPES = ["float32", "float64"]
EXTREMES = np.array([[1000.0, 0.0, -1000.0], [-1000.0, 3.0, 1000.0], [0.5, -1000.0, 2.0]])
TOLERANCE = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-14)}


# -- the analytic values, in float64 NumPy --------------------------------------------------


def sigmoid(x):
    return 0.5 * (1 + np.tanh(x / 2))  # no exp, so no overflow


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_hvp(p, v, axis):
    """The softmax's Jacobian times ``v``: ``p * (v - sum(p * v))``, which is also the Hessian of
    logsumexp times ``v``."""
    return p * (v - (p * v).sum(axis=axis, keepdims=True))


def spread(w, axis, keepdims):
    """A reduction's cotangent ``w`` with its reduced axis back as size 1."""
    return w if keepdims or axis is None else np.expand_dims(w, axis)


# -- the forms: (fragile form, the stable op written directly, gradient, Hessian times v) ------
# each of a weighted sum ``sum(w * form(x))``; ``a`` is the axis, ``k`` keepdims


def _logsumexp(a, k):
    return (lambda x: ct.log(ct.sum(ct.exp(x), axis=a, keepdims=k)),
            lambda x: ct.logsumexp(x, axis=a, keepdims=k),
            lambda x, w: spread(w, a, k) * softmax(x, a),
            lambda x, w, v: spread(w, a, k) * softmax_hvp(softmax(x, a), v, a))


def _log_softmax(a):
    return (lambda x: ct.log(ct.softmax(x, axis=a)),
            lambda x: ct.log_softmax(x, axis=a),
            lambda x, w: w - softmax(x, a) * w.sum(axis=a, keepdims=True),
            lambda x, w, v: -w.sum(axis=a, keepdims=True) * softmax_hvp(softmax(x, a), v, a))


def _log_one_minus_sigmoid(written):
    return (lambda x: written(ct.sigmoid(x)),
            lambda x: -ct.softplus(x),
            lambda x, w: -w * sigmoid(x),
            lambda x, w, v: -w * sigmoid(x) * sigmoid(-x) * v)


FORMS = {
    "log-sum-exp": _logsumexp(None, False),
    "log-sum-exp-axis0": _logsumexp(0, False),
    "log-sum-exp-axis1-keepdims": _logsumexp(1, True),
    "log-softmax-axis0": _log_softmax(0),
    "log-softmax-axis1": _log_softmax(1),
    "log-sigmoid": (lambda x: ct.log(ct.sigmoid(x)),
                    lambda x: -ct.softplus(-x),
                    lambda x, w: w * sigmoid(-x),
                    lambda x, w, v: -w * sigmoid(x) * sigmoid(-x) * v),
    "log-1-minus-sigmoid": _log_one_minus_sigmoid(lambda s: ct.log(1 - s)),
    "log-minus-sigmoid-plus-1": _log_one_minus_sigmoid(lambda s: ct.log(-s + 1)),
    "log-1-plus-minus-sigmoid": _log_one_minus_sigmoid(lambda s: ct.log(1 + -s)),
    "log1p-minus-sigmoid": _log_one_minus_sigmoid(lambda s: ct.log1p(-s)),
}


def weighted_loss(form, x, w):
    y = form(x)
    return ct.sum(y * ct.const(w.astype(x.dtype)))


def weights(form, x, seed=0):
    """Cotangent weights of the form's output shape, away from 0 so every element counts."""
    shape = form(ct.var("probe", x.shape, "float64")).shape
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape)


def fragile_loss(fragile, dtype):
    """``(x, w, loss)``: the fragile form's weighted loss over a variable of the extremes' shape."""
    x = ct.var("x", EXTREMES.shape, dtype)
    w = weights(fragile, x)
    return x, w, weighted_loss(fragile, x, w)


# -- at logits near ±1000 ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FORMS)
def test_gradients_of_fragile_forms_are_finite_and_analytic(name, dtype):
    fragile, _, gradient, _ = FORMS[name]
    x, w, loss = fragile_loss(fragile, dtype)
    g = ct.grad(loss, x)
    value = ct.evaluate(g, {"x": EXTREMES.astype(dtype)})
    assert value.dtype == dtype and np.isfinite(value).all()
    np.testing.assert_allclose(value, gradient(EXTREMES, w), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FORMS)
def test_compiled_losses_and_gradients_are_finite_and_analytic(name, dtype):
    fragile, stable, gradient, _ = FORMS[name]
    x, w, loss = fragile_loss(fragile, dtype)
    step = ct.compile([loss, ct.grad(loss, x)], inputs=[x], backend="numpy")
    loss_value, gradient_value = step(x=EXTREMES.astype(dtype))
    expected_loss = ct.evaluate(weighted_loss(stable, x, w), {"x": EXTREMES.astype(dtype)})
    assert np.isfinite(loss_value) and np.isfinite(gradient_value).all()
    np.testing.assert_allclose(loss_value, expected_loss, **TOLERANCE[dtype])
    np.testing.assert_allclose(gradient_value, gradient(EXTREMES, w), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FORMS)
def test_second_order_gradients_are_finite_and_analytic(name, dtype):
    fragile, _, _, hessian_times = FORMS[name]
    x, w, loss = fragile_loss(fragile, dtype)
    v = np.random.default_rng(1).uniform(-1, 1, EXTREMES.shape)
    hv = ct.hvp(loss, x, ct.const(v.astype(dtype)))
    grad_of_grad = ct.grad(ct.sum(ct.grad(loss, x) * ct.const(v.astype(dtype))), x)
    for value in ct.evaluate([hv, grad_of_grad], {"x": EXTREMES.astype(dtype)}):
        assert np.isfinite(value).all()
        np.testing.assert_allclose(value, hessian_times(EXTREMES, w, v), **TOLERANCE[dtype])


def test_gradients_are_those_of_the_stable_ops_and_share_their_terms():
    """Stabilised before differentiating, a fragile form's gradient is the very term the stable
    op's is, and the stabilised loss (what compile runs) shares its terms with the gradient."""
    x = ct.var("x", (4, 5))
    for name, (fragile, stable, _, _) in FORMS.items():
        assert ct.grad(ct.sum(fragile(x)), x) is ct.grad(ct.sum(stable(x)), x), name
    loss = ct.sum(ct.log(ct.softmax(x, axis=1)) * ct.const(np.arange(20, dtype=np.float32).reshape(4, 5)))
    ops = [t.op.name for t in ct.Graph([stabiliser.run(loss), ct.grad(loss, x)]).schedule]
    assert ops.count("log_softmax") == 1 and "softmax" not in ops and "log" not in ops


@pytest.mark.parametrize("name", [n for n in FORMS if "sigmoid" in n])
def test_every_written_form_is_caught_with_or_without_simplify_first(name):
    """compile simplifies before it stabilises, grad stabilises the model as written: both end at
    the same stable term."""
    fragile, stable, _, _ = FORMS[name]
    x = ct.var("x", (3,))
    assert stabiliser.run(fragile(x)) is stable(x)
    assert stabiliser.run(simplify(fragile(x))) is stable(x)


def test_the_trace_records_the_stabilisation():
    x = ct.var("x", (3,))
    trace = Trace()
    ct.grad(ct.log(ct.sum(ct.exp(x))) + ct.sum(ct.log(-ct.sigmoid(x) + 1)), x, trace=trace)
    counts = trace.counts()
    assert counts["logsumexp"] == 1 and counts["log1p-right"] == 1 and counts["log1p-negative-sigmoid"] == 1
    assert counts["dlogsumexp/d_x"] == 1 and counts["dsoftplus/d_x"] == 1 and counts["dlog/d_x"] == 0


# -- the stable ops' own derivatives at extreme inputs -----------------------------------------

STABLE_OPS = {  # op, inputs where it is finite, its derivative, its second derivative (elementwise ops)
    "softplus": (ct.softplus, [1000.0, 0.0, -1000.0], sigmoid, lambda x: sigmoid(x) * sigmoid(-x)),
    "sigmoid": (ct.sigmoid, [1000.0, 0.0, -1000.0], lambda x: sigmoid(x) * sigmoid(-x),
                lambda x: sigmoid(x) * sigmoid(-x) * (sigmoid(-x) - sigmoid(x))),
    "log1p": (ct.log1p, [1000.0, 0.0, -0.5], lambda x: 1 / (1 + x), lambda x: -1 / (1 + x) ** 2),
    "expm1": (ct.expm1, [-1000.0, 0.0, 80.0], np.exp, np.exp),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", STABLE_OPS)
def test_elementwise_stable_ops_have_finite_derivatives_at_extremes(name, dtype):
    op, points, first, second = STABLE_OPS[name]
    x, points = ct.var("x", (3,), dtype), np.array(points)
    g = ct.grad(ct.sum(op(x)), x)
    gg = ct.grad(ct.sum(g), x)
    for value, expected in zip(ct.evaluate([g, gg], {"x": points.astype(dtype)}), [first(points), second(points)]):
        assert np.isfinite(value).all()
        np.testing.assert_allclose(value, expected, rtol=TOLERANCE[dtype]["rtol"], atol=TOLERANCE[dtype]["atol"])


# -- away from the extremes, fragile and stable agree everywhere ---------------------------------

moderate = st.floats(-30, 30, allow_nan=False, allow_infinity=False)


@given(name=st.sampled_from(sorted(FORMS)), dtype=st.sampled_from(DTYPES),
       values=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=5), elements=moderate),
       seed=st.integers(0, 2**32 - 1))
def test_fragile_and_stable_forms_have_equal_gradients(name, dtype, values, seed):
    fragile, stable, gradient, hessian_times = FORMS[name]
    x = ct.var("x", values.shape, dtype)
    w = weights(fragile, x, seed)
    v = np.random.default_rng(seed).uniform(-1, 1, values.shape).astype(dtype)
    feeds = {"x": values.astype(dtype)}
    gradients = []
    for form in (fragile, stable):
        loss = weighted_loss(form, x, w)
        gradients.append(ct.evaluate([ct.grad(loss, x), ct.hvp(loss, x, ct.const(v))], feeds))
    (g_fragile, h_fragile), (g_stable, h_stable) = gradients
    np.testing.assert_array_equal(g_fragile, g_stable)
    np.testing.assert_array_equal(h_fragile, h_stable)
    x64 = feeds["x"].astype(np.float64)
    np.testing.assert_allclose(g_fragile, gradient(x64, w), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h_fragile, hessian_times(x64, w, v.astype(np.float64)), rtol=1e-4, atol=1e-5)
