"""The functions users build expressions with: ``ct.var``, ``ct.exp``, ``ct.matmul``, ...

Names and argument conventions are NumPy's. Each function turns its operands into terms
(Python scalars become *weak* constants, NumPy arrays strong ones, as under NEP 50), settles the
dtype of weak constants the way NumPy 2 would, and asks the op table for the term.
"""

import inspect

import numpy as np

from ..errors import DTypeError
from .dtypes import SUPPORTED, as_dtype
from .ops import OPS, UFUNC_OPS, Constant, ufunc_loop
from .term import RuleViolation, Term, apply, dtype_violation, make, rejection

__all__ = [
    "var", "const", "as_term",
    "negative", "exp", "log", "log1p", "expm1", "sqrt", "tanh", "abs", "sign", "sigmoid", "relu",
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "where", "cast",
    "sum", "mean", "max", "logsumexp", "softmax", "log_softmax",
    "matmul", "einsum", "transpose", "reshape", "broadcast_to",
]

_WEAK_TYPES = (int, float)


def var(name, shape, dtype="float32"):
    """A named input of the expression: a feed, a parameter or any other value given at run time."""
    return apply(OPS["var"], (), name=name, shape=shape, dtype=dtype)


def const(value, dtype=None):
    """A constant tensor. A Python int or float with no dtype stays weak, as in NumPy 2."""
    if isinstance(value, Term):
        raise DTypeError(f"const: {value!r} is already a term")
    if dtype is None and type(value) in _WEAK_TYPES:
        return make(OPS["const"], (), (Constant(_scalar_array(value), weak=True),))
    return make(OPS["const"], (), (Constant(_as_array(value, dtype)),))


def _scalar_array(value):
    array = np.asarray(value)
    if array.dtype not in SUPPORTED:
        raise DTypeError(f"const: the Python int {value} does not fit in int64")
    return array


def _as_array(value, dtype=None):
    try:
        array = np.asarray(value, dtype=None if dtype is None else as_dtype(dtype, context="const"))
    except OverflowError as error:
        raise DTypeError(f"const: {error}") from None
    except (TypeError, ValueError) as error:
        raise DTypeError(f"const: cannot make a tensor of {type(value).__name__} {value!r}: {error}") from None
    if array.dtype not in SUPPORTED:
        raise DTypeError(
            f"const: cannot make a tensor of {type(value).__name__} {value!r} (its dtype would be "
            f"{array.dtype}, which cortado does not support)"
        )
    return array


def as_term(value):
    """``value`` as a term: terms pass through, anything array-like becomes a constant."""
    return value if isinstance(value, Term) else const(value)


def is_weak(term):
    return term.op is OPS["const"] and term.attrs[0].weak


def _weak_value(term):
    return term.attrs[0].array.item()


def _materialise(term, dtype, op_name, operands):
    """A weak constant as a strong one of ``dtype``; out-of-range Python ints are refused."""
    if not is_weak(term):
        return term
    try:
        return make(OPS["const"], (), (Constant(np.asarray(_weak_value(term), dtype=dtype)),))
    except OverflowError as error:
        raise rejection(op_name, operands, dtype_violation(str(error))) from None


def _promotion_key(term):
    if is_weak(term):
        value = _weak_value(term)
        return type(value) if type(value) in _WEAK_TYPES else np.dtype(bool)
    return term.dtype


def _terms(operands):
    return [as_term(x) for x in operands]


def _settle_defaults(op_name, terms):
    """Weak constants at their default dtype (float64 for a float, int64 for an int)."""
    return [_materialise(t, t.dtype, op_name, terms) for t in terms]


_COMPARISONS = {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}


def _fits(value, dtype):
    return dtype.kind not in "iu" or np.iinfo(dtype).min <= value <= np.iinfo(dtype).max


def _comparison_dtype(value, dtype):
    """NumPy 2 compares an integer with a Python int out of its range exactly: widen to fit."""
    if type(value) is int and not _fits(value, dtype):
        return np.result_type(dtype, np.min_scalar_type(value))
    return dtype


def _ufunc_call(name, *operands):
    terms = _terms(operands)
    if any(is_weak(t) for t in terms):
        try:
            loop = ufunc_loop(UFUNC_OPS[name], tuple(_promotion_key(t) for t in terms))
        except RuleViolation as violation:
            raise rejection(name, _settle_defaults(name, terms), violation) from None
        if name in _COMPARISONS:
            loop = [_comparison_dtype(_weak_value(t), d) if is_weak(t) else d for t, d in zip(terms, loop)]
        terms = [_materialise(t, dtype, name, terms) for t, dtype in zip(terms, loop)]
    return apply(OPS[name], terms)


