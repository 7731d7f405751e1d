"""The int8 target: ``int8_gemm``, an exact integer product on the tensor cores with its epilogue, and the
rules that find quantized products written as plain expressions.

- ``matmul(cast(a, int32), cast(b, int32))`` of int8 or uint8 matrices is ``int8_gemm(a, b)``: the
  int32 sums, exactly. The casts may sit under layout ops (a reshape, a transpose, a convolution's
  windows and padding), which move the narrow values instead: a convolution's rows are copied as
  int8, not int32.
- ``dequantize(qa, sa) @ dequantize(qw, sw)``, symmetric (no zero points), is that product times
  ``sa * sw``: one scale for the activations or one per row, one for the weights or one per output
  column. A scale along the contracted axis cannot be taken out of the sum, and a zero point adds
  a term the kernel does not compute: those products stay as they are (in float). So does one whose
  int32 sums could overflow (``exact_in_int32``): the float product does not wrap, and the int8 path is
  only a faster way to its value.
- ``conv`` of such operands (integer casts, or dequantized with per-output-channel weight scales) is
  the same product over the convolution's windows; a 1x1 convolution's windows are its pixels. A
  written int32 product or convolution wraps as its int32 sums wrap (in NumPy too), and ``int8_gemm``
  wraps alike: that rewrite needs no bound.
- An elementwise op of an ``int8_gemm`` that nothing else reads (but a widening cast), with operands
  that are one value, a row or a column of the product's shape, or a matrix of it, folds into the gemm's ``epilogue``: a
  body over ``param(0)``, the int32 sums, and ``param(k)``, the gemm's ``k + 1``-th argument (as a
  fused region's body). A quantized linear layer, its rescaling, bias, relu and requantization, is
  then one kernel from int8 in to int8 out.

``mma`` runs an ``int8_gemm``: kernels of our own, or cuBLASLt's int8 GEMM and a kernel for the
epilogue, whichever is faster; every candidate computes the same bits.
"""

import math
from types import SimpleNamespace

import numpy as np

from ....exprgraph import constructors as ct
from ....exprgraph.graph import post_order
from ....exprgraph.ops import (
    BROADCAST_TO, CAST, CONST, ELEMENTWISE, LOWERED, MULTIPLY, PAD, PARAM, RESHAPE, TRANSPOSE, WINDOWS, Op, parameter,
)
from ....exprgraph.ops.base import broadcast_shapes
from ....exprgraph.semantics import implementation
from ....exprgraph.term import dtype_violation, make, shape_violation
from ....rules.primitives import in_primitives
from ....rules.engine import Rule, RuleSet
from .conv import as_matmul_over_windows

NARROW = (np.dtype(np.int8), np.dtype(np.uint8))
INT32_MAX = int(np.iinfo(np.int32).max)
LAYOUT_OPS = (RESHAPE, TRANSPOSE, WINDOWS, BROADCAST_TO)


def _sums(a, b):
    """The body's ``param(0)``: the int32 sums of an ``m x k`` times a ``k x n`` product."""
    return parameter(0, SimpleNamespace(shape=(a.shape[0], b.shape[1]), dtype=np.dtype(np.int32)))


def _shape(args, epilogue):
    a, b, *extras = args
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise shape_violation(f"int8_gemm multiplies an m x k matrix by a k x n one, not {a.shape} by {b.shape}")
    if epilogue.shape != (a.shape[0], b.shape[1]):
        raise shape_violation(f"the epilogue's shape {epilogue.shape} is not the product's")
    for k, extra in enumerate(extras):
        if broadcast_shapes(extra.shape, epilogue.shape) != epilogue.shape:
            raise shape_violation(f"epilogue operand {k + 1} of shape {extra.shape} does not broadcast to the product")
    return epilogue.shape


def _dtype(args, epilogue):
    if args[0].dtype not in NARROW or args[1].dtype not in NARROW:
        raise dtype_violation(f"int8_gemm multiplies int8 or uint8 matrices, not {args[0].dtype} and {args[1].dtype}")
    return epilogue.dtype


def _normalize(args, epilogue=None):
    return (_sums(*args[:2]) if epilogue is None else epilogue,)


def _evaluate(xs, epilogue):
    """The int32 sums (wrapping as int32 arithmetic wraps), then the epilogue, as the reference interpreter
    evaluates a fused body."""
    a, b, *extras = xs
    values = {}
    sums = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    operands = [sums, *extras]
    for t in post_order([epilogue]):
        if t.op is PARAM:
            value = operands[t.attr("index")]
        elif t.op is CONST:
            value = t.attr("value").array
        else:
            with np.errstate(all="ignore"):
                value = implementation(t.op)([values[x] for x in t.args], *t.attrs)
        values[t] = np.asarray(value).astype(t.dtype, copy=False)
    return values[epilogue]


