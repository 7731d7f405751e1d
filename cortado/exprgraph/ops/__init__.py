"""The op table: for every op, its arity, attributes, shape rule, dtype rule and kind.

This is the single source of what an op *is*: each op is one ``Op`` record, exported here by its
name in capitals (``MATMUL``, ``CONV``, ...), carrying its attribute names, shape and dtype rules and
reference semantics (``evaluate``). Later stages dispatch on these records (``term.op is MATMUL``,
tables keyed by the op) and add what they need (a derivative, a kernel) in tables of their own;
``OPS`` finds a record by its name, for the constructors and the text rules. Shape and dtype rules
raise ``RuleViolation`` with a short reason; ``term.make`` adds the op name, operand types and the
user's line.

Dtype rules of the elementwise ops ask NumPy's own ufuncs (``resolve_dtypes``), so promotion is
exactly NumPy 2's; Python scalars are weak (NEP 50) and are materialised by the constructors
before a term is built, so the rules here only ever see concrete dtypes. bfloat16 (ml_dtypes')
follows the same rules, which ml_dtypes alone does not: see ``weak_scalars_as_bfloat16``.

The ops are defined by family, one module each: leaves, elementwise, reductions, contractions,
layout, convolution (with the window ops of pooling), indexing (gathers by index terms), random
(counter-based random numbers), attention (a softmax of products, recognised by the rules, never
built by users), and the ops
that fusion builds (``fused``, ``param``). A backend's own lowered ops (the GPU's ``gemm``) are not in
the table: they live with the lowering that builds them. ``base`` holds the ``Op`` record and the helpers the families share.
This module assembles ``OPS`` from the families and names what the rest of cortado takes from the
table.
"""

from . import attention, contractions, convolution, elementwise, indexing, layout, leaves, random, reductions
from .attention import ATTENTION, ATTENTION_GRAD
from .base import (
    CONTRACTION, ELEMENTWISE, FUSED, LAYOUT, LEAF, LOWERED, REDUCTION, Op, dtype_attr, ufunc_loop,
    weak_scalars_as_bfloat16,
)
from .contractions import EINSUM, MATMUL
from .convolution import CONV, FLIP, OVERLAP_ADD, PAD, WINDOWS
from .elementwise import (
    ABS, ADD, CAST, COS, DIVIDE, EQUAL, EXP, EXPM1, FLOAT8_GRADIENT, FLOOR_DIVIDE, GELU, GELU_GRAD, GREATER,
    GREATER_EQUAL, LESS, LESS_EQUAL, LOG, LOG1P, LOGICAL_AND, LOGICAL_NOT, LOGICAL_OR, LOGICAL_XOR, MAXIMUM, MINIMUM,
    MULTIPLY, NEGATIVE, NOT_EQUAL, POWER, RELU, REMAINDER, RINT, SIGMOID, SIGN, SIN, SOFTPLUS, SQRT, STOP_GRADIENT,
    SUBTRACT, TANH, UFUNC_OPS, UFUNCS, WHERE, may_fail,
)
from .indexing import ADD_AT, TAKE, TAKE_ALONG_AXIS, reads_unchecked_indices
from .layout import BROADCAST_TO, RESHAPE, TRANSPOSE
from .leaves import CONST, VAR, Constant
from .lowered import FUSED_OP, PARAM, parameter
from .random import RANDOM_UNIFORM
from .reductions import LOG_SOFTMAX, LOGSUMEXP, MAX, MEAN, SOFTMAX, SUM

__all__ = [
    "OPS", "Op", "CONTRACTION", "ELEMENTWISE", "FUSED", "LAYOUT", "LEAF", "LOWERED", "REDUCTION",
    "Constant", "dtype_attr", "ufunc_loop", "weak_scalars_as_bfloat16", "UFUNC_OPS", "UFUNCS", "may_fail",
    "reads_unchecked_indices", "parameter",
    # the ops
    "VAR", "CONST", "PARAM", "FUSED_OP",
    "NEGATIVE", "EXP", "LOG", "LOG1P", "EXPM1", "SQRT", "TANH", "SIN", "COS", "ABS", "SIGN", "RINT", "ADD", "SUBTRACT",
    "MULTIPLY", "DIVIDE", "FLOOR_DIVIDE", "REMAINDER", "POWER", "MAXIMUM", "MINIMUM", "LESS", "LESS_EQUAL", "GREATER",
    "GREATER_EQUAL", "EQUAL", "NOT_EQUAL",
    "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_XOR", "LOGICAL_NOT",
    "SIGMOID", "RELU", "SOFTPLUS", "GELU", "GELU_GRAD", "WHERE", "STOP_GRADIENT", "CAST", "FLOAT8_GRADIENT",
    "SUM", "MEAN", "MAX", "LOGSUMEXP", "SOFTMAX", "LOG_SOFTMAX", "MATMUL", "EINSUM", "TRANSPOSE", "RESHAPE",
    "BROADCAST_TO", "CONV", "WINDOWS", "OVERLAP_ADD", "PAD", "FLIP", "TAKE", "TAKE_ALONG_AXIS", "ADD_AT", "ATTENTION",
    "ATTENTION_GRAD", "RANDOM_UNIFORM",
]

OPS = {op.name: op for op in (*leaves.FAMILY, *elementwise.FAMILY, *reductions.FAMILY, *contractions.FAMILY,
                              *layout.FAMILY, *convolution.FAMILY, *indexing.FAMILY, *attention.FAMILY, *random.FAMILY,
                              FUSED_OP,
                              PARAM)}
