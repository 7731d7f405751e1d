"""Symbolic gradients checked against finite differences, as ``torch.autograd.gradcheck`` does.

One check compares a directional derivative two ways, everything evaluated in float64: for
random cotangents ``c`` and a random direction ``v``, ``<vjp(outputs, wrt, c), v>`` against the
central difference of ``t -> <c, outputs(wrt + t v)>`` (order 1), or ``<u, H v>`` from
``ct.hvp`` against the central difference of ``<u, grad(wrt + t v)>`` (order 2). The difference
quotients at steps ``h``, ``h/2`` and ``h/4`` are Richardson-extrapolated twice; when the two
extrapolations disagree, a kink (``relu``, ``abs``, a tie of ``max``) lies within reach of
the step and the point tells nothing: the check says it is not ``smooth``.
"""

from dataclasses import dataclass

import numpy as np

from .backends.reference import evaluate
from .exprgraph import constructors as ct
from .exprgraph.grad import grad, hvp, vjp
from .exprgraph.graph import Graph, as_outputs

NOISE = 1e-13  # float64 rounding of an evaluated sum, relative to the sum of its terms' sizes


@dataclass(frozen=True)
class GradientCheck:
    """One directional derivative, by the symbolic gradient and by finite differences."""

    symbolic: float
    numeric: float
    scale: float  # the size of the terms the difference quotients subtract: the noise floor
    smooth: bool

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
    """A ``GradientCheck`` of the gradients of ``outputs`` (floating ones) with respect to the
    variables ``wrt`` at ``feeds``, of first or second ``order``; random vectors from ``seed``,
    derivative ``rules`` as for ``ct.grad``."""
    if order not in (1, 2):
        raise ValueError(f"gradient_check: order must be 1 or 2, not {order!r}")
    rng = np.random.default_rng(seed)
    outputs = [out for out in as_outputs(outputs) if out.dtype.kind == "f"]
    wrt = list(wrt)
    feeds = {_name(k): np.asarray(v, np.float64) if _is_float(v) else v for k, v in feeds.items()}
    direction = _random(rng, wrt)  # in the variables' dtypes, so float64 sees the same vectors
    weights = _random(rng, outputs)
    if order == 1:
        probed, symbolic = outputs, vjp(outputs, wrt, _consts(weights, outputs), rules=rules)
    else:
        f = _total([ct.sum(c * out) for c, out in zip(_consts(weights, outputs), outputs)])
        probed, weights = grad(f, wrt, rules=rules), _random(rng, wrt)
        symbolic = hvp(f, wrt, _consts(direction, wrt), rules=rules)
    along = _dot(_evaluate(symbolic, feeds), direction if order == 1 else weights)
    quotients, scale = [], 0.0
    for h in (step, step / 2, step / 4):
        ahead, size_ahead = _projection(probed, weights, _moved(feeds, wrt, direction, h))
        behind, size_behind = _projection(probed, weights, _moved(feeds, wrt, direction, -h))
        quotients.append((ahead - behind) / (2 * h))
        scale = max(scale, NOISE * (size_ahead + size_behind) / h)
    first = [(4 * b - a) / 3 for a, b in zip(quotients, quotients[1:])]
    second = (16 * first[1] - first[0]) / 15
    smooth = abs(first[1] - first[0]) <= 1e-3 * max(abs(first[1]), scale)
    return GradientCheck(along, second, scale, smooth)


def check_grads(outputs, wrt, feeds, *, order=1, rtol=1e-6, atol=1e-12, seed=0, rules=None):
    """Raise AssertionError where ``gradient_check`` finds the two derivatives apart by more than
    ``rtol`` relative and ``atol`` absolute (or the point is not smooth enough to tell); return
    the check otherwise."""
    check = gradient_check(outputs, wrt, feeds, order=order, seed=seed, rules=rules)
    if not check.smooth:
        raise AssertionError(f"the outputs are not smooth near these feeds (a kink lies within the step): {check}")
    if not check.close(rtol, atol):
        raise AssertionError(f"order-{order} gradients disagree with finite differences: relative error "
                             f"{check.error:.3g} > {rtol:g} ({check})")
    return check


def _name(key):
    return key if isinstance(key, str) else key.name


def _is_float(value):
    return np.asarray(value).dtype.kind == "f"


def _random(rng, terms):
    """Normal float64 arrays of the terms' shapes, holding values of the terms' dtypes."""
    return [rng.standard_normal(t.shape).astype(t.dtype).astype(np.float64) for t in terms]


def _consts(arrays, terms):
    return [ct.const(a, dtype=t.dtype) for a, t in zip(arrays, terms)]


def _total(terms):
    total = terms[0] if terms else ct.const(0.0)
    for term in terms[1:]:
        total = total + term
    return total


def _evaluate(terms, feeds):
    """``terms`` in float64, fed only the variables they read."""
    read = {v.name for v in Graph(terms).variables}
    return evaluate(terms, {k: v for k, v in feeds.items() if k in read}, precision="float64")


def _moved(feeds, wrt, direction, h):
    moved = dict(feeds)
    for w, d in zip(wrt, direction):
        moved[w.name] = feeds[w.name] + h * d
    return moved


def _projection(terms, weights, feeds):
    """``sum_i <weights_i, terms_i>`` at ``feeds``, and the sum of its terms' absolute values."""
    values = _evaluate(terms, feeds)
    return _dot(values, weights), float(sum(np.sum(np.abs(v * w)) for v, w in zip(values, weights)))


def _dot(values, vectors):
    return float(sum(np.sum(v * d) for v, d in zip(values, vectors)))
