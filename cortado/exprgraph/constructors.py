"""The functions users build expressions with: ``ct.var``, ``ct.exp``, ``ct.matmul``, ...

Names and argument conventions are NumPy's. Each function turns its operands into terms
(operands.py: Python scalars stay weak until the op's dtype is settled, as under NEP 50) and
asks the op table for the term.
"""

import functools
import inspect
import itertools

import numpy as np

from .operands import WEAK_TYPES, Scalar, at_default_dtypes, const_array, materialise, operands, strong_const
from .ops import (
    CONST, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, OPS, UFUNC_OPS, VAR, WHERE, Constant, dtype_attr, ufunc_loop,
    weak_scalars_as_bfloat16,
)
from ..errors import ShapeError
from .dtypes import is_float
from . import gathering
from .location import called_by_user
from .ops.reductions import one_axis
from .term import (
    RuleViolation, Term, apply, describe_operands, dtype_violation, make, rejection, shape_violation, user_call,
)

__all__ = [
    "var", "const", "as_term",
    "negative", "exp", "log", "log1p", "expm1", "sqrt", "tanh", "sin", "cos", "abs", "sign", "rint", "sigmoid", "relu",
    "softplus", "gelu", "gelu_grad", "silu",
    "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "power", "maximum", "minimum",
    "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
    "logical_and", "logical_or", "logical_xor", "logical_not", "where", "cast", "stop_gradient", "float8_gradient",
    "sum", "mean", "max", "logsumexp", "softmax", "log_softmax",
    "matmul", "einsum", "transpose", "reshape", "broadcast_to", "flip", "take", "take_along_axis", "add_at",
    "conv", "windows", "overlap_add", "pad", "conv2d", "max_pool2d", "avg_pool2d", "random_uniform",
]


def var(name, shape, dtype="float32"):
    """A named input of the expression: a feed, a parameter or any other value given at run time."""
    return apply(VAR, (), name=name, shape=shape, dtype=dtype)


def const(value, dtype=None):
    """A constant tensor. A Python int or float with no dtype stays weak, as in NumPy 2."""
    try:
        if isinstance(value, Term):
            raise dtype_violation(f"{value!r} is already a term")
        if dtype is not None:
            return strong_const(value, dtype_attr(dtype, "dtype"))
        array = const_array(value)
        return make(CONST, (), (Constant(array, weak=type(value) in WEAK_TYPES),))
    except RuleViolation as violation:
        raise rejection("const", (), violation) from None


def as_term(value):
    """``value`` as a term: terms pass through, anything array-like becomes a constant."""
    return value if isinstance(value, Term) else const(value)


# x OP v, for a Python int v beyond every value of x's integer dtype, has one answer everywhere;
# x OP' bound (bound: the dtype's max or min) has that same answer and keeps x's shape. So NumPy 2's
# exact comparison with out-of-range ints needs no wider dtype (none is exact past int64).
_BEYOND = {  # name: ((op, bound) for v above the range, (op, bound) for v below it)
    "less": ((LESS_EQUAL, "max"), (LESS, "min")),
    "less_equal": ((LESS_EQUAL, "max"), (LESS, "min")),
    "greater": ((GREATER, "max"), (GREATER_EQUAL, "min")),
    "greater_equal": ((GREATER, "max"), (GREATER_EQUAL, "min")),
    "equal": ((GREATER, "max"), (LESS, "min")),
    "not_equal": ((LESS_EQUAL, "max"), (GREATER_EQUAL, "min")),
}
_MIRRORED = {"less": "greater", "less_equal": "greater_equal", "greater": "less",
             "greater_equal": "less_equal", "equal": "equal", "not_equal": "not_equal"}


def _out_of_range_comparison(name, terms):
    """``x OP v`` with a Python int ``v`` outside x's integer dtype, answered exactly; else None."""
    if isinstance(terms[0], Scalar):
        name, terms = _MIRRORED[name], terms[::-1]
    x, v = terms
    if not (isinstance(x, Term) and isinstance(v, Scalar) and type(v.value) is int and x.dtype.kind in "iu"):
        return None
    info = np.iinfo(x.dtype)
    if info.min <= v.value <= info.max:
        return None
    op, bound = _BEYOND[name][0 if v.value > info.max else 1]
    return apply(op, [x, strong_const(getattr(info, bound), x.dtype)])


