"""The numbers and formulas every backend must compute alike, defined once.

gelu (in its tanh form), sigmoid and softplus, gelu's derivative and the softmax family's shift by
its maximum are written here and nowhere else, with arithmetic operators and an array namespace
``xp`` only, so one definition serves NumPy arrays (the reference semantics of each op's record)
and terms (``rules.primitives`` spells the composite ops out in primitives with the constructors,
before any backend emits a kernel, and the derivative and decomposition rules build with them).
"""

import math

# gelu(x) = x/2 (1 + tanh(GELU_SCALE (x + GELU_CUBIC x^3))), the tanh form (JAX's default, cuBLASLt's epilogue)
GELU_SCALE = math.sqrt(2 / math.pi)
GELU_CUBIC = 0.044715


def exp_minus_abs(x, xp):
    """``exp(-|x|)``, which never overflows, with ``-|x|`` spelled ``-x`` where ``x >= 0``, else ``x``: each side then
    differentiates as its own branch does at 0 (through ``abs``, whose derivative at 0 is 0, a composite
    differentiated through its formula, silu, had a second derivative of 0 at 0, not 1/2). One spelling for every
    formula below, so a kernel computing two of them computes it once."""
    return xp.exp(xp.where(xp.greater_equal(x, 0), xp.negative(x), x))


def sigmoid(x, xp):
    """``1 / (1 + exp(-x))`` from ``e = exp(-|x|)``: ``r = 1 / (1 + e)`` where ``x >= 0``, else ``e r``. Only
    ``1 + e``, between 1 and 2, is ever divided by: a GPU's division of a subnormal ``e`` (``x`` beyond -87) takes a
    slow path, and with such values in one element of 100 gelu's kernel took 2.6 times as long."""
    e = exp_minus_abs(x, xp)
    r = 1 / (1 + e)
    return xp.where(xp.greater_equal(x, 0), r, e * r)


def softplus(x, xp):
    """``log(1 + exp(x))`` as ``max(x, 0) + log1p(exp(-|x|))``, which neither overflows nor loses the small values."""
    return xp.maximum(x, 0) + xp.log1p(exp_minus_abs(x, xp))


def gelu(x, xp):
    """gelu in its tanh form, as ``x sigmoid(z)`` (``gelu_argument``)."""
    return x * sigmoid(gelu_argument(x), xp)


def gelu_grad(x, xp):
    """``sigmoid(z) + x sigmoid(z) sigmoid(-z) z'``, the sigmoids' product as ``e r^2`` with ``e = exp(-|z|)`` and
    ``r = 1 / (1 + e)`` (``sigmoid``'s), which neither overflows nor cancels; it is 0 far out, where it multiplies
    ``x`` before ``z'`` does, so the result is finite wherever ``x * x`` is."""
    z = gelu_argument(x)
    e = exp_minus_abs(z, xp)
    r = 1 / (1 + e)
    return sigmoid(z, xp) + x * (e * (r * r)) * gelu_slope(x)


def gelu_argument(x):
    """``z = 2 GELU_SCALE (x + GELU_CUBIC x^3)``: as ``1 + tanh(z / 2) = 2 sigmoid(z)``, gelu is
    ``x sigmoid(z)``, which loses nothing where tanh is near -1 (``1 + tanh`` would cancel)."""
    return (x * x * GELU_CUBIC + 1) * x * (2 * GELU_SCALE)


def gelu_slope(x):
    """``dz/dx = 2 GELU_SCALE (1 + 3 GELU_CUBIC x^2)``."""
    return (x * x * (3 * GELU_CUBIC) + 1) * (2 * GELU_SCALE)


def shifted(x, axes, xp):
    """``(x - peak, peak)``: ``peak`` the max of ``x`` over ``axes`` (kept), or 0 where that max is
    infinite or NaN. The softmax family computes from the shifted values, whose exponentials never
    overflow; an infinite max is left unsubtracted, so the logsumexp of a row of ``-inf`` is
    ``-inf``, not NaN. ``xp`` is the namespace of ``max``, ``where``, ``less``, ``abs`` and
    ``subtract``: ``numpy`` for arrays, cortado's constructors for terms."""
    peak = finite_peak(xp.max(x, axis=axes, keepdims=True), xp)
    return xp.subtract(x, peak), peak


def finite_peak(peak, xp):
    """``peak`` where finite, else 0: the shift of ``shifted``, for one that shifts in place (attention)."""
    return xp.where(xp.less(xp.abs(peak), math.inf), peak, 0)
