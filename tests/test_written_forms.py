"""The forms people write for sigmoid, softplus, log-sigmoid, log-softmax, logsumexp, log-mean-exp and
binary cross-entropy with logits compile to programs whose values and gradients are finite wherever the
fused op's are (for every finite float32 input), and equal to the fused op's up to float32 rounding.

``exp(x) / (1 + exp(x))`` at ``x = 89`` is ``inf / inf`` as written, and ``log(mean(exp(x)))`` overflows
at ``x = 100``; the ``stability`` rules make them ``sigmoid`` and ``logsumexp - log(n)``, in the model
``compile`` runs and in the model ``grad`` differentiates.
"""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from peers import needs_torch

import cortado as ct
from cortado.backends import gpu_visible
from cortado.rules import simplify
from cortado.rules.stability import stabiliser


@dataclass(frozen=True)
class Form:
    """A written form of the fused op ``fused`` over ``axis`` (keeping dims or not)."""

    written: Callable  # (x, y) -> term: y holds labels, read by cross-entropy only
    fused: str
    shape: tuple = (6,)
    axis: object = None
    keepdims: bool = False

    @property
    def labelled(self):
        return self.fused == "bce"


def _sigmoid_of(s):
    """Binary cross-entropy of logits ``x`` and labels ``y`` written over a sigmoid ``s(x)``."""
    return lambda x, y: -(y * ct.log(s(x)) + (1 - y) * ct.log(1 - s(x)))


exp, log = ct.exp, ct.log
MATRIX = (3, 4)
FORMS = {
    "exp(x) / (1 + exp(x))": Form(lambda x, y: exp(x) / (1 + exp(x)), "sigmoid"),
    "exp(x) / (exp(x) + 1)": Form(lambda x, y: exp(x) / (exp(x) + 1), "sigmoid"),
    "1 / (1 + exp(-x))": Form(lambda x, y: 1 / (1 + exp(-x)), "sigmoid"),
    "1 / (exp(-x) + 1)": Form(lambda x, y: 1 / (exp(-x) + 1), "sigmoid"),
    "1 - 1 / (1 + exp(x))": Form(lambda x, y: 1 - 1 / (1 + exp(x)), "sigmoid"),
    "log(1 + exp(x))": Form(lambda x, y: log(1 + exp(x)), "softplus"),
    "log(exp(x) + 1)": Form(lambda x, y: log(exp(x) + 1), "softplus"),
    "log1p(exp(x))": Form(lambda x, y: ct.log1p(exp(x)), "softplus"),
    "log(sigmoid(x))": Form(lambda x, y: log(ct.sigmoid(x)), "log_sigmoid"),
    "-log(1 + exp(-x))": Form(lambda x, y: -log(1 + exp(-x)), "log_sigmoid"),
    "log(1 / (1 + exp(-x)))": Form(lambda x, y: log(1 / (1 + exp(-x))), "log_sigmoid"),
    "log(exp(x) / (1 + exp(x)))": Form(lambda x, y: log(exp(x) / (1 + exp(x))), "log_sigmoid"),
    "log(1 - 1 / (1 + exp(x)))": Form(lambda x, y: log(1 - 1 / (1 + exp(x))), "log_sigmoid"),
    "x - log(sum(exp(x), 1, keepdims))": Form(
        lambda x, y: x - log(ct.sum(exp(x), axis=1, keepdims=True)), "log_softmax", MATRIX, 1),
    "x - logsumexp(x, 0, keepdims)": Form(lambda x, y: x - ct.logsumexp(x, axis=0, keepdims=True),
                                          "log_softmax", MATRIX, 0),
    "log(exp(x) / sum(exp(x), 1, keepdims))": Form(
        lambda x, y: log(exp(x) / ct.sum(exp(x), axis=1, keepdims=True)), "log_softmax", MATRIX, 1),
    "log(exp(x) / sum(exp(x)))": Form(lambda x, y: log(exp(x) / ct.sum(exp(x))), "log_softmax", MATRIX),
    "log(softmax(x, 1))": Form(lambda x, y: log(ct.softmax(x, axis=1)), "log_softmax", MATRIX, 1),
    "log(sum(exp(x)))": Form(lambda x, y: log(ct.sum(exp(x))), "logsumexp", MATRIX),
    "log(sum(exp(x), 1))": Form(lambda x, y: log(ct.sum(exp(x), axis=1)), "logsumexp", MATRIX, 1),
    "log(sum(exp(x), 0, keepdims))": Form(lambda x, y: log(ct.sum(exp(x), axis=0, keepdims=True)),
                                          "logsumexp", MATRIX, 0, True),
    "log(mean(exp(x)))": Form(lambda x, y: log(ct.mean(exp(x))), "log_mean_exp", MATRIX),
    "log(mean(exp(x), 1))": Form(lambda x, y: log(ct.mean(exp(x), axis=1)), "log_mean_exp", MATRIX, 1),
    "log(mean(exp(x), 0, keepdims))": Form(lambda x, y: log(ct.mean(exp(x), axis=0, keepdims=True)),
                                           "log_mean_exp", MATRIX, 0, True),
    "bce over sigmoid(x)": Form(_sigmoid_of(ct.sigmoid), "bce"),
    "bce over 1 / (1 + exp(-x))": Form(_sigmoid_of(lambda x: 1 / (1 + exp(-x))), "bce"),
    "bce over exp(x) / (1 + exp(x))": Form(_sigmoid_of(lambda x: exp(x) / (1 + exp(x))), "bce"),
}
EXTREMES = [89.0, 100.0, -100.0, -104.0, 1e4, -1e4, 88.7, -87.3, 30.0, 0.0, -1.0, 1000.0]