def _ufunc_call(name, *values):
    terms = operands(name, values)
    if not any(isinstance(t, Scalar) for t in terms):
        return apply(OPS[name], terms)
    if name in _BEYOND and len(terms) == 2:
        exact = _out_of_range_comparison(name, terms)
        if exact is not None:
            return exact
    keys = tuple(t.promotion_key if isinstance(t, Scalar) else t.dtype for t in terms)
    try:
        loop = ufunc_loop(UFUNC_OPS[name], keys)
    except RuleViolation as violation:
        raise rejection(name, terms, violation) from None
    return apply(OPS[name], [materialise(t, dtype, name, terms) for t, dtype in zip(terms, loop)])


def _call(name, *values, **params):
    return apply(OPS[name], at_default_dtypes(name, operands(name, values)), **params)


# -- elementwise -----------------------------------------------------------------------------


def _ufunc_function(name, doc=None):
    """The constructor of an op that is exactly a NumPy ufunc: same name, operands, dtypes."""
    ufunc = UFUNC_OPS[name]

    def build(*values):
        if len(values) != ufunc.nin:
            raise TypeError(f"{name} takes {ufunc.nin} operand(s), got {len(values)}")
        return _ufunc_call(name, *values)

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
sin = _ufunc_function("sin", "NumPy's ``sin`` (radians). The GPU's is CUDA's: a few ulps from NumPy's at most.")
cos = _ufunc_function("cos", "NumPy's ``cos`` (radians). The GPU's is CUDA's: a few ulps from NumPy's at most.")
abs = _ufunc_function("abs")  # noqa: A001 (NumPy's name)
sign = _ufunc_function("sign")
rint = _ufunc_function("rint", "The nearest integer, ties to even (NumPy's ``rint``), in ``x``'s floating dtype.")
add = _ufunc_function("add")
subtract = _ufunc_function("subtract")
multiply = _ufunc_function("multiply")
divide = _ufunc_function("divide", "True division, as NumPy's ``/``: integers divide into floats.")
floor_divide = _ufunc_function("floor_divide", "NumPy's ``//``: the quotient rounded toward minus infinity (Python's "
                                               "rule for negative operands); an integer divided by 0 is 0, as in "
                                               "NumPy, and a float's quotient is NumPy's to the bit.")
remainder = _ufunc_function("remainder", "NumPy's ``%``: ``x - floor_divide(x, y) * y``, of the divisor's sign; an "
                                         "integer's by 0 is 0, a float's NaN, as in NumPy.")
maximum = _ufunc_function("maximum")
minimum = _ufunc_function("minimum")
less = _ufunc_function("less")
less_equal = _ufunc_function("less_equal")
greater = _ufunc_function("greater")
greater_equal = _ufunc_function("greater_equal")
equal = _ufunc_function("equal", "Elementwise ``x == y`` (on terms, ``==`` itself is identity).")
not_equal = _ufunc_function("not_equal", "Elementwise ``x != y`` (on terms, ``!=`` itself is identity).")
logical_and = _ufunc_function("logical_and", "NumPy's ``logical_and``: bool, a number true where it is not 0 (NaN "
                                             "too). On bool terms, ``x & y``.")
logical_or = _ufunc_function("logical_or", "NumPy's ``logical_or``; on bool terms, ``x | y``.")
logical_xor = _ufunc_function("logical_xor", "NumPy's ``logical_xor``; on bool terms, ``x ^ y``.")
logical_not = _ufunc_function("logical_not", "NumPy's ``logical_not``; on a bool term, ``~x``.")


def sigmoid(x):
    """``1 / (1 + exp(-x))``, computed without overflow for large ``|x|``."""
    return _call("sigmoid", x)


def relu(x):
    """``maximum(x, 0)``."""
    return _call("relu", x)


def softplus(x):
    """``log(1 + exp(x))``, computed without overflow for large ``|x|``."""
    return _call("softplus", x)


