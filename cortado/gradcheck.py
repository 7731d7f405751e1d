"""Symbolic gradients checked against finite differences, as ``torch.autograd.gradcheck`` does.

One check compares a directional derivative two ways, everything evaluated in float64: for
random cotangents ``c`` and a random direction ``v``, ``<vjp(outputs, wrt, c), v>`` against the
derivative of ``t -> <c, outputs(wrt + t v)>`` at 0 (order 1), or ``<u, H v>`` from ``ct.hvp``
against the derivative of ``t -> <u, grad(wrt + t v)>`` (order 2). The random vectors enter as
variables fed in float64, so nothing about them is rounded to the model's dtypes.

The numeric derivative is a central difference at steps ``h``, ``h/2``, ``h/4`` and ``h/8``,
Richardson-extrapolated. The point counts as smooth when that extrapolation has converged and
the one-sided differences from either side, extrapolated too, agree with each other: a kink
(``relu``, ``abs``, a near-tie of ``max``) within the step breaks one or the other.
"""

from dataclasses import dataclass

import numpy as np

from .backends.reference import evaluate
from .errors import FeedError
from .exprgraph import constructors as ct
from .exprgraph.dtypes import is_float
from .grad import grad, hvp, variables_of, vjp
from .exprgraph.graph import Graph, as_outputs

NOISE = 1e-13  # float64 rounding of an evaluated sum, relative to the sum of its terms' sizes
CONVERGED = 1e-3  # the extrapolated central differences agree to this, relative, at a smooth point
ONE_SIDED = 1e-5  # and the extrapolated one-sided differences from either side agree to this


@dataclass(frozen=True)
class GradientCheck:
    """One directional derivative, by the symbolic gradient and by finite differences."""

    symbolic: float
    numeric: float
    scale: float  # the size of the terms the difference quotients subtract: the noise floor
    smooth: bool  # no kink within the step: the numeric derivative can be trusted
    finite: bool  # every value evaluated was finite

    @property
    def error(self):
        """The relative error, no smaller than the difference quotients' rounding can resolve."""
        difference = abs(self.symbolic - self.numeric)
        return difference and difference / max(abs(self.symbolic), abs(self.numeric), self.scale)

    def close(self, rtol, atol):
        """Whether the two agree to ``rtol`` relative, or ``atol`` absolute for a derivative that
        is zero (whose symbolic value is the rounding left when terms of order one cancel)."""
        return abs(self.symbolic - self.numeric) <= atol + rtol * max(abs(self.symbolic), abs(self.numeric), self.scale)


def gradient_check(outputs, wrt, feeds, *, order=1, seed=0, step=1e-3, rules=None):
    """A ``GradientCheck`` of the gradients of ``outputs`` (the floating ones) with respect to
    ``wrt`` (a variable or a list of them) at ``feeds``, of first or second ``order``; random
    vectors from ``seed``, derivative ``rules`` as for ``ct.grad``."""
    if order not in (1, 2):
        raise ValueError(f"gradient_check: order must be 1 or 2, not {order!r}")
    outputs = [out for out in as_outputs(outputs) if is_float(out.dtype)]
    wrt = variables_of(wrt)
    feeds = _float64_feeds(feeds, wrt)
    rng = np.random.default_rng(seed)
    direction = _probe("direction", wrt, rng, feeds)
    weights = _probe("cotangent", outputs, rng, feeds)
    if order == 1:
        probed, symbolic = outputs, vjp(outputs, wrt, weights, rules=rules)
        along = direction
    else:
        f = sum((ct.sum(c * out) for c, out in zip(weights, outputs)), start=ct.const(0.0))
        probed = grad(f, wrt, rules=rules)
        weights = along = _probe("weight", wrt, rng, feeds)
        symbolic = hvp(f, wrt, direction, rules=rules)
    values = {}
    for t in (0, *(s * step / 2 ** k for k in range(4) for s in (1, -1))):
        values[t] = _projection(probed, weights, _moved(feeds, wrt, direction, t))
    symbolic_value = _dot(_evaluate(symbolic, feeds), [feeds[v.name] for v in along])
    return _compare(symbolic_value, values, step)


