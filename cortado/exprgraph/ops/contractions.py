"""The contractions: ``matmul`` (NumPy's ``@``) and ``einsum``, whose subscripts einsum.py parses.
"""

import numpy as np

from ..dtypes import BFLOAT16, is_bfloat16, is_float, is_float8, is_narrow_float
from ..einsum import parse as parse_einsum
from ..term import dtype_violation, shape_violation
from .base import CONTRACTION, Op, broadcast_shapes, no_attributes, promoted, ufunc_loop


def _matmul_shape(args):
    a, b = (x.shape for x in args)
    if not a or not b:
        raise shape_violation("matmul needs operands of rank 1 or more (use multiply for scalars)")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise shape_violation(
            f"the contracted dimensions differ: {a2[-1]} (last of the left) and {b2[-2]} "
            f"({'only' if len(b) == 1 else 'second-to-last'} of the right)"
        )
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)
    return out


def _einsum_normalize(args, subscripts):
    return (parse_einsum(subscripts, [a.shape for a in args])[0],)


def _float8_product_dtype(dtypes):
    """The dtype of a product of float8 operands (a float8 times another float: the other's, which holds every
    float8 value exactly; of float8 alone: float32, in which their products are exact and summed), or None for
    a product without float8."""
    others = [d for d in dtypes if not is_float8(d)]
    if len(others) == len(dtypes):
        return None
    if any(not is_float(d) for d in others):
        raise dtype_violation("a float8 operand multiplies floats only; cast the integers to a float first")
    return promoted(others) if others else np.dtype(np.float32)


def _einsum_dtype(args, subscripts):
    dtypes = [a.dtype for a in args]
    return _float8_product_dtype(dtypes) or promoted(dtypes)


def matmul_dtype(args):
    """NumPy's, except that bfloat16 operands give bfloat16 (NumPy's loop gives float32): as in
    PyTorch, JAX and cuBLAS, the products accumulate in float32 and the result is rounded once.
    Float8 operands give float32, or the other operand's float dtype."""
    dtypes = tuple(a.dtype for a in args)
    float8 = _float8_product_dtype(dtypes)
    if float8 is not None:
        return float8
    if any(is_bfloat16(d) for d in dtypes) and is_bfloat16(promoted(dtypes)):
        return BFLOAT16
    return ufunc_loop(np.matmul, dtypes)[-1]


def _widened(dtype):
    """Whether a contraction takes operands of ``dtype`` in float32: float16 and bfloat16 (summed in float32, the
    result rounded once) and float8 (whose products are exact there)."""
    return is_narrow_float(dtype) or is_float8(dtype)


MATMUL = Op("matmul", 2, (), _matmul_shape, matmul_dtype, CONTRACTION, no_attributes,
            evaluate=lambda xs: np.matmul(*xs), computes_in_float32=_widened)
EINSUM = Op("einsum", None, ("subscripts",), lambda args, subscripts: parse_einsum(subscripts, [a.shape for a in args])[1],
            _einsum_dtype, CONTRACTION, _einsum_normalize,
            evaluate=lambda xs, subscripts: np.einsum(subscripts, *xs), computes_in_float32=_widened)

FAMILY = (MATMUL, EINSUM)