def gelu(x):
    """GELU in its tanh form, ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``: JAX's default,
    PyTorch's ``approximate="tanh"``, cuBLASLt's epilogue. Floating ``x`` only."""
    return _call("gelu", x)


def silu(x):
    """``x * sigmoid(x)`` (swish), PyTorch's ``silu``: computed from the stable sigmoid."""
    return _call("silu", x)


def gelu_grad(x):
    """``d gelu(x) / dx``, elementwise: gelu's gradient is ``dy * gelu_grad(x)``, one op a GPU
    lowering can fold into a GEMM's DGELU epilogue. Floating ``x`` only."""
    return _call("gelu_grad", x)


def power(x, y):
    """``x ** y``; an integer base with a negative constant integer exponent is refused, as in NumPy."""
    result = _ufunc_call("power", x, y)
    exponent = result.args[1]
    if result.dtype.kind in "iu" and exponent.op is CONST and (exponent.attr("value").array < 0).any():
        raise rejection("power", result.args, dtype_violation("integers to negative integer powers are not allowed"))
    return result


def where(condition, x, y):
    """``x`` where ``condition`` is true (nonzero), else ``y``; shapes broadcast, dtypes promote."""
    terms = operands("where", (condition, x, y))
    if any(isinstance(t, Scalar) for t in terms[1:]):
        keys = weak_scalars_as_bfloat16(tuple(t.value if isinstance(t, Scalar) else t.dtype for t in terms[1:]))
        try:
            dtype = np.result_type(*keys)
        except (OverflowError, TypeError) as error:
            reason = f"NumPy cannot promote {terms[1]!r} with {terms[2]!r}: {error}"
            raise rejection("where", terms, dtype_violation(reason)) from None
        terms[1:] = [materialise(t, dtype, "where", terms) for t in terms[1:]]
    return apply(WHERE, at_default_dtypes("where", terms))


def cast(x, dtype):
    """``x`` converted to ``dtype`` (NumPy's ``astype``)."""
    return _call("cast", x, dtype=dtype)


def float8_gradient(x, dtype="float8_e5m2", history=None):
    """``x``, whose cotangent is rounded to float8 (e5m2 unless ``dtype`` says otherwise) on its way back: scaled by a
    power of two (``scaling.scale_for``), rounded, and scaled back. Float8 training marks a product's output with it,
    so that the gradients of its operands are float8 products too. A compiled program computes it as ``x``.

    Without ``history`` the scale comes from the cotangent's own largest magnitude (two passes over it: its amax,
    then its cast). With ``history``, a float32 vector of the largest magnitudes of past steps (a step-state
    buffer), it comes from their maximum (delayed scaling, as Transformer Engine's: one pass, values beyond the
    history's range saturating), and the gradient of ``history`` is its next value: the cotangent's largest
    magnitude pushed in front, the oldest dropped (``scaling.pushed``), which the step takes as its new state
    (``Module.state_updates``)."""
    return _call("float8_gradient", x, dtype=dtype) if history is None else \
        _call("float8_gradient", x, history, dtype=dtype)


def stop_gradient(x):
    """``x``, whose derivative is 0 (JAX's ``stop_gradient``): what a gradient treats as a constant. A compiled
    program computes it as ``x``."""
    return _call("stop_gradient", x)


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


def flip(x, axis=None):
    """NumPy's ``flip``: ``x`` with the order of its elements reversed along ``axis`` (None: all axes)."""
    return _call("flip", x, axis=axis)


# -- gathering by index terms ----------------------------------------------------------------


def _flattened(x):
    x = as_term(x)
    return x if x.ndim == 1 else reshape(x, (x.size,))


def take(x, indices, axis=None):
    """NumPy's ``take``: the elements of ``x`` at ``indices`` (an integer term, or a list or array of ints) along
    ``axis`` (None: of ``x`` flattened); shape ``x.shape[:axis] + indices.shape + x.shape[axis + 1:]``. Negative
    indices count from the end. One outside the axis is an ``IndexRangeError`` on the CPU; the GPU clamps it into
    the axis (it never reads out of bounds). The gradient adds the adjoint's rows back where they were taken
    (``add_at``), a repeated index's rows summed in one fixed order, the same bits on every run."""
    return _gather("take", x, indices, axis)


