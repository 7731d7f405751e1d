"""The elementwise ops: NumPy's ufuncs (with NumPy's own dtype rules), the activations, ``where``,
``cast`` and ``stop_gradient`` (the identity, whose derivative is 0). Their operands broadcast and
their results have the broadcast shape.
"""

import numpy as np

from .. import numerics
from ..dtypes import converted, is_float, is_float8, is_narrow_float, kind_of
from ..term import dtype_violation, shape_violation
from .leaves import CONST
from .base import (
    ELEMENTWISE, Op, broadcast_shapes, dtype_attr, float_result, floating, narrow_once_floating, no_attributes, promoted,
    ufunc_loop,
)


def ufunc_dtype(ufunc):
    def rule(args, *attrs):
        return ufunc_loop(ufunc, tuple(a.dtype for a in args))[-1]

    return rule


def _broadcast_rule(args, *attrs):
    return broadcast_shapes(*(a.shape for a in args))


def _relu_dtype(args):
    if kind_of(args[0].dtype) not in "iuf":
        raise dtype_violation("relu needs a numeric operand")
    return args[0].dtype


def _float_operand(args):
    """The operand's floating dtype; integers and bools are refused rather than widened."""
    if not is_float(args[0].dtype):
        raise dtype_violation(f"needs a floating operand, not {args[0].dtype.name}; cast it first (ct.cast(x, 'float32'))")
    return args[0].dtype


def _cast_normalize(args, dtype):
    return (dtype_attr(dtype, "target dtype"),)


def _where_dtype(args):
    return promoted((args[1].dtype, args[2].dtype))


UFUNCS = {}  # op -> the NumPy ufunc it is


def _ufunc(name, ufunc):
    op = Op(name, ufunc.nin, (), _broadcast_rule, ufunc_dtype(ufunc), ELEMENTWISE, no_attributes,
            evaluate=lambda xs: ufunc(*xs))
    UFUNCS[op] = ufunc
    return op


NEGATIVE = _ufunc("negative", np.negative)
EXP = _ufunc("exp", np.exp)
LOG = _ufunc("log", np.log)
LOG1P = _ufunc("log1p", np.log1p)
EXPM1 = _ufunc("expm1", np.expm1)
SQRT = _ufunc("sqrt", np.sqrt)
TANH = _ufunc("tanh", np.tanh)
SIN = _ufunc("sin", np.sin)
COS = _ufunc("cos", np.cos)
ABS = _ufunc("abs", np.absolute)
SIGN = _ufunc("sign", np.sign)
RINT = _ufunc("rint", np.rint)
ADD = _ufunc("add", np.add)
SUBTRACT = _ufunc("subtract", np.subtract)
MULTIPLY = _ufunc("multiply", np.multiply)
DIVIDE = _ufunc("divide", np.true_divide)
FLOOR_DIVIDE = _ufunc("floor_divide", np.floor_divide)
REMAINDER = _ufunc("remainder", np.remainder)
POWER = _ufunc("power", np.power)
MAXIMUM = _ufunc("maximum", np.maximum)
MINIMUM = _ufunc("minimum", np.minimum)
LESS = _ufunc("less", np.less)
LESS_EQUAL = _ufunc("less_equal", np.less_equal)
GREATER = _ufunc("greater", np.greater)
GREATER_EQUAL = _ufunc("greater_equal", np.greater_equal)
EQUAL = _ufunc("equal", np.equal)
NOT_EQUAL = _ufunc("not_equal", np.not_equal)
# NumPy's logical ufuncs: a number is true where it is not 0 (NaN too); the result is bool
LOGICAL_AND = _ufunc("logical_and", np.logical_and)
LOGICAL_OR = _ufunc("logical_or", np.logical_or)
LOGICAL_XOR = _ufunc("logical_xor", np.logical_xor)
LOGICAL_NOT = _ufunc("logical_not", np.logical_not)
UFUNC_OPS = {op.name: ufunc for op, ufunc in UFUNCS.items()}  # by name, for the constructors of the same names
def may_fail(t):
    """Whether term ``t`` can fail on its values: an integer power whose exponent may be negative (NumPy raises
    there). An unsigned exponent cannot, nor a constant of one value, not negative (which a fused body inlines)."""
    if t.op is not POWER or t.dtype.kind not in "iu":
        return False
    exponent = t.args[1]
    known = exponent.op is CONST and exponent.attrs.value.scalar is not None and exponent.attrs.value.scalar >= 0
    return not (exponent.dtype.kind in "ub" or known)