# -- the fused ops in float64 NumPy: value, and the gradient of sum(w * value) -------------------


def sigmoid(x):
    return 0.5 * (1 + np.tanh(x / 2))  # no exp, so no overflow


def logsumexp(x, axis, keepdims=False):
    top = x.max(axis=axis, keepdims=True)
    total = np.log(np.exp(x - top).sum(axis=axis, keepdims=True)) + top
    return total if keepdims else np.squeeze(total, axis)


def softmax(x, axis):
    return np.exp(x - logsumexp(x, axis, keepdims=True))


def spread(w, axis, keepdims):
    """A reduction's weights with its reduced axes back as size 1."""
    return w if keepdims or axis is None else np.expand_dims(w, axis)


def _log_mean_exp(x, y, w, a, k):
    value, gradient = _logsumexp(x, y, w, a, k)
    return value - math.log(x.size // value.size), gradient


def _logsumexp(x, y, w, a, k):
    return logsumexp(x, a, k), spread(w, a, k) * softmax(x, a)


REFERENCES = {  # fused op -> (x, y, w, axis, keepdims) -> (value, gradient in x)
    "sigmoid": lambda x, y, w, a, k: (sigmoid(x), w * sigmoid(x) * sigmoid(-x)),
    "softplus": lambda x, y, w, a, k: (np.logaddexp(0, x), w * sigmoid(x)),
    "log_sigmoid": lambda x, y, w, a, k: (-np.logaddexp(0, -x), w * sigmoid(-x)),
    "logsumexp": _logsumexp,
    "log_mean_exp": _log_mean_exp,
    "log_softmax": lambda x, y, w, a, k: (x - logsumexp(x, a, keepdims=True),
                                          w - softmax(x, a) * w.sum(axis=a, keepdims=True)),
    "bce": lambda x, y, w, a, k: (y * np.logaddexp(0, -x) + (1 - y) * np.logaddexp(0, x), w * (sigmoid(x) - y)),
}


# -- compiling each form once ----------------------------------------------------------------


def _variables(form):
    return ct.var("x", form.shape), ct.var("y", form.shape)


def _weights(form):
    """Fixed weights of the form's output shape, away from 0, so every element of the gradient counts."""
    x, y = _variables(form)
    return np.random.default_rng(0).uniform(0.5, 2.0, form.written(x, y).shape).astype(np.float32)


@functools.cache
def compiled(name, backend="numpy"):
    """The program computing the written form and the gradient of ``sum(w * form)`` in ``x``."""
    form = FORMS[name]
    x, y = _variables(form)
    value = form.written(x, y)
    gradient = ct.grad(ct.sum(value * ct.const(_weights(form))), x)
    return ct.compile([value, gradient], inputs=[x, y] if form.labelled else [x], backend=backend)


def run(name, x, y, backend="numpy"):
    feeds = {"x": x, "y": y} if FORMS[name].labelled else {"x": x}
    return [np.asarray(a.get() if hasattr(a, "get") else a) for a in compiled(name, backend)(**feeds)]


def expected(name, x, y):
    form = FORMS[name]
    return REFERENCES[form.fused](x.astype(np.float64), y.astype(np.float64), _weights(form).astype(np.float64),
                                  form.axis, form.keepdims)


def assert_close(ours, reference):
    """Equal up to float32 rounding: relative, with an absolute floor at the largest value's scale."""
    scale = max(1.0, float(np.abs(reference).max(initial=0)))
    np.testing.assert_allclose(ours, reference, rtol=2e-5, atol=2e-6 * scale)


def check(name, x, y):
    value, gradient = run(name, x, y)
    reference_value, reference_gradient = expected(name, x, y)
    for ours, reference in ((value, reference_value), (gradient, reference_gradient)):
        assert np.isfinite(reference).all()  # the fused op is finite at every finite input
        assert ours.dtype == np.float32 and ours.shape == reference.shape
        assert np.isfinite(ours).all(), f"{name} at {x}: {ours}"
        assert_close(ours, reference)


def extremes(shape, shift=0):
    return np.resize(np.roll(np.float32(EXTREMES), shift), shape)


def labels(shape):
    return np.resize(np.float32([0.0, 1.0, 0.25, 1.0, 0.0, 0.5, 1.0]), shape)


# -- the properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [0, 5])
@pytest.mark.parametrize("name", FORMS)
def test_written_forms_are_finite_and_fused_at_the_extremes(name, shift):
    shape = FORMS[name].shape
    check(name, extremes(shape, shift), labels(shape))


logits = st.one_of(st.sampled_from([float(np.float32(s * e)) for e in EXTREMES for s in (1, -1)]),
                   st.floats(-1e4, 1e4, width=32),
                   st.floats(-120, 120, width=32))


@settings(max_examples=25)
@given(data=st.data())
@pytest.mark.parametrize("name", FORMS)
def test_written_forms_match_the_fused_op_wherever_it_is_finite(name, data):
    shape = FORMS[name].shape
    x = data.draw(hnp.arrays(np.float32, shape, elements=logits), label="x")
    y = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0, 1, width=32)), label="y")
    check(name, x, y)


