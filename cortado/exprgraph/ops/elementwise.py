"""The elementwise ops: NumPy's ufuncs (with NumPy's own dtype rules), the activations, ``where``,
``cast`` and ``stop_gradient`` (the identity, whose derivative is 0). Their operands broadcast and
their results have the broadcast shape.
"""

import numpy as np

from ..dtypes import is_float, kind_of
from ..term import dtype_violation
from .base import ELEMENTWISE, Op, broadcast_shapes, dtype_attr, float_result, no_attributes, promoted, ufunc_loop


def ufunc_dtype(ufunc):
    def rule(args, *attrs):
        return ufunc_loop(ufunc, tuple(a.dtype for a in args))[-1]

    return rule


def _broadcast_rule(args, *attrs):
    return broadcast_shapes(*(a.shape for a in args))


def _elementwise(name, arity, dtype_rule):
    return Op(name, arity, (), _broadcast_rule, dtype_rule, ELEMENTWISE, no_attributes)


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


UFUNC_OPS = {
    "negative": np.negative, "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
    "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.absolute, "sign": np.sign, "rint": np.rint,
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.true_divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal,
}


def may_fail(t):
    """Whether term ``t`` can fail on its values: an integer power whose exponent may be negative (NumPy raises
    there). An unsigned exponent cannot, nor a constant of one value, not negative (which a fused body inlines)."""
    if t.op.name != "power" or t.dtype.kind not in "iu":
        return False
    exponent = t.args[1]
    known = exponent.op.name == "const" and exponent.attr("value").scalar is not None and exponent.attr("value").scalar >= 0
    return not (exponent.dtype.kind in "ub" or known)


FAMILY = (
    *(_elementwise(name, ufunc.nin, ufunc_dtype(ufunc)) for name, ufunc in UFUNC_OPS.items()),
    _elementwise("sigmoid", 1, float_result),
    _elementwise("relu", 1, _relu_dtype),
    _elementwise("softplus", 1, float_result),
    _elementwise("gelu", 1, _float_operand),
    _elementwise("gelu_grad", 1, _float_operand),
    _elementwise("where", 3, _where_dtype),
    _elementwise("stop_gradient", 1, lambda args: args[0].dtype),
    Op("cast", 1, ("dtype",), _broadcast_rule, lambda args, dtype: dtype, ELEMENTWISE, _cast_normalize),
)