def add_at(x, indices, values, axis=None):
    """``x`` with ``values`` added at ``indices`` along ``axis`` (None: of ``x`` flattened), a repeated index's
    values summed: NumPy's ``np.add.at(x, ...)``, with ``x`` itself unchanged. ``values`` has the shape
    ``take(x, indices, axis)`` has, or broadcasts to it; an array or number is taken in ``x``'s dtype, a term keeps
    its own (the result's is that of ``x + values``); floats for an integer ``x`` are refused (``np.add.at`` would
    truncate each, 0.5 to 0, where ``x + 0.5`` is a float). Indices as ``take``'s. The values added at one place are summed
    first, then added to ``x``, in one fixed order: each chunk of 1024 indices' values in order, then the chunks'
    sums in order (float16 and bfloat16 in float32, rounded once); so the result is the same bits on every run and
    every backend, the GPU's too, with no atomics. ``take``'s gradient is this."""
    x = as_term(x)
    flat = axis is None
    target = _flattened(x) if flat else x
    indices = as_term(indices)
    try:  # the axis first: the values are shaped to it
        along = 0 if flat else one_axis(axis, x.ndim)
    except RuleViolation as violation:
        raise rejection("add_at", (x, indices), violation) from None
    if not isinstance(values, Term):
        given = np.asarray(values).dtype
        if given.kind in "fc" and x.dtype.kind in "iub":  # 0.5 into int32 would be 0: a silent wrong answer
            raise rejection("add_at", (x, indices), dtype_violation(
                f"{given.name} values cannot be added into {x.dtype.name} x without changing them (np.add.at would "
                f"truncate each, 0.5 to 0): cast x first, or give the values as a term, whose dtype the result then "
                f"takes, as x + values"))
        values = const(values, x.dtype)
    size = target.shape[along]
    taken = target.shape[:along] + indices.shape + target.shape[along + 1:]
    if values.shape != taken:
        values = broadcast_to(values, taken)
    scattered = _call("add_at", values, indices, axis=along, size=size)
    if called_by_user():
        call = f"add_at({describe_operands((x, indices, values))}, axis={axis!r})"
        gathering.written_gather(call, scattered, None if flat else scattered.attr("axis"), size)
    result = target + scattered
    return reshape(result, x.shape) if flat else result


def take_along_axis(x, indices, axis):
    """NumPy's ``take_along_axis``: ``indices`` has as many axes as ``x``, the two broadcast against each other
    off ``axis``, and each index picks an element along ``axis`` (None: of both flattened). The usual use picks
    each row's label: ``take_along_axis(logits, labels[:, None], axis=1)``. Indices as ``take``'s; with
    ``axis=None`` they are 1-d and index ``x`` flattened."""
    if axis is None and as_term(indices).ndim != 1:
        raise ShapeError(f"take_along_axis: with axis=None the indices must have one dimension (as in NumPy), "
                         f"not shape {as_term(indices).shape}")
    return _gather("take_along_axis", x, indices, axis)


def _gather(name, x, indices, axis):
    """The gather ``name`` along ``axis`` (None: of ``x`` flattened), remembered where the user wrote it: an index
    found out of range when a program runs is reported as this call, whichever gather rewriting made of it."""
    flat = axis is None
    term = _call(name, _flattened(x) if flat else x, indices, axis=0 if flat else axis)
    if called_by_user():
        indices, along = term.args[1], term.attr("axis")
        call = f"{name}({describe_operands((as_term(x), indices))}, axis={axis!r})"
        gathering.written_gather(call, term, None if flat else along, term.args[0].shape[along])
    return term



# -- attention (built by the rules that recognise it, not by users) --------------------------


def attention(q, k, v, scale, causal):
    """``softmax(q @ k^T * scale, axis=-1) @ v``, the scores past each query's own position ``-inf`` where ``causal``;
    one op, so no kernel stores the scores (``ops.attention``)."""
    return _call("attention", q, k, v, scale=scale, causal=causal)