@pytest.mark.parametrize("name", FORMS)
def test_no_overflowing_op_is_left_for_compile_or_for_grad(name):
    """``compile`` simplifies and then stabilises; ``grad`` stabilises the model as written: either
    way no ``exp`` (nor ``log`` or ``divide`` of one) is left to overflow."""
    x, y = _variables(FORMS[name])
    written = FORMS[name].written(x, y)
    for stable in (stabiliser.run(simplify(written)), stabiliser.run(written)):
        ops = {t.op.name for t in ct.Graph([stable]).schedule}
        assert not ops & {"exp", "log", "log1p", "divide", "mean"}, (name, stable)


def test_evaluate_computes_the_form_as_written_and_grad_the_stable_one():
    """``ct.evaluate`` is the reference interpreter: it computes what the expression says, nan at 89
    for ``exp(x) / (1 + exp(x))``; its gradient is taken of ``sigmoid`` and is finite everywhere."""
    x = ct.var("x", (3,))
    written = exp(x) / (1 + exp(x))
    feeds = {"x": np.float32([89, 100, -100])}
    assert np.isnan(ct.evaluate(written, feeds)[:2]).all()
    np.testing.assert_allclose(ct.evaluate(ct.grad(ct.sum(written), x), feeds), [0, 0, 3.8e-44], atol=1e-45)


