"""The float8 target: the rules that find ``float8_gemm`` (``float8_op``: cuBLASLt's scaled float8 product) in plain
expressions.

A float8 product is written as the arithmetic it is: ``cast(x * sx, float8_e4m3fn) @ cast(w * sw, float8_e4m3fn)``
is a float32 matrix (every product of two float8 values is exact in float32, where they are summed;
``ops.contractions``), and the user scales it back and casts it down as any value. The rules fold that into one
call, each fold changing at most where a result is rounded:

- ``matmul(a, b)`` of float8 matrices (not both e5m2, which cuBLASLt does not multiply; the contracted and the
  column dimension multiples of 16) is ``float8_gemm(a, b^T)``: cuBLASLt multiplies float8 only with both operands
  stored with the contracted axis innermost (its "TN" form), so a weight ``w`` of a linear layer ``x @ w^T`` is
  read where it is, and an operand stored otherwise is copied so first. A batch of rows is folded into one matrix.
- the product times a float32 scalar (``1 / (sx * sw)``, a value the step computes) is that scalar in the call
  (cuBLASLt's scale pointer): the float32 sums are scaled before they are rounded, once; a second scalar joins it
  where both are powers of two (``scaling``), which changes no bit;
- a product of float8 values widened to float32 and scaled by powers of two (the gradients ``float8_gradient``
  leaves, and the weights of a float8 layer) is the float8 product times the scales (``float8-scales-out``):
  the same bits wherever every result stays a normal float32, which ``_exactly_scaled`` proves from the float8
  ranges, the scales' exponents and the contracted length; so a float8 layer's gradients are float8 products too;
- a cast of it to bfloat16 is the call's output type; then a bias row of bfloat16 added to it, and gelu of it all,
  are its epilogue (computed in float32 on the sums, rounded once to the output); a bfloat16 term of its shape added
  to it (a residual) is cuBLASLt's C, read at beta 1 and added to the float32 sums before they are rounded, so the
  residual's sum is rounded once instead of twice and no kernel after the product reads it again;
- a gelu of it that is then scaled and cast to float8 (the next float8 layer's input) is the call's float8 output,
  the product before gelu its second result where gelu's gradient reads it, and the gelu's largest magnitude (the
  next layer's amax) its third (``float8_gelu``, a pass over the whole graph in ``finish``).

Only a product rounded to bfloat16 (or float8) runs on the float8 tensor cores: their partial sums keep about 13 bits on
Hopper (an H100's float8 product of 64 terms was up to 2^-13 off the float32 sum, with cuBLASLt's full
accumulation), within bfloat16's rounding (8 bits) but a thousand float32 units off. A product kept in float32 or
float16, and any other product with a float8 operand, is computed in the other operand's dtype, or float32, its
float8 values converted exactly (``finish``), so the product is the same and only slower (an einsum of them is a
matmul or a product summed, ``rules.decompositions``, its operands converted exactly too).
"""

import functools
import math
import operator

import numpy as np

from ....exprgraph import constructors as ct
from ....exprgraph.dtypes import FLOAT8, finfo, is_float8
from ....exprgraph.ops import BROADCAST_TO, CAST, MULTIPLY, RESHAPE, TRANSPOSE
from ....exprgraph.scaling import exponents
from ....exprgraph.term import make
from ....rules.engine import Rewrite, Rule, RuleSet, bottom_up
from .float8_gelu import gelus_into_float8_products
from .float8_op import FLOAT8_GEMM, FLOAT8_OUTPUTS, ROUNDED_ENOUGH, float8_gemm, one_value, parts
from .gemm_op import gemm

ALIGNMENT = 16  # elements of the contracted and the column dimension: cuBLASLt's float8 kernels read 16 bytes at once


def _transposed(m):
    """The matrix ``m^T``: the matrix ``m`` transposes, where it is a transpose."""
    return m.args[0] if m.op is TRANSPOSE else ct.transpose(m)


