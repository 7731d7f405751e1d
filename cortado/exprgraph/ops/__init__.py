"""The op table: for every op, its arity, attributes, shape rule, dtype rule and kind.

This is the single source of what an op *is*. Later stages (rules, backends) look ops up here by
name and add what they need (a NumPy implementation, a derivative, a kernel) in tables of their
own. Rules raise ``RuleViolation`` with a short reason; ``term.make`` adds the op name, operand
types and the user's line.

Dtype rules of the elementwise ops ask NumPy's own ufuncs (``resolve_dtypes``), so promotion is
exactly NumPy 2's; Python scalars are weak (NEP 50) and are materialised by the constructors
before a term is built, so the rules here only ever see concrete dtypes. bfloat16 (ml_dtypes')
follows the same rules, which ml_dtypes alone does not: see ``weak_scalars_as_bfloat16``.

The ops are defined by family, one module each: leaves, elementwise, reductions, contractions,
layout, convolution (with the window ops of pooling), indexing (gathers by index terms), attention (a softmax
of products, recognised by the rules, never built by users), and the ops
that fusion builds (``fused``, ``param``). A backend's own lowered ops (the GPU's ``gemm``) are not in
the table: they live with the lowering that builds them. ``base`` holds the ``Op`` record and the helpers the families share.
This module assembles ``OPS`` from the families and names what the rest of cortado takes from the
table.
"""

from . import attention, contractions, convolution, elementwise, indexing, layout, leaves, reductions
from .base import (
    CONTRACTION, ELEMENTWISE, FUSED, LAYOUT, LEAF, LOWERED, REDUCTION, Op, dtype_attr, ufunc_loop,
    weak_scalars_as_bfloat16,
)
from .elementwise import UFUNC_OPS, may_fail
from .leaves import Constant
from .lowered import FUSED_OP, PARAM, parameter

__all__ = [
    "OPS", "Op", "CONTRACTION", "ELEMENTWISE", "FUSED", "LAYOUT", "LEAF", "LOWERED", "REDUCTION",
    "Constant", "dtype_attr", "ufunc_loop", "weak_scalars_as_bfloat16", "UFUNC_OPS", "may_fail",
    "FUSED_OP", "parameter",
]

OPS = {op.name: op for op in (*leaves.FAMILY, *elementwise.FAMILY, *reductions.FAMILY, *contractions.FAMILY,
                              *layout.FAMILY, *convolution.FAMILY, *indexing.FAMILY, *attention.FAMILY, FUSED_OP,
                              PARAM)}
