"""The scales of float8 values: powers of two, chosen from a largest magnitude (an amax), so that scaling is exact.

A float8 value holds few digits over a small range (e4m3: 448 at most, e5m2: 57344), so a tensor is multiplied by a
scale before its cast, and its product divided by the scales after. A power of two times a binary floating-point
number changes only its exponent: while every result stays a normal number, scaling is exact and commutes with
every rounding, sums included, so ``(q * s) @ w`` and ``(q @ w) * s`` are the same bits. The lowering moves such
scales out of float8 products and into cuBLASLt's scale (``backends/cupy/lowering/float8.py``), which it could not
do for a scale such as ``448 / amax``. ``exponents`` finds the scales the rules may move, and the range of their
exponents, from which those rules prove every result normal.

    scale = scale_for(amax, "float8_e4m3fn")    # 2^k, the largest with amax * 2^k <= 448, or 1 where amax is 0
    x8 = ct.cast(x * scale, "float8_e4m3fn")

Delayed scaling takes ``scale_for`` of the largest of a history of past amaxes (a step-state vector), to which
each step ``pushed`` its own.
"""

import math

import numpy as np

from . import constructors as ct
from .dtypes import finfo
from .ops import BROADCAST_TO, CAST, CONST, DIVIDE, MAXIMUM, MINIMUM, MULTIPLY, POWER, RESHAPE, RINT, WHERE
from .slicing import concatenate

# the powers of two a scale takes: 2^-40 to 2^40, room for a gradient as small as 5e-8 to fill e5m2's range, and
# narrow enough that two scales together (a gradient's and a weight's) keep every sum of a float8 product of up to
# 2^16 terms a normal float32 (``lowering/float8.py`` checks it)
EXPONENTS = (-40, 40)


def scale_for(amax, dtype):
    """``2^k``: the largest power of two (``k`` within ``EXPONENTS``) for which ``amax * 2^k`` is at most ``dtype``'s
    largest value, so that a cast of the values scaled by it saturates none of them; 1 where ``amax`` is 0 (nothing
    measured yet) or NaN. ``amax`` is a float32 term of one value."""
    low, high = EXPONENTS
    headroom = ct.log(float(finfo(np.dtype(dtype)).max) / amax) * (1 / math.log(2))  # log2 of how far amax may grow
    k = ct.minimum(ct.maximum(ct.rint(headroom - 0.5), float(low)), float(high))  # rint(z - 0.5) <= z
    return ct.where(amax > 0, ct.power(2.0, k), 1.0)


def pushed(history, amax):
    """``history`` (a vector of the largest magnitudes of past steps, newest first) with ``amax`` in front and its
    oldest entry dropped: a delayed scale's next history."""
    newest = ct.reshape(amax, (1,))
    return concatenate([newest, history[:-1]]) if history.shape[0] > 1 else newest


def _constant_exponent(t):
    """``k`` where ``t`` is the constant ``2^k``, else None."""
    value = t.attr("value").scalar if t.op is CONST else None
    if value is None or not np.isfinite(value) or value <= 0:
        return None
    mantissa, k = math.frexp(float(value))
    return (k - 1, k - 1) if mantissa == 0.5 else None


def _clamped_exponent(t):
    """``(low, high)`` where ``t`` is ``rint(z)`` clamped into ``[low, high]`` by a ``minimum`` and a ``maximum``
    of constants (nested either way, either operand order); else None."""
    bounds = {}
    while t.op in (MINIMUM, MAXIMUM):
        constants = [a for a in t.args if a.op is CONST and a.attr("value").scalar is not None]
        if len(constants) != 1 or t.op in bounds:
            return None
        bounds[t.op] = float(constants[0].attr("value").scalar)
        t = next(a for a in t.args if a is not constants[0])
    if t.op is not RINT or set(bounds) != {MINIMUM, MAXIMUM} or bounds[MAXIMUM] > bounds[MINIMUM]:
        return None
    return math.ceil(bounds[MAXIMUM]), math.floor(bounds[MINIMUM])


def is_exact_power_of_two(t):
    """Whether ``t`` is ``2 ** k`` of a clamped integer ``k`` (as ``scale_for`` writes it): a power a kernel can make
    exactly (``ldexp``), where a general ``pow`` may be a unit off."""
    return t.op is POWER and _constant_exponent(t.args[0]) == (1, 1) and _clamped_exponent(t.args[1]) is not None


def exponents(t):
    """``(low, high)``: ``t`` (one value, of any shape it is broadcast to) is ``2^k`` for an integer ``k`` from
    ``low`` to ``high``, or NaN; None where that is not known. Powers of two are recognised as ``scale_for`` writes
    them, as constants, and as products, quotients and choices (``where``) of powers of two."""
    while t.op in (BROADCAST_TO, RESHAPE) or (t.op is CAST and t.dtype == np.float32):
        t = t.args[0]
    if t.ndim:
        return None
    if t.op is CONST:
        return _constant_exponent(t)
    if t.op is POWER:
        base, k = t.args
        return _clamped_exponent(k) if _constant_exponent(base) == (1, 1) else None
    if t.op is WHERE:
        found = [exponents(a) for a in t.args[1:]]
        return None if None in found else (min(f[0] for f in found), max(f[1] for f in found))
    if t.op in (MULTIPLY, DIVIDE):
        a, b = (exponents(x) for x in t.args)
        if a is None or b is None:
            return None
        return (a[0] + b[0], a[1] + b[1]) if t.op is MULTIPLY else (a[0] - b[1], a[1] - b[0])
    return None