def _multipliable(x, y):
    """Whether cuBLASLt multiplies ``x @ y`` in float8 (its sizes aligned, not both e5m2)."""
    e5m2 = FLOAT8[1]
    folded = x.ndim == 2 or x.op not in (TRANSPOSE, BROADCAST_TO)  # a batch's rows read as one matrix, as stored
    return (is_float8(x.dtype) and is_float8(y.dtype) and not x.dtype == y.dtype == e5m2 and y.ndim == 2
            and x.ndim >= 2 and folded and 0 not in x.shape + y.shape
            and y.shape[0] % ALIGNMENT == 0 and y.shape[1] % ALIGNMENT == 0)


def _matmul(b):
    x, y = b["_a"], b["_b"]
    if not (is_float8(x.dtype) or is_float8(y.dtype)):
        return None
    if _multipliable(x, y):
        rows = x if x.ndim == 2 else ct.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))
        product = float8_gemm(rows, _transposed(y))
        return product if x.ndim == 2 else ct.reshape(product, b.term.shape)
    wide = b.term.dtype  # every float8 value is exact in it
    return ct.matmul(*(ct.cast(t, wide) if is_float8(t.dtype) else t for t in (x, y)))


def _product(b, t):
    """``(gemm, wrap)``: the float8_gemm ``t`` is, itself or with its rows reshaped back into a batch, that no
    other term reads, and the function giving a rebuilt gemm ``t``'s shape again; ``(None, None)`` if none."""
    g, wrap = t, (lambda rebuilt: rebuilt)
    if t.op is RESHAPE and t.args[0].op is FLOAT8_GEMM and not b.shared(t):
        g, wrap = t.args[0], (lambda rebuilt: ct.reshape(rebuilt, t.shape))
    if g.op is not FLOAT8_GEMM or b.shared(g) or g.attr("output") or g.dtype in FLOAT8_OUTPUTS:
        return None, None
    return g, wrap


def _exactly_scaled(a_dtype, b_dtype, k, scale):
    """Whether every sum of ``k`` products of ``a_dtype`` and ``b_dtype`` values (float8), times ``scale`` (a power
    of two, ``scaling.exponents``), is zero or a normal float32: then scaling them commutes with every rounding,
    and the scale may be applied to the products' values or to their sums alike, to the same bits."""
    exps = exponents(scale)
    if exps is None:
        return False
    low = math.log2(float(finfo(a_dtype).smallest_subnormal)) + math.log2(float(finfo(b_dtype).smallest_subnormal))
    high = math.log2(k * float(finfo(a_dtype).max) * float(finfo(b_dtype).max))  # (low: a nonzero sum's least)
    return low + exps[0] >= math.log2(finfo(np.float32).smallest_normal) and high + exps[1] < 128


def _scale(b):
    for t, other in ((b["_x"], b["_y"]), (b["_y"], b["_x"])):
        g, wrap = _product(b, t)
        scale = None if g is None else one_value(other)
        if scale is None or t.shape != b.term.shape or g.dtype != np.float32 or g.attr("epilogue") != "none":
            continue
        own = parts(g)
        if own["scale"] is not None:  # a second scale: exact only where both are powers of two
            scale = own["scale"] * scale
            if not _exactly_scaled(own["a"].dtype, own["b"].dtype, own["a"].shape[1], scale):
                continue
        return wrap(float8_gemm(**{**own, "scale": scale}))
    return None


def _scaled_float8(t):
    """``(q, scales)`` where ``t`` is float8 ``q`` (moved by layout ops, widened exactly to float32) times scalars
    that are powers of two, else None."""
    if is_float8(t.dtype):
        return t, []
    if t.op is CAST and t.dtype == np.float32 and is_float8(t.args[0].dtype):
        return t.args[0], []
    if t.op in (RESHAPE, TRANSPOSE):
        inner = _scaled_float8(t.args[0])
        return None if inner is None else (make(t.op, (inner[0],), t.attrs), inner[1])
    if t.op is MULTIPLY:
        for x, s in (t.args, t.args[::-1]):
            scale = one_value(s)
            inner = None if scale is None or exponents(scale) is None else _scaled_float8(x)
            if inner is not None:
                return inner[0], inner[1] + [scale]
    return None