def _composite(name, dtype_rule, formula, computes_in_float32, turns):
    """A unary op whose meaning is ``formula`` in primitives, on its operand in the floating dtype it computes in,
    monotone between the points where it ``turns``."""
    return Op(name, 1, (), _broadcast_rule, dtype_rule, ELEMENTWISE, no_attributes,
              evaluate=lambda xs: formula(floating(xs[0]), np), computes_in_float32=computes_in_float32,
              formula=formula, turns=turns)


# computed in float32 for float16 and bfloat16 (and the integers that become float16), rounded once, as a GPU does
SIGMOID = _composite("sigmoid", float_result, numerics.sigmoid, narrow_once_floating, ())
SOFTPLUS = _composite("softplus", float_result, numerics.softplus, narrow_once_floating, ())
GELU = _composite("gelu", _float_operand, numerics.gelu, is_narrow_float, (-0.7524614220710162,))  # its minimum
GELU_GRAD = _composite("gelu_grad", _float_operand, numerics.gelu_grad, is_narrow_float,
                       (-1.4185040087908285, 1.4185040087908285))  # its minimum and maximum
# silu (swish): x sigmoid(x), LLaMA's MLP activation; differentiated through its formula, having no rule of its own
SILU = _composite("silu", float_result, lambda x, xp: x * numerics.sigmoid(x, xp), narrow_once_floating,
                  (-1.2784645427610738,))  # its minimum
RELU = Op("relu", 1, (), _broadcast_rule, _relu_dtype, ELEMENTWISE, no_attributes,
          evaluate=lambda xs: np.maximum(xs[0], 0))
WHERE = Op("where", 3, (), _broadcast_rule, _where_dtype, ELEMENTWISE, no_attributes, evaluate=lambda xs: np.where(*xs))
STOP_GRADIENT = Op("stop_gradient", 1, (), _broadcast_rule, lambda args: args[0].dtype, ELEMENTWISE, no_attributes,
                   evaluate=lambda xs: np.array(xs[0], copy=True))
CAST = Op("cast", 1, ("dtype",), _broadcast_rule, lambda args, dtype: dtype, ELEMENTWISE, _cast_normalize,
          evaluate=lambda xs, dtype: converted(xs[0], dtype), takes_float8=True)


def _float8_gradient_normalize(args, dtype="float8_e5m2"):
    dtype = dtype_attr(dtype, "float8_gradient's dtype")
    if not is_float8(dtype):
        raise dtype_violation(f"float8_gradient rounds a cotangent to a float8 dtype, not {dtype.name}")
    return (dtype,)


def _float8_gradient_shape(args, dtype):
    """``x``'s shape; a second operand is the amax history its cotangent's scale comes from: a float32 vector."""
    if len(args) not in (1, 2):
        raise shape_violation(f"float8_gradient takes a value and at most an amax history, not {len(args)} operands")
    if len(args) == 2 and (args[1].ndim != 1 or args[1].dtype != np.float32):
        raise shape_violation(f"float8_gradient's amax history is a float32 vector, not a "
                              f"{args[1].dtype.name} array of shape {args[1].shape}")
    return args[0].shape


# the identity, whose cotangent is rounded to a float8 dtype (rules.derivatives): at a scale from its own amax, or,
# given an amax history, from the history's, the history's cotangent being its next value (the cotangent's amax
# pushed in), so that the step that takes gradients records it
FLOAT8_GRADIENT = Op("float8_gradient", None, ("dtype",), _float8_gradient_shape,
                     lambda args, dtype: _float_operand(args), ELEMENTWISE, _float8_gradient_normalize,
                     evaluate=lambda xs, dtype: np.array(xs[0], copy=True))

FAMILY = (*UFUNCS, SIGMOID, RELU, SOFTPLUS, GELU, GELU_GRAD, SILU, WHERE, STOP_GRADIENT, CAST, FLOAT8_GRADIENT)