INT8_GEMM = Op("int8_gemm", None, ("epilogue",), _shape, _dtype, LOWERED, _normalize, evaluate=_evaluate)


def int8_gemm(a, b, extras=(), epilogue=None):
    """The term ``epilogue(a @ b in int32, *extras)`` (``epilogue``: a body over ``param(0)`` the sums and
    ``param(k)`` ``extras[k - 1]``; None: the sums themselves)."""
    args = (a, b, *extras)
    return make(INT8_GEMM, args, INT8_GEMM.normalize(args, epilogue))


# -- finding the product -----------------------------------------------------------------------


def _narrowed(t):
    """``t``, an int32 value, as the same layout ops over the int8 or uint8 value it was cast from, or None."""
    if t.op is CAST and t.args[0].dtype in NARROW:
        return t.args[0]
    if t.op in LAYOUT_OPS or (t.op is PAD and t.attr("constant_values") == 0):
        inner = _narrowed(t.args[0])
        return None if inner is None else make(t.op, (inner,), t.attrs)
    return None


def _reshaped(t, shape):
    """``t`` in ``shape``: a constant's array reshaped now, else a reshape (none where the shape is ``t``'s)."""
    if t.shape == shape:
        return t
    if t.op is CONST:
        return ct.const(t.attr("value").array.reshape(shape))
    return ct.reshape(t, shape)


def _as_matrix(t):
    """A product operand of shape ``(1, r, c)`` (a convolution's one group) as ``(r, c)``; a matrix as itself."""
    if t.ndim == 3 and t.shape[0] == 1:
        return _reshaped(t, t.shape[1:])
    return t if t.ndim == 2 else None


def _integer_product(b):
    """``matmul(cast(a, int32), cast(b, int32))`` of narrow matrices (or one group of them) as ``int8_gemm``."""
    x, y = b["_a"], b["_b"]
    if b.term.dtype != np.int32:
        return None
    a, w = _narrowed(x), _narrowed(y)
    if a is None or w is None or a.ndim != w.ndim or (a.ndim == 3 and a.shape[0] != w.shape[0]):
        return None
    a, w = _as_matrix(a), _as_matrix(w)
    if a is None or w is None or 0 in a.shape + w.shape:
        return None
    return _reshaped(int8_gemm(a, _k_major(w)), b.term.shape)


def _k_major(w):
    """A constant ``k x n`` operand stored ``n x k`` (its transpose, a view), as the tensor cores read it: folded
    now, where a variable's would be a copy every step."""
    if w.op is not CONST:
        return w
    return ct.transpose(ct.const(np.ascontiguousarray(w.attr("value").array.T)))


def _largest_magnitude(dtype):
    """The largest ``|v|`` of a ``dtype`` value: 128 for int8, 255 for uint8."""
    info = np.iinfo(dtype)
    return max(-int(info.min), int(info.max))


def exact_in_int32(k, a_dtype, b_dtype):
    """Whether every sum of ``k`` products of an ``a_dtype`` and a ``b_dtype`` value fits in int32, so that an integer
    product stands exactly for a float one: ``|sum| <= k * max|a| * max|b|`` (int8 x int8: ``k <= 131071``, uint8 x
    uint8: ``k <= 33025``, int8 x uint8: ``k <= 65793``). Past it int32 sums wrap where float ones do not."""
    return k * _largest_magnitude(a_dtype) * _largest_magnitude(b_dtype) <= INT32_MAX


def _dequantized(t):
    """``(q, scale)`` of ``cast(q, float32) * scale`` with ``q`` narrow, else None."""
    if t.op is not MULTIPLY or t.dtype != np.float32:
        return None
    for cast, scale in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
        if cast.op is CAST and cast.args[0].dtype in NARROW and scale.dtype == np.float32:
            return cast.args[0], scale
    return None


def _factored(scale, along, other_axis_size):
    """``scale`` (broadcast against a matrix) as a term of shape ``()`` or lying along axis ``along`` (0: a column
    ``(m, 1)``, 1: a row ``(n,)``), or None where it varies along the contracted axis."""
    if scale.size == 1:
        return _reshaped(scale, ())
    shape = (1,) * (2 - scale.ndim) + scale.shape
    if scale.ndim > 2 or shape[1 - along] != 1 or shape[along] == 1:
        return None
    return _reshaped(scale, (shape[0], 1) if along == 0 else (shape[1],))


def _scale_product(sa, sw):
    if sa.op is CONST and sw.op is CONST:
        return ct.const(sa.attr("value").array * sw.attr("value").array)
    return sa * sw