def _scales_out(b):
    """A float32 product of float8 values scaled by powers of two (the cotangents ``float8_gradient`` makes, and the
    weights of a float8 layer): the product of the float8 values, times the scales, where that is exactly the same
    (``_exactly_scaled``) and cuBLASLt multiplies them in float8."""
    if b.term.dtype != np.float32:
        return None
    found = [_scaled_float8(t) for t in (b["_a"], b["_b"])]
    if None in found:
        return None
    (qa, sa), (qb, sb) = found
    # nothing to take out, or a product cuBLASLt cannot take (it stays widened: float8-gemm widens it)
    if (qa, qb) == (b["_a"], b["_b"]) or not _multipliable(qa, qb):
        return None
    product = ct.matmul(qa, qb)
    if not sa + sb:
        return product
    scale = functools.reduce(operator.mul, sa + sb)
    return product * scale if _exactly_scaled(qa.dtype, qb.dtype, qa.shape[-1], scale) else None


def _cast(b):
    g, wrap = _product(b, b["_x"])
    dtype = b.term.dtype
    if g is None or g.dtype != np.float32 or dtype not in ROUNDED_ENOUGH:
        return None
    return wrap(float8_gemm(**{**parts(g), "dtype": dtype}))


def _added(b):
    """``g + other``: a bias row into the epilogue, or a term of the sum's shape (a residual) as the call's ``c``."""
    for t, other in ((b["_x"], b["_y"]), (b["_y"], b["_x"])):
        g, wrap = _product(b, t)
        if g is None or g.dtype not in ROUNDED_ENOUGH or t.shape != b.term.shape or other.dtype != g.dtype:
            continue
        own = parts(g)
        bias = other.args[0] if other.op is BROADCAST_TO else other
        if bias.shape == (g.shape[1],) and own["epilogue"] == "none":
            return wrap(float8_gemm(**{**own, "epilogue": "bias", "bias": bias}))
        if other.shape == b.term.shape and other.op is not BROADCAST_TO and own["c"] is None \
                and own["epilogue"] in ("none", "bias"):
            return wrap(float8_gemm(**{**own, "c": other if other.shape == g.shape else ct.reshape(other, g.shape)}))
    return None


def _gelu(b):
    g, wrap = _product(b, b["_x"])
    if g is None or g.dtype == np.float32 or g.attr("epilogue") not in ("none", "bias") or g.attr("added"):
        return None
    return wrap(float8_gemm(**{**parts(g), "epilogue": "gelu" if g.attr("epilogue") == "none" else "bias_gelu"}))


rules = RuleSet([
    Rule("float8-scales-out", "matmul(_a, _b)", _scales_out),
    Rule("float8-gemm", "matmul(_a, _b)", _matmul),
    Rule("float8-gemm-scale", "multiply(_x, _y)", _scale),
    Rule("float8-gemm-cast", "cast(_x, dtype=_d)", _cast),
    Rule("float8-gemm-add", "add(_x, _y)", _added),
    Rule("float8-gemm-gelu", "gelu(_x)", _gelu),
], name="float8 lowering")


def finish(roots, trace=None, keep=frozenset()):
    """``roots`` with each float8_gemm whose result is kept in float32 (see above) computed in float32 by
    cuBLASLt's plain GEMM, its float8 operands converted exactly, its scale a multiply after it; then the gelus
    cast to float8 folded into their products (``float8_gelu``)."""
    def widened(original, rebuilt):
        if rebuilt.op is not FLOAT8_GEMM or rebuilt.attr("dtype") != np.float32:
            return rebuilt
        own = parts(rebuilt)
        product = gemm(ct.cast(own["a"], np.float32), ct.cast(own["b"], np.float32), transpose_b=True)
        result = product if own["scale"] is None else product * own["scale"]
        if trace is not None:
            trace.append(Rewrite("float8-widen", original, result))
        return result

    memo = {}
    return gelus_into_float8_products([bottom_up(root, memo, widened) for root in roots], trace)


def alternatives(planned):
    """No variant of this target is worth planning apart."""
    return []
