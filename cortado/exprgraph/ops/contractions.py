"""The contractions: ``matmul`` (NumPy's ``@``) and ``einsum``, whose subscripts einsum.py parses.
"""

import numpy as np

from ..dtypes import BFLOAT16, is_bfloat16, is_narrow_float
from ..einsum import parse as parse_einsum
from ..term import shape_violation
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


def _einsum_dtype(args, subscripts):
    return promoted([a.dtype for a in args])


def matmul_dtype(args):
    """NumPy's, except that bfloat16 operands give bfloat16 (NumPy's loop gives float32): as in
    PyTorch, JAX and cuBLAS, the products accumulate in float32 and the result is rounded once."""
    dtypes = tuple(a.dtype for a in args)
    if any(is_bfloat16(d) for d in dtypes) and is_bfloat16(promoted(dtypes)):
        return BFLOAT16
    return ufunc_loop(np.matmul, dtypes)[-1]


MATMUL = Op("matmul", 2, (), _matmul_shape, matmul_dtype, CONTRACTION, no_attributes,
            evaluate=lambda xs: np.matmul(*xs), computes_in_float32=is_narrow_float)
EINSUM = Op("einsum", None, ("subscripts",), lambda args, subscripts: parse_einsum(subscripts, [a.shape for a in args])[1],
            _einsum_dtype, CONTRACTION, _einsum_normalize,
            evaluate=lambda xs, subscripts: np.einsum(subscripts, *xs), computes_in_float32=is_narrow_float)

FAMILY = (MATMUL, EINSUM)