def check_grads(outputs, wrt, feeds, *, order=1, rtol=1e-6, atol=1e-12, seed=0, step=1e-3, rules=None):
    """Raise AssertionError where ``gradient_check`` finds the two derivatives apart by more than
    ``rtol`` relative and ``atol`` absolute, or cannot tell (a value is not finite, or a kink lies
    within the ``step``: a smaller one steps over fewer, a relu network's many); return the check otherwise."""
    check = gradient_check(outputs, wrt, feeds, order=order, seed=seed, step=step, rules=rules)
    if not check.finite:
        raise AssertionError(f"the outputs are not finite near these feeds, so nothing can be compared: {check}")
    if not check.smooth:
        raise AssertionError(f"the outputs are not smooth near these feeds (a kink lies within the step, {step:g}: "
                             f"a smaller step= may step over none): {check}")
    if not check.close(rtol, atol):
        raise AssertionError(f"order-{order} gradients disagree with finite differences: relative error "
                             f"{check.error:.3g} > {rtol:g} ({check})")
    return check


def _compare(symbolic, values, step):
    """The check, from the projection's ``{t: (value, size of its terms)}`` at the steps."""
    f = {t: value for t, (value, _) in values.items()}
    steps = [step / 2 ** k for k in range(4)]
    central = _richardson([(f[s] - f[-s]) / (2 * s) for s in steps], ratio=4)
    forward = _richardson([(f[s] - f[0]) / s for s in steps], ratio=2)
    backward = _richardson([(f[0] - f[-s]) / s for s in steps], ratio=2)
    scale = max(NOISE * size / abs(t) for t, (_, size) in values.items() if t)
    numeric, spread = central
    finite = bool(np.isfinite([symbolic, *f.values()]).all())
    magnitude = max(abs(numeric), scale)
    smooth = finite and spread <= CONVERGED * magnitude and abs(forward[0] - backward[0]) <= ONE_SIDED * magnitude
    return GradientCheck(symbolic, numeric, scale, smooth, finite)


def _richardson(estimates, ratio):
    """Richardson's extrapolation of ``estimates`` at steps halving each time, whose errors go as
    the step to the powers ``log2(ratio)``, twice that, ...: ``(best, how far its last two
    inputs were apart)``."""
    column = list(estimates)
    power = ratio
    while len(column) > 2:
        column = [(power * b - a) / (power - 1) for a, b in zip(column, column[1:])]
        power *= ratio
    best = (power * column[1] - column[0]) / (power - 1)
    return best, abs(column[1] - column[0])


def _float64_feeds(feeds, wrt):
    named = {key if isinstance(key, str) else key.name: value for key, value in feeds.items()}
    missing = [v.name for v in wrt if v.name not in named]
    if missing:
        raise FeedError(f"gradient_check: no feed for the variable(s) {missing} it differentiates with respect to")
    return {name: np.asarray(value, np.float64) if is_float(np.asarray(value).dtype) else value
            for name, value in named.items()}


def _probe(kind, terms, rng, feeds):
    """Variables of the terms' shapes and dtypes, fed standard normal float64 values in ``feeds``."""
    probes = []
    for i, t in enumerate(terms):
        probe = ct.var(f"gradcheck.{kind}{i}", t.shape, t.dtype)
        feeds[probe.name] = rng.standard_normal(t.shape)
        probes.append(probe)
    return probes


def _evaluate(terms, feeds):
    """``terms`` in float64, fed only the variables they read."""
    read = {v.name for v in Graph(terms).variables}
    return evaluate(terms, {k: v for k, v in feeds.items() if k in read}, precision="float64")


def _moved(feeds, wrt, direction, t):
    moved = dict(feeds)
    for w, d in zip(wrt, direction):
        moved[w.name] = feeds[w.name] + t * feeds[d.name]
    return moved


def _projection(terms, weights, feeds):
    """``sum_i <weights_i, terms_i>`` at ``feeds``, and the sum of its terms' absolute values."""
    values = _evaluate(terms, feeds)
    vectors = [feeds[w.name] for w in weights]
    return _dot(values, vectors), float(sum(np.sum(np.abs(v * w)) for v, w in zip(values, vectors)))


def _dot(values, vectors):
    return float(sum(np.sum(v * d) for v, d in zip(values, vectors)))