def attention_grad(q, k, v, out, dout, scale, causal, result):
    """Result ``result`` (0: ``dq``, 1: ``dk``, 2: ``dv``) of the gradient of ``attention`` from its result ``out``
    and that result's adjoint ``dout``."""
    return _call("attention_grad", q, k, v, out, dout, scale=scale, causal=causal, result=result)

def random_uniform(seed, counter, shape, stream=0):
    """float32 numbers in ``[0, 1)`` of ``shape``, each a function of the integer scalars ``seed`` and ``counter``, the
    int ``stream`` and its own flat index (Philox-4x32-10, ``ops.random``): the same numbers on every backend. Keep
    ``seed`` and ``counter`` as state and add 1 to the counter each step for new numbers each step (``nn.Dropout``
    does); other streams of one key give other, independent numbers."""
    return _call("random_uniform", seed, counter, shape=shape, stream=stream)


# -- convolution and pooling -----------------------------------------------------------------


def conv(x, w, strides=1, padding=0, lhs_dilation=1, rhs_dilation=1, groups=1):
    """The general convolution (XLA's ``conv_general_dilated``) of ``x`` (``N, C, *spatial``) with ``w``
    (``O, C/groups, *kernel``), cross-correlating as PyTorch does. Per spatial axis: ``strides``,
    ``padding`` as ``(low, high)`` pairs (an int or one int per axis: the same on both sides; negative
    crops), ``lhs_dilation`` (zeros between input elements: a transposed convolution's stride) and
    ``rhs_dilation`` (the kernel's dilation). ``conv2d`` is the usual front."""
    return _call("conv", x, w, strides=strides, padding=padding, lhs_dilation=lhs_dilation,
                 rhs_dilation=rhs_dilation, groups=groups)


def windows(x, window_shape, strides=1, dilation=1):
    """The sliding windows of ``x``'s trailing ``len(window_shape)`` axes, ``strides`` apart, their taps
    ``dilation`` apart: shape ``lead + counts + window_shape``. NumPy's ``sliding_window_view`` with
    strides; a view, never a copy."""
    return _call("windows", x, window_shape=window_shape, strides=strides, dilation=dilation)


def overlap_add(x, shape, strides=1, dilation=1):
    """The adjoint of ``windows``: windows ``x`` (``lead + counts + window``) added back into a tensor whose
    trailing axes have ``shape``, where ``windows`` took them (overlaps add; uncovered elements are 0)."""
    return _call("overlap_add", x, shape=shape, strides=strides, dilation=dilation)


def pad(x, pad_width, constant_values=0):
    """NumPy's ``pad`` in ``"constant"`` mode; a negative width crops that many elements instead."""
    return _call("pad", x, pad_width=pad_width, constant_values=constant_values)


def _as_written(function):
    """``function``, a constructor that builds its call out of other ops, reporting whatever they reject as the call
    the user wrote (``term.user_call``): its name, its operands' types and the parameters not at their defaults."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError as error:  # an argument it does not take (PyTorch's ceil_mode, say): name the call
            raise TypeError(f"{function.__name__}{signature}: {error}") from None
        shown = [describe_operands([v]) if isinstance(v, Term) else f"{k}={v!r}" for k, v in given.items()
                 if isinstance(v, Term) or not _same(v, signature.parameters[k].default)]
        with user_call(f"{function.__name__}({', '.join(shown)})"):
            return function(*args, **kwargs)

    return call


def _same(value, default):
    """Whether a parameter was given its default (plain Python values only; anything else counts as given)."""
    return isinstance(value, (int, float, str, type(None))) and type(value) is type(default) and value == default


def _refused(what):
    """A ShapeError for a bad argument of a composite call, reported as the user's call (``user_call``)."""
    return rejection("argument", (), shape_violation(what))


def _pair(value, what):
    """PyTorch's 2-d argument: an int for both spatial axes, or a pair."""
    try:
        pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    except TypeError:
        pair = (value,)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise _refused(f"{what} must be an int or a pair of ints, not {value!r}")
    return pair