def _call(name, *operands, **params):
    terms = _terms(operands)
    return apply(OPS[name], _settle_defaults(name, terms), **params)


# -- elementwise -----------------------------------------------------------------------------


def _ufunc_function(name, doc=None):
    """The constructor of an op that is exactly a NumPy ufunc: same name, operands, dtypes."""
    ufunc = UFUNC_OPS[name]

    def build(*operands):
        if len(operands) != ufunc.nin:
            raise TypeError(f"{name} takes {ufunc.nin} operand(s), got {len(operands)}")
        return _ufunc_call(name, *operands)

    build.__name__ = build.__qualname__ = name
    build.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_ONLY) for p in ("x", "y")[: ufunc.nin]])
    build.__doc__ = doc or f"NumPy's ``{ufunc.__name__}``, elementwise, with broadcasting and NumPy's promotion."
    return build


negative = _ufunc_function("negative")
exp = _ufunc_function("exp")
log = _ufunc_function("log")
log1p = _ufunc_function("log1p", "``log(1 + x)``, accurate for small ``x``.")
expm1 = _ufunc_function("expm1", "``exp(x) - 1``, accurate for small ``x``.")
sqrt = _ufunc_function("sqrt")
tanh = _ufunc_function("tanh")
abs = _ufunc_function("abs")  # noqa: A001 (NumPy's name)
sign = _ufunc_function("sign")
add = _ufunc_function("add")
subtract = _ufunc_function("subtract")
multiply = _ufunc_function("multiply")
divide = _ufunc_function("divide", "True division, as NumPy's ``/``: integers divide into floats.")
maximum = _ufunc_function("maximum")
minimum = _ufunc_function("minimum")
less = _ufunc_function("less")
less_equal = _ufunc_function("less_equal")
greater = _ufunc_function("greater")
greater_equal = _ufunc_function("greater_equal")
equal = _ufunc_function("equal", "Elementwise ``x == y`` (on terms, ``==`` itself is identity).")
not_equal = _ufunc_function("not_equal", "Elementwise ``x != y`` (on terms, ``!=`` itself is identity).")


def sigmoid(x):
    """``1 / (1 + exp(-x))``, computed without overflow for large ``|x|``."""
    return _call("sigmoid", x)


def relu(x):
    """``maximum(x, 0)``."""
    return _call("relu", x)


def power(x, y):
    """``x ** y``; an integer base with a negative constant integer exponent is refused, as in NumPy."""
    result = _ufunc_call("power", x, y)
    base, exponent = result.args
    if base.dtype.kind in "iu" and exponent.op is OPS["const"] and (exponent.attrs[0].array < 0).any():
        raise rejection("power", result.args, dtype_violation("integers to negative integer powers are not allowed"))
    return result


def where(condition, x, y):
    """``x`` where ``condition`` is true, else ``y``; shapes broadcast, dtypes promote."""
    terms = _terms((condition, x, y))
    if any(is_weak(t) for t in terms[1:]):
        dtype = np.result_type(*(_weak_value(t) if is_weak(t) else t.dtype for t in terms[1:]))
        terms[1:] = [_materialise(t, dtype, "where", terms) for t in terms[1:]]
    return apply(OPS["where"], _settle_defaults("where", terms))


def cast(x, dtype):
    """``x`` converted to ``dtype`` (NumPy's ``astype``)."""
    return _call("cast", x, dtype=dtype)


# -- reductions ------------------------------------------------------------------------------


def sum(x, axis=None, keepdims=False):  # noqa: A001 (NumPy's name)
    return _call("sum", x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return _call("mean", x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001 (NumPy's name)
    return _call("max", x, axis=axis, keepdims=keepdims)


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x), axis))``, computed without overflow."""
    return _call("logsumexp", x, axis=axis, keepdims=keepdims)


def softmax(x, axis=-1):
    """``exp(x) / sum(exp(x), axis, keepdims=True)``, computed without overflow."""
    return _call("softmax", x, axis=axis)


def log_softmax(x, axis=-1):
    """``x - logsumexp(x, axis, keepdims=True)``."""
    return _call("log_softmax", x, axis=axis)


# -- contractions and layout -----------------------------------------------------------------


def matmul(x, y):
    """NumPy's ``@``: 1-d operands are promoted and demoted, batch dimensions broadcast."""
    return _call("matmul", x, y)


def einsum(subscripts, *operands):
    """NumPy's einsum: any subscripts NumPy accepts, normalised so equal einsums are one term."""
    return _call("einsum", *operands, subscripts=subscripts)


def transpose(x, axes=None):
    return _call("transpose", x, axes=axes)


def reshape(x, shape):
    return _call("reshape", x, shape=shape)


def broadcast_to(x, shape):
    return _call("broadcast_to", x, shape=shape)
