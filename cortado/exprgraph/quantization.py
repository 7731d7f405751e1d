"""Affine quantization as plain expressions: ``quantize``, ``dequantize`` and ``fake_quantize``, with
PyTorch's semantics, built from ``rint``, ``maximum``, ``minimum``, ``cast`` and ``stop_gradient`` so
that the rules see every step (and a lowering can recognise a quantized region by its pattern).

- ``quantize(x, s, z)`` = ``cast(clip(rint(x * (1 / s)) + z, qmin, qmax), int8 | uint8)``, computed
  in float32, ties to even; ``x`` is multiplied by the float32 reciprocal of the scale, as PyTorch's
  kernels do (``x / s`` would round a few values in a million the other way);
- ``dequantize(q, s, z)`` = ``(float32(q) - z) * s``;
- ``fake_quantize(x, s, z)`` = ``dequantize(quantize(x, s, z), s, z)`` in ``x``'s dtype, whose
  derivative is the straight-through estimator: the output's gradient where ``rint(x * (1 / s)) + z``
  is within the range, 0 outside (PyTorch's ``fake_quantize_per_*_affine``); none flows to ``s``, ``z``.

``scale`` and ``zero_point`` are numbers, arrays or terms: one for the tensor (``axis=None``), or
one per index of ``axis``. Arrays are checked when the expression is built: scales positive and
finite, zero points integers within the dtype's range.
"""

import numpy as np

from ..errors import DTypeError, ShapeError
from . import constructors as ct
from .dtypes import is_float
from .term import Term

RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _range(name, dtype):
    key = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if key not in RANGES:
        raise DTypeError(f"{name}: quantizes to {' or '.join(RANGES)}, not {dtype}")
    return key, RANGES[key]


def _axis(name, x, axis):
    if axis is None:
        return None
    if not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"{name}: axis {axis!r} is out of range for {x.dtype}[{','.join(map(str, x.shape))}]")
    return int(axis) % x.ndim


def _parameter(name, what, value, x, axis, check):
    """``value`` (a scale or zero point) as a float32 term broadcasting against ``x``: one value, or one per index
    of ``axis``, shaped to lie along it. An array's values are ``check``ed."""
    if isinstance(value, Term):
        term = value
    else:
        array = np.asarray(value)
        if array.dtype.kind not in "iuf":
            raise DTypeError(f"{name}: {what} must be numbers, not {array.dtype}")
        check(array.astype(np.float32))  # as the program will hold them: 1e-46 is 0 in float32
        term = ct.const(array.astype(np.float32))
    expected = () if axis is None else (x.shape[axis],)
    if term.shape != expected and not (axis is not None and term.shape == ()):
        per = "one value" if axis is None else f"one value per index of axis {axis} ({x.shape[axis]}), or one"
        raise ShapeError(f"{name}: {what} must be {per}, not shape {term.shape}")
    term = ct.cast(term, "float32") if term.dtype != np.float32 else term
    if axis is not None and term.ndim:
        term = ct.reshape(term, term.shape + (1,) * (x.ndim - axis - 1))
    return term


def _scale(name, value, x, axis):
    def check(array):
        if not (np.all(np.isfinite(array)) and np.all(array > 0)):
            raise ShapeError(f"{name}: scales must be positive and finite, not {array.tolist()}")
    return _parameter(name, "scale", value, x, axis, check)


def _zero_point(name, value, x, axis, bounds=None):
    def check(array):
        whole = np.all(np.asarray(array) == np.round(array))
        inside = bounds is None or np.all((array >= bounds[0]) & (array <= bounds[1]))
        if not (whole and inside):
            within = "" if bounds is None else f" within [{bounds[0]}, {bounds[1]}]"
            raise ShapeError(f"{name}: zero points must be integers{within}, not {np.asarray(array).tolist()}")
    return _parameter(name, "zero point", value, x, axis, check)


def _quantizing(name, x, scale, zero_point, dtype, axis):
    """The checked operands of ``quantize`` or ``fake_quantize``: ``x``, the dtype's name and range, the scale and
    zero point as float32 terms along ``axis``, and ``x``'s levels, ``rint(x * (1 / s)) + z`` in float32 before
    they are clamped (``rint(x * (1 / s))`` where ``z`` is the constant 0 and they are cast to integers: the sum
    differs only in the sign of a zero, which no integer has)."""
    x = ct.as_term(x)
    if not is_float(x.dtype):
        raise DTypeError(f"{name}: quantizes a floating tensor, not {x.dtype}; cast it first")
    dtype, (low, high) = _range(name, dtype)
    axis = _axis(name, x, axis)
    scale, zero_point = _scale(name, scale, x, axis), _zero_point(name, zero_point, x, axis, (low, high))
    levels = ct.rint(ct.cast(x, "float32") * (1.0 / scale))
    if not (name == "quantize" and _is_zero(zero_point)):
        levels = levels + zero_point
    return x, dtype, (float(low), float(high)), scale, zero_point, levels


def _is_zero(term):
    return term.op.name == "const" and term.attr("value").scalar == 0


def quantize(x, scale, zero_point=0, dtype="int8", axis=None):
    """``x`` (floating) as ``dtype`` (int8 or uint8): ``clamp(rint(x * (1 / scale)) + zero_point)`` into its range."""
    x, dtype, (low, high), _, _, levels = _quantizing("quantize", x, scale, zero_point, dtype, axis)
    return ct.cast(ct.minimum(ct.maximum(levels, low), high), dtype)


def dequantize(q, scale, zero_point=0, axis=None):
    """Integers ``q`` as float32 values: ``(q - zero_point) * scale``."""
    q = ct.as_term(q)
    if q.dtype.kind not in "iu":
        raise DTypeError(f"dequantize: takes integers (int8, uint8), not {q.dtype}")
    axis = _axis("dequantize", q, axis)
    return (ct.cast(q, "float32") - _zero_point("dequantize", zero_point, q, axis)) * _scale("dequantize", scale, q, axis)


def fake_quantize(x, scale, zero_point=0, dtype="int8", axis=None):
    """``dequantize(quantize(x))`` in ``x``'s dtype, differentiated as the straight-through estimator."""
    x, _, (low, high), scale, zero_point, levels = _quantizing("fake_quantize", x, scale, zero_point, dtype, axis)
    rounded = ct.stop_gradient((ct.minimum(ct.maximum(levels, low), high) - zero_point) * scale)
    inside = ct.where(levels >= low, levels <= high, False)
    wide = ct.cast(x, "float32")
    passed = rounded + (wide - ct.stop_gradient(wide))  # the value of rounded, the derivative of x
    return ct.cast(ct.where(inside, passed, rounded), x.dtype)