def _four_dimensional(name, x, what="input", layout="(N, C, H, W)"):
    if not isinstance(x, Term) or x.ndim != 4:
        shape = getattr(x, "shape", None)
        raise _refused(f"{name} needs a 4-d {what} {layout}, not {shape if shape is not None else repr(x)}")


def _conv2d_padding(padding, w, stride, dilation):
    """PyTorch's ``padding``: an int, a pair, ``"valid"`` or ``"same"`` (stride 1 only; odd totals put the
    extra element after, as PyTorch does)."""
    if padding == "valid":
        return 0
    if padding == "same":
        if stride != (1, 1):
            raise _refused(f"padding='same' needs stride 1, not {stride} (as in PyTorch)")
        totals = [d * (k - 1) for d, k in zip(dilation, w.shape[2:])]
        return tuple((t // 2, t - t // 2) for t in totals)
    pair = _pair(padding, "conv2d's padding (or 'same' or 'valid')")
    if min(pair) < 0:
        raise _refused(f"conv2d's padding must not be negative, not {padding!r}")
    return pair


@_as_written
def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """PyTorch's ``conv2d`` without bias (add one as ``b.reshape(-1, 1, 1)``): ``x`` is ``(N, C, H, W)``,
    ``w`` is ``(O, C/groups, kH, kW)``; ``padding`` an int, a pair, ``"same"`` or ``"valid"``."""
    _four_dimensional("conv2d", x)
    _four_dimensional("conv2d", w, "weight", "(O, C/groups, kH, kW)")
    stride, dilation = _pair(stride, "conv2d's stride"), _pair(dilation, "conv2d's dilation")
    return conv(x, w, strides=stride, padding=_conv2d_padding(padding, w, stride, dilation), rhs_dilation=dilation,
                groups=groups)


def _pooled_windows(name, x, kernel_size, stride, padding, fill):
    _four_dimensional(name, x)
    kernel = _pair(kernel_size, f"{name}'s kernel_size")
    stride = kernel if stride is None else _pair(stride, f"{name}'s stride")
    padding = _pair(padding, f"{name}'s padding")
    for what, pair in (("kernel_size", kernel), ("stride", stride)):
        if min(pair) < 1:
            raise _refused(f"{name}'s {what} must be positive, not {pair}")
    if any(p < 0 or 2 * p > k for p, k in zip(padding, kernel)):
        raise _refused(f"padding {padding} must be between 0 and half the kernel {kernel} (as in PyTorch)")
    _window_fits(x.shape[2:], kernel, padding)
    if any(padding):
        x = pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding), constant_values=fill)
    return windows(x, kernel, strides=stride)


def _window_fits(spatial, kernel, padding):
    """A window larger than the (padded) input is refused before ``windows`` would refuse it, in the user's sizes."""
    padded = tuple(n + 2 * p for n, p in zip(spatial, padding))
    if all(k <= n for k, n in zip(kernel, padded)):
        return
    size = _dims(spatial) + (f" padded by {padding} on each side to {_dims(padded)}" if any(padding) else "")
    raise _refused(f"the {_dims(kernel)} window is larger than the input's {size}, "
                   f"so no window fits")


def _dims(sizes):
    return "x".join(map(str, sizes))


@_as_written
def max_pool2d(x, kernel_size, stride=None, padding=0):
    """PyTorch's ``max_pool2d``: the maximum of each window (``stride`` defaults to ``kernel_size``;
    padding counts as -inf). Its gradient splits a tie evenly, as ``max``'s does."""
    _four_dimensional("max_pool2d", x)
    fill = float("-inf") if is_float(x.dtype) else int(np.iinfo(x.dtype).min) if x.dtype.kind in "iu" else 0
    return max(_pooled_windows("max_pool2d", x, kernel_size, stride, padding, fill), axis=(-2, -1))


@_as_written
def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """PyTorch's ``avg_pool2d``: the mean of each window, padding counted as zeros (PyTorch's default
    ``count_include_pad=True``)."""
    return mean(_pooled_windows("avg_pool2d", x, kernel_size, stride, padding, 0), axis=(-2, -1))