def _dequantized_product(b):
    """``(cast(qa) * sa) @ (cast(qw) * sw)`` with scales that leave the contracted axis alone, as the exact integer
    product times ``sa * sw``, where its int32 sums cannot overflow."""
    x, y = _dequantized(b["_a"]), _dequantized(b["_b"])
    if x is None or y is None or b.term.ndim != 2 or x[0].ndim != 2 or y[0].ndim != 2:
        return None
    (qa, sa), (qw, sw) = x, y
    if not exact_in_int32(qa.shape[1], qa.dtype, qw.dtype):
        return None
    sa, sw = _factored(sa, 0, qa.shape[1]), _factored(sw, 1, qw.shape[0])
    if sa is None or sw is None:
        return None
    product = ct.matmul(ct.cast(qa, "int32"), ct.cast(qw, "int32"))
    return ct.cast(product, "float32") * _scale_product(sa, sw)


def _conv_attrs(b):
    return b["_s"], b["_p"], b["_l"], b["_r"], b["_g"]


def _integer_conv(b):
    """A convolution of narrow values cast to int32: the integer product over its windows (one group)."""
    if _narrowed(b["_x"]) is None or _narrowed(b["_w"]) is None or b.term.dtype != np.int32 or b["_g"] != 1:
        return None
    return as_matmul_over_windows(b["_x"], b["_w"], *_conv_attrs(b))  # whose layout ops int8-gemm narrows


def _dequantized_conv(b):
    """A convolution of dequantized images (one scale) and weights (one scale, or one per output channel) as the
    integer convolution times the scales' product, where its int32 sums cannot overflow."""
    x, w = _dequantized(b["_x"]), _dequantized(b["_w"])
    if x is None or w is None or b["_g"] != 1:
        return None
    (qx, sx), (qw, sw) = x, w
    if sx.size != 1 or not (sw.size == 1 or sw.shape == (qw.shape[0],) + (1,) * (qw.ndim - 1)):
        return None
    if not exact_in_int32(math.prod(qw.shape[1:]), qx.dtype, qw.dtype):  # C_in / groups * R * S a sum
        return None
    spatial = (1,) * (qx.ndim - 2)
    sw = _reshaped(sw, ()) if sw.size == 1 else _reshaped(sw, (qw.shape[0],) + spatial)
    strides, padding, lhs, rhs, groups = _conv_attrs(b)
    product = ct.conv(ct.cast(qx, "int32"), ct.cast(qw, "int32"), strides=strides, padding=padding,
                      lhs_dilation=lhs, rhs_dilation=rhs, groups=groups)
    return ct.cast(product, "float32") * _scale_product(_reshaped(sx, ()), sw)


# -- the epilogue ------------------------------------------------------------------------------


def _folded(b):
    """An elementwise op of an ``int8_gemm`` nobody else reads, over operands that broadcast to its result, as the
    gemm with the op in its epilogue."""
    t = b.term
    if t.op.kind != ELEMENTWISE or (t.op is CAST and t.dtype.itemsize > t.args[0].dtype.itemsize):
        return None  # a widening cast stays outside: the narrow value is smaller, and what the next product reads
    gemms = [a for a in t.args if a.op is INT8_GEMM and not b.shared(a) and a.shape == t.shape]
    if not gemms or t.ndim != 2:
        return None
    g = gemms[0]
    extras, body = list(g.args[2:]), g.attr("epilogue")
    operands = []
    for a in t.args:
        if a is g:
            operands.append(body)
        elif a.op is CONST and a.ndim == 0:
            operands.append(a)
        elif a.ndim <= 2 and broadcast_shapes(a.shape, t.shape) == t.shape:
            if a not in extras:
                extras.append(a)
            operands.append(parameter(2 + extras.index(a) - 1, a))
        else:
            return None
    folded = in_primitives(t, operands) if t.op.formula is not None else make(t.op, tuple(operands), t.attrs)
    return int8_gemm(g.args[0], g.args[1], extras, folded)  # (the body is an attribute: spelled out here, not later)


rules = RuleSet([
    Rule("int8-dequantized-matmul", "matmul(_a, _b)", _dequantized_product),
    Rule("int8-dequantized-conv", "conv(_x, _w, strides=_s, padding=_p, lhs_dilation=_l, rhs_dilation=_r, groups=_g)",
         _dequantized_conv),
    Rule("int8-conv", "conv(_x, _w, strides=_s, padding=_p, lhs_dilation=_l, rhs_dilation=_r, groups=_g)",
         _integer_conv),
    Rule("int8-gemm", "matmul(_a, _b)", _integer_product),
    Rule("int8-epilogue", "_e", _folded),
], name="int8 lowering")


def finish(roots, trace=None, keep=frozenset()):
    """Nothing spans the graph here: every int8 rewrite is local."""
    return list(roots)


def alternatives(planned):
    """No variant of this target is worth planning apart."""
    return []