def test_log_mean_exp_is_logsumexp_less_the_log_of_the_count():
    x = ct.var("x", (3, 4), "float64")
    assert stabiliser.run(log(ct.mean(exp(x), axis=1))) is ct.logsumexp(x, axis=1) - math.log(4)
    i = ct.var("i", (3, 4), "int32")
    assert stabiliser.run(log(ct.mean(exp(i)))) is log(ct.mean(exp(i)))  # integers are left alone


def test_log_softmax_written_with_a_reduction_that_does_not_broadcast_back_is_left_alone():
    """``x - logsumexp(x, 1)`` without keepdims subtracts row sums from columns: no log-softmax."""
    x = ct.var("x", (4, 4))
    written = x - ct.logsumexp(x, axis=1)
    assert stabiliser.run(written) is written


# -- against torch's fused ops, where torch is installed -----------------------------------------


def _torch_fused(torch, form, x, y):
    """torch's one op for the form (``log_mean_exp``: its logsumexp less the log of the count)."""
    functional = torch.nn.functional
    if form.fused == "log_softmax":  # over every axis: over the flattened tensor
        flat = form.axis is None
        return torch.log_softmax(x.reshape(-1) if flat else x, dim=0 if flat else form.axis).reshape(x.shape)
    if form.fused in ("logsumexp", "log_mean_exp"):
        dims = tuple(range(x.ndim)) if form.axis is None else form.axis
        out = torch.logsumexp(x, dim=dims, keepdim=form.keepdims)
        return out - math.log(x.numel() // out.numel()) if form.fused == "log_mean_exp" else out
    if form.fused == "bce":
        return functional.binary_cross_entropy_with_logits(x, y, reduction="none")
    return {"sigmoid": torch.sigmoid, "softplus": functional.softplus, "log_sigmoid": functional.logsigmoid}[form.fused](x)


@needs_torch
@pytest.mark.parametrize("name", FORMS)
def test_written_forms_match_torch_where_torch_is_finite(name):
    import torch

    form = FORMS[name]
    for x in (extremes(form.shape), extremes(form.shape, 5), np.float32(np.linspace(-30, 30, math.prod(form.shape)))
              .reshape(form.shape)):
        xt = torch.tensor(x, requires_grad=True)
        out = _torch_fused(torch, form, xt, torch.tensor(labels(form.shape)))
        (out * torch.tensor(_weights(form))).sum().backward()
        for ours, theirs in zip(run(name, x, labels(form.shape)), (out.detach().numpy(), xt.grad.numpy())):
            assert np.isfinite(ours[np.isfinite(theirs)]).all()
            assert_close(ours, theirs.astype(np.float64))


# -- on the GPU: stability runs before the backend's lowering, so the cupy program is finite too ----


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("name", ["exp(x) / (1 + exp(x))", "1 - 1 / (1 + exp(x))", "log(1 + exp(x))",
                                  "log(mean(exp(x)))", "x - log(sum(exp(x), 1, keepdims))",
                                  "bce over exp(x) / (1 + exp(x))"])
def test_written_forms_are_finite_on_the_gpu(name):
    shape = FORMS[name].shape
    x, y = np.resize(np.float32([89, 100, -100]), shape), labels(shape)
    for _ in range(3):  # eager, then captured, then replayed
        value, gradient = run(name, x, y, backend="cupy")
        reference_value, reference_gradient = expected(name, x, y)
        assert np.isfinite(value).all() and np.isfinite(gradient).all()
        np.testing.assert_allclose(value, reference_value, rtol=2e-4, atol=2e-5 * max(1, np.abs(reference_value).max()))
        np.testing.assert_allclose(gradient, reference_gradient, rtol=2e-4, atol=2e-5)