# -- deferring to other kinds of operands ----------------------------------------------------

OPERAND_PARAMETERS = ("x", "y", "w", "condition", "indices", "operands")  # the rest of a signature are attributes


def _deferring(function):
    """``function``, handing the call to an operand whose type defines ``__cortado_function__``.

    As NumPy's ``__array_function__`` lets array-likes take over NumPy's functions, this lets a
    rewrite pattern's placeholder turn ``ct.exp(_x)`` into a pattern, with no knowledge of rules
    here. The handler gets the function's name, its operands and its other parameters by name.
    """
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        for value in itertools.chain(args, kwargs.values()):
            handler = getattr(type(value), "__cortado_function__", None)
            if handler is not None:
                operands, params = [], {}
                for name, given in signature.bind(*args, **kwargs).arguments.items():  # in signature order
                    if name == "operands":
                        operands.extend(given)
                    elif name in OPERAND_PARAMETERS:
                        operands.append(given)
                    else:
                        params[name] = given
                return handler(function.__name__, tuple(operands), params)
        return function(*args, **kwargs)

    return call


for _name in __all__:
    if _name not in ("var", "const", "as_term"):
        globals()[_name] = _deferring(globals()[_name])


# -- the operators and methods of terms ------------------------------------------------------
# ``x + y``, ``2 - x``, ``x @ W``, ``x < 0``, ``x.T``, ``x.sum(axis)``, ... are the functions
# above (deferring ones) under Python's operators and NumPy's method names. They are installed
# on Term here, once the functions exist, so term.py needs nothing of this module.


def _swapped(function):
    """The reflected operator of ``function``: ``2 - x`` is ``subtract(2, x)``."""

    def reflected(self, other):
        return function(other, self)

    return reflected


def _on_bools(function, symbol):
    """Python's ``symbol`` on bool terms, as NumPy's on bool arrays: ``function``. On numbers NumPy's is bitwise,
    which cortado does not compute: refused, naming the logical function to call instead."""

    def operator(*operands):
        for x in operands:
            if isinstance(x, Term) and x.dtype != np.bool_:
                raise rejection(function.__name__, operands, dtype_violation(
                    f"'{symbol}' takes bool terms (NumPy's is bitwise on {x.dtype.name}, which cortado does not "
                    f"compute); call ct.{function.__name__} for the truth of numbers, or compare them first"))
        return function(*operands)

    return operator


def _reshape_method(self, *shape):
    """NumPy's ``x.reshape(2, 3)`` or ``x.reshape((2, 3))``."""
    return reshape(self, shape[0] if len(shape) == 1 else shape)


def _transpose_method(self, *axes):
    """NumPy's ``x.transpose()``, ``x.transpose(1, 0)`` or ``x.transpose((1, 0))``."""
    return transpose(self, axes[0] if len(axes) == 1 else (axes or None))


TERM_METHODS = {
    "__add__": add, "__radd__": _swapped(add), "__sub__": subtract, "__rsub__": _swapped(subtract),
    "__mul__": multiply, "__rmul__": _swapped(multiply), "__truediv__": divide, "__rtruediv__": _swapped(divide),
    "__floordiv__": floor_divide, "__rfloordiv__": _swapped(floor_divide), "__mod__": remainder,
    "__rmod__": _swapped(remainder),
    "__pow__": power, "__rpow__": _swapped(power), "__matmul__": matmul, "__rmatmul__": _swapped(matmul),
    "__neg__": negative, "__pos__": lambda self: self, "__abs__": abs,
    "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    "__invert__": _on_bools(logical_not, "~"),
    "T": property(transpose), "sum": sum, "mean": mean, "max": max,
    "reshape": _reshape_method, "transpose": _transpose_method, "astype": cast,
}
for _name, _function, _symbol in (("and", logical_and, "&"), ("or", logical_or, "|"), ("xor", logical_xor, "^")):
    _operator = _on_bools(_function, _symbol)
    TERM_METHODS.update({f"__{_name}__": _operator, f"__r{_name}__": _swapped(_operator)})
for _name, _method in TERM_METHODS.items():
    setattr(Term, _name, _method)
