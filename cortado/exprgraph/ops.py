"""The op table: for every op, its arity, attributes, shape rule, dtype rule and kind.

This is the single source of what an op *is*. Later stages (rules, backends) look ops up here by
name and add what they need (a NumPy implementation, a derivative, a kernel) in tables of their
own. Rules raise ``RuleViolation`` with a short reason; ``term.make`` adds the op name, operand
types and the user's line.

Dtype rules of the elementwise ops ask NumPy's own ufuncs (``resolve_dtypes``), so promotion is
exactly NumPy 2's; Python scalars are weak (NEP 50) and are materialised by the constructors
before a term is built, so the rules here only ever see concrete dtypes. bfloat16 (ml_dtypes')
follows the same rules, which ml_dtypes alone does not: see ``weak_scalars_as_bfloat16``.
"""

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import einsum as einsum_rules
from ..errors import DTypeError
from .dtypes import BFLOAT16, as_dtype, is_bfloat16, is_float, kind_of
from .term import dtype_violation, make, shape_violation

ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
LEAF = "leaf"
CONTRACTION = "contraction"
LAYOUT = "layout"
FUSED = "fused"
LOWERED = "lowered"  # built only by a backend's lowering rules, after differentiation


@dataclass(frozen=True, eq=False)
class Op:
    """An op: its name, arity (None: any number), attribute names, rules and kind."""

    name: str
    arity: int | None
    attr_names: tuple
    shape_rule: Callable
    dtype_rule: Callable
    kind: str
    normalize: Callable | None = None  # user parameters -> attribute tuple; may raise RuleViolation

    @property
    def elementwise(self):
        return self.kind == ELEMENTWISE

    def __repr__(self):
        return f"Op({self.name})"


# -- shape helpers ---------------------------------------------------------------------------


def broadcast_shapes(*shapes):
    """NumPy broadcasting of ``shapes``, or a RuleViolation saying which do not broadcast."""
    ndim = max(len(s) for s in shapes)
    result = []
    for i in range(-ndim, 0):
        sizes = {s[i] for s in shapes if len(s) >= -i}
        sizes.discard(1)
        if len(sizes) > 1:
            listed = " and ".join(str(s) for s in shapes)
            raise shape_violation(f"shapes {listed} do not broadcast (dimension {i}: sizes {sorted(sizes)})")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def int_tuple(value, what):
    """``value`` (an int or a sequence of ints) as a tuple of Python ints; ``what`` names it."""
    items = (value,) if _is_int(value) else value
    try:
        items = tuple(items)
    except TypeError:
        raise shape_violation(f"{what} must be an int or a tuple of ints, not {value!r}") from None
    if not all(_is_int(v) for v in items):
        raise shape_violation(f"{what} must be an int or a tuple of ints, not {value!r}")
    return tuple(int(v) for v in items)


def as_shape(shape):
    """A shape as a tuple of non-negative Python ints; a bare int is a 1-d shape."""
    dims = int_tuple(shape, "a shape")
    if any(d < 0 for d in dims):
        raise shape_violation(f"a shape must have non-negative sizes, not {shape!r}")
    return dims


def normalize_axes(axis, ndim):
    """Axes as a sorted tuple of non-negative ints; None means every axis."""
    if axis is None:
        return tuple(range(ndim))
    result = []
    for a in int_tuple(axis, "axis (when not None)"):
        if not -ndim <= a < ndim:
            raise shape_violation(f"axis {a} is out of range for a tensor of rank {ndim}")
        if a % ndim in result:
            raise shape_violation(f"axis {axis!r} repeats axis {a % ndim}")
        result.append(a % ndim)
    return tuple(sorted(result))


def _size(shape):
    return functools.reduce(operator.mul, shape, 1)


# -- dtype helpers ---------------------------------------------------------------------------


def promoted(dtypes):
    """NumPy's common dtype of ``dtypes``, or a RuleViolation naming them where there is none
    (bfloat16 has one only with bool, int8, uint8, float32 and float64)."""
    try:
        return np.result_type(*dtypes)
    except TypeError:  # NumPy's DTypePromotionError
        names = " and ".join(dict.fromkeys(d.name for d in dtypes))
        raise dtype_violation(f"NumPy has no common dtype for {names}; cast one operand to the other's dtype "
                              f"or to float32 first (ct.cast)") from None


def weak_scalars_as_bfloat16(keys):
    """Promotion keys (dtypes; Python types or values for weak scalars) as NEP 50 would take them.

    ml_dtypes' bfloat16 knows no weak scalars: NumPy alone makes ``x_bf16 * 0.5`` float32 and
    ``where(c, x_bf16, 0.5)`` float64. So where the tensors promote to bfloat16, each weak scalar
    becomes bfloat16, as it would become float16. Tensors that do not promote with bfloat16
    (float16, int16 and wider ints) are refused here, where ufunc loops would meet in a float.
    """
    strong = [k for k in keys if isinstance(k, np.dtype)]
    if not any(is_bfloat16(d) for d in strong) or not is_bfloat16(promoted(strong)):
        return keys
    return tuple(k if isinstance(k, np.dtype) else BFLOAT16 for k in keys)


@functools.cache
def ufunc_loop(ufunc, dtypes):
    """The dtypes NumPy's ``ufunc`` computes in for operands of ``dtypes`` (Python types: weak)."""
    try:
        return ufunc.resolve_dtypes(tuple(weak_scalars_as_bfloat16(dtypes)) + (None,) * ufunc.nout)
    except TypeError:  # NumPy's "no loop" errors are TypeErrors
        names = ", ".join(getattr(d, "name", getattr(d, "__name__", str(d))) for d in dtypes)
        raise dtype_violation(f"NumPy's {ufunc.__name__} is not defined for ({names})") from None


def ufunc_dtype(ufunc):
    def rule(args, *attrs):
        return ufunc_loop(ufunc, tuple(a.dtype for a in args))[-1]

    return rule


@functools.cache
def _reduced_dtype(reduction, dtype):
    return getattr(np, reduction)(np.zeros(1, dtype)).dtype


def same_dtype(args, *attrs):
    return args[0].dtype


# -- leaves ----------------------------------------------------------------------------------


class Constant:
    """A constant's value: a read-only array, compared and hashed by dtype, shape and bytes.

    ``weak`` marks a Python scalar whose dtype is still open (NEP 50): ``x * 2.0`` keeps
    ``x``'s float32. Constructors materialise weak constants at the dtype they combine to.
    A constant whose elements are all equal (a *splat*, such as the zeros a rewrite leaves) is
    stored as one element broadcast to its shape, so it costs no memory however large it is.
    """

    __slots__ = ("array", "weak", "scalar", "_key")

    def __init__(self, array, weak=False):
        array = np.asarray(array)
        self.weak = weak
        self.scalar = _splat_element(array)
        if self.scalar is not None and array.size > 1:
            self.array = np.broadcast_to(self.scalar, array.shape)  # read-only, one element
            content = self.scalar.tobytes()
        else:
            self.array = np.array(array, order="C", copy=True)
            self.array.flags.writeable = False
            content = self.array.tobytes()
        self._key = (array.dtype.str, array.shape, content, weak)

    def __eq__(self, other):
        return isinstance(other, Constant) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        if self.array.ndim and self.scalar is not None:
            return f"full({self.scalar[()]})"  # every element this value; the term's type gives the shape
        if self.array.ndim:
            return np.array2string(self.array, separator=", ", threshold=6)
        return str(self.array[()])  # NumPy's shortest form for the dtype: 1.7320508 for float32


def _splat_element(array):
    """The one element every element of ``array`` equals, bit for bit, as a 0-d array; else None."""
    if array.size == 0:
        return None
    first = np.array(array[(0,) * array.ndim])
    if array.size > 1 and any(array.strides):  # a broadcast of one element has all strides 0
        rows = np.ascontiguousarray(array).view(np.uint8).reshape(array.size, array.dtype.itemsize)
        if not (rows == rows[0]).all():
            return None
    first.flags.writeable = False
    return first


def dtype_attr(spec, what):
    """A dtype attribute, checked: an unsupported one is refused naming ``what`` it was for."""
    try:
        return as_dtype(spec)
    except DTypeError as error:
        raise dtype_violation(f"{what}: {error}") from None


def _var_normalize(args, name, shape, dtype):
    if not isinstance(name, str) or not name:
        raise shape_violation(f"a variable's name must be a non-empty string, not {name!r}")
    return (name, as_shape(shape), dtype_attr(dtype, f"variable {name!r}"))


VAR = Op("var", 0, ("name", "shape", "dtype"),
         lambda args, name, shape, dtype: shape,
         lambda args, name, shape, dtype: dtype,
         LEAF, _var_normalize)
CONST = Op("const", 0, ("value",),
           lambda args, value: value.array.shape,
           lambda args, value: value.array.dtype,
           LEAF, lambda args, value: (value,))


# -- elementwise -----------------------------------------------------------------------------


def _broadcast_rule(args, *attrs):
    return broadcast_shapes(*(a.shape for a in args))


def _plain(args):
    return ()


def _elementwise(name, arity, dtype_rule):
    return Op(name, arity, (), _broadcast_rule, dtype_rule, ELEMENTWISE, _plain)


def _float_result(args):
    """The dtype ``exp`` would give: floats keep theirs, ints and bool become floating."""
    return ufunc_loop(np.exp, (args[0].dtype,))[-1]


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
    "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.absolute, "sign": np.sign,
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
    known = exponent.op.name == "const" and exponent.attrs[0].scalar is not None and exponent.attrs[0].scalar >= 0
    return not (exponent.dtype.kind in "ub" or known)


_ops = [_elementwise(name, ufunc.nin, ufunc_dtype(ufunc)) for name, ufunc in UFUNC_OPS.items()]
_ops += [
    _elementwise("sigmoid", 1, _float_result),
    _elementwise("relu", 1, _relu_dtype),
    _elementwise("softplus", 1, _float_result),
    _elementwise("gelu", 1, _float_operand),
    _elementwise("gelu_grad", 1, _float_operand),
    _elementwise("where", 3, _where_dtype),
    Op("cast", 1, ("dtype",), _broadcast_rule, lambda args, dtype: dtype, ELEMENTWISE, _cast_normalize),
]


# -- reductions ------------------------------------------------------------------------------


def _reduce_normalize(args, axis=None, keepdims=False):
    return (normalize_axes(axis, args[0].ndim), bool(keepdims))


def _reduce_shape(args, axes, keepdims):
    shape = args[0].shape
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _nonempty_reduce_shape(args, axes, keepdims):
    empty = [a for a in axes if args[0].shape[a] == 0]
    if empty:
        raise shape_violation(f"cannot reduce over axis {empty[0]}, which has size 0 (no identity)")
    return _reduce_shape(args, axes, keepdims)


def _softmax_normalize(args, axis=-1):
    return (normalize_axes(axis, args[0].ndim),)


def _softmax_shape(args, axes):
    _nonempty_reduce_shape(args, axes, True)  # only to reject empty axes
    return args[0].shape


_ops += [
    Op("sum", 1, ("axes", "keepdims"), _reduce_shape,
       lambda args, axes, keepdims: _reduced_dtype("sum", args[0].dtype), REDUCTION, _reduce_normalize),
    Op("mean", 1, ("axes", "keepdims"), _reduce_shape,
       lambda args, axes, keepdims: _reduced_dtype("mean", args[0].dtype), REDUCTION, _reduce_normalize),
    Op("max", 1, ("axes", "keepdims"), _nonempty_reduce_shape,
       lambda args, axes, keepdims: args[0].dtype, REDUCTION, _reduce_normalize),
    Op("logsumexp", 1, ("axes", "keepdims"), _nonempty_reduce_shape,
       lambda args, axes, keepdims: _float_result(args), REDUCTION, _reduce_normalize),
    Op("softmax", 1, ("axes",), _softmax_shape,
       lambda args, axes: _float_result(args), REDUCTION, _softmax_normalize),
    Op("log_softmax", 1, ("axes",), _softmax_shape,
       lambda args, axes: _float_result(args), REDUCTION, _softmax_normalize),
]


# -- contractions ----------------------------------------------------------------------------


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
    return (einsum_rules.parse(subscripts, [a.shape for a in args])[0],)


def _einsum_dtype(args, subscripts):
    return promoted([a.dtype for a in args])


def _matmul_dtype(args):
    """NumPy's, except that bfloat16 operands give bfloat16 (NumPy's loop gives float32): as in
    PyTorch, JAX and cuBLAS, the products accumulate in float32 and the result is rounded once."""
    dtypes = tuple(a.dtype for a in args)
    if any(is_bfloat16(d) for d in dtypes) and is_bfloat16(promoted(dtypes)):
        return BFLOAT16
    return ufunc_loop(np.matmul, dtypes)[-1]


_ops += [
    Op("matmul", 2, (), _matmul_shape, _matmul_dtype, CONTRACTION, _plain),
    Op("einsum", None, ("subscripts",),
       lambda args, subscripts: einsum_rules.parse(subscripts, [a.shape for a in args])[1],
       _einsum_dtype, CONTRACTION, _einsum_normalize),
]


# ``gemm(a, b[, c][, bias][, aux])``: what ``matmul`` lowers to for a BLAS library, cuBLASLt's form
# ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)``. ``op`` swaps the last two axes where
# ``transpose_a`` / ``transpose_b`` say; ``c`` is there when ``beta`` is not 0, ``bias`` (a row
# added to every row of the product) when the epilogue names it. The epilogue ``dgelu`` is gelu's
# backward: ``alpha * op(a) @ op(b) * gelu_grad(aux)``, ``aux`` the gelu argument of the forward
# pass (of the product's shape). Some epilogues have a second result, the term with ``output=1``
# (``output=0`` is the product): ``bgrad_a`` the sums of ``op(a)`` over the contracted axis (a
# bias gradient of length m), ``bgrad_b`` those of ``op(b)`` (length n), ``dgelu_bgrad`` the
# column sums of its dgelu product (length n). Only lowering rules build gemms.
GEMM_EPILOGUES = ("none", "bias", "relu", "bias_relu", "gelu", "bias_gelu", "dgelu", "dgelu_bgrad", "bgrad_a", "bgrad_b")
TWO_RESULTS = ("dgelu_bgrad", "bgrad_a", "bgrad_b")  # the epilogues with a second result


def gemm_operands(args, beta, epilogue):
    """``(a, b, c, bias, aux)`` of a gemm's arguments, None for those it has not."""
    a, b, *rest = args
    c = rest.pop(0) if beta else None
    bias = rest.pop(0) if "bias" in epilogue else None
    aux = rest.pop(0) if epilogue.startswith("dgelu") else None
    return a, b, c, bias, aux


def _gemm_shape(args, transpose_a, transpose_b, alpha, beta, epilogue, output):
    if epilogue not in GEMM_EPILOGUES:
        raise shape_violation(f"unknown epilogue {epilogue!r}; the epilogues are {GEMM_EPILOGUES}")
    if output not in ((0, 1) if epilogue in TWO_RESULTS else (0,)):
        raise shape_violation(f"the {epilogue} epilogue has no result {output}")
    if len(args) != 2 + bool(beta) + ("bias" in epilogue) + epilogue.startswith("dgelu"):
        raise shape_violation("gemm takes a, b, then c when beta is not 0, then bias when the epilogue adds one, "
                              "then the gelu argument when the epilogue is dgelu")
    if beta and epilogue.startswith("dgelu"):
        raise shape_violation("the dgelu epilogue scales the product alone: it takes no c")
    a, b, c, bias, aux = gemm_operands(args, beta, epilogue)
    if a.ndim < 2 or b.ndim < 2:
        raise shape_violation("gemm needs operands of rank 2 or more")
    if epilogue in TWO_RESULTS and (a.ndim, b.ndim) != (2, 2):
        raise shape_violation(f"the {epilogue} epilogue takes matrices, not batches of them")
    m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
    if k != k2:
        raise shape_violation(f"the contracted dimensions differ: {k} and {k2}")
    out = broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
    if c is not None and c.shape != out:
        raise shape_violation(f"c has shape {c.shape}, the product {out}")
    if bias is not None and bias.shape != (n,):
        raise shape_violation(f"the bias has shape {bias.shape}; it must be ({n},)")
    if aux is not None and aux.shape != out:
        raise shape_violation(f"the gelu argument has shape {aux.shape}, the product {out}")
    if output:
        return (m,) if epilogue == "bgrad_a" else (n,)
    return out


def _gemm_normalize(args, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", output=0):
    return (bool(transpose_a), bool(transpose_b), float(alpha) + 0.0, float(beta) + 0.0, epilogue, int(output))  # no -0.0


def _gemm_dtype(args, *attrs):
    dtypes = {a.dtype for a in args}
    if len(dtypes) != 1 or not is_float(next(iter(dtypes))):
        raise dtype_violation("gemm needs operands of one floating dtype")
    return args[0].dtype


_ops.append(Op("gemm", None, ("transpose_a", "transpose_b", "alpha", "beta", "epilogue", "output"), _gemm_shape,
               _gemm_dtype, LOWERED, _gemm_normalize))


# -- layout ----------------------------------------------------------------------------------


def _transpose_normalize(args, axes=None):
    ndim = args[0].ndim
    if axes is None:
        return (tuple(range(ndim))[::-1],)
    given = int_tuple(axes, "axes")
    perm = tuple(a % ndim if -ndim <= a < ndim else -1 for a in given)
    if sorted(perm) != list(range(ndim)):
        raise shape_violation(f"axes {given} are not a permutation of range({ndim})")
    return (perm,)


def _reshape_normalize(args, shape):
    dims = list(int_tuple(shape, "a shape"))
    size = args[0].size
    if dims.count(-1) > 1:
        raise shape_violation(f"shape {tuple(dims)} has more than one -1")
    if -1 in dims:
        known = _size(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise shape_violation(f"cannot reshape {size} elements into {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    dims = as_shape(dims)
    if _size(dims) != size:
        raise shape_violation(f"cannot reshape {size} elements into {dims}")
    return (dims,)


def _broadcast_to_normalize(args, shape):
    shape = as_shape(shape)
    source = args[0].shape
    lead = len(shape) - len(source)
    if lead < 0 or any(d not in (1, t) for d, t in zip(source, shape[lead:])):
        raise shape_violation(f"cannot broadcast {source} to {shape}")
    return (shape,)


_ops += [
    Op("transpose", 1, ("axes",), lambda args, axes: tuple(args[0].shape[a] for a in axes),
       same_dtype, LAYOUT, _transpose_normalize),
    Op("reshape", 1, ("shape",), lambda args, shape: shape, same_dtype, LAYOUT, _reshape_normalize),
    Op("broadcast_to", 1, ("shape",), lambda args, shape: shape, same_dtype, LAYOUT,
       _broadcast_to_normalize),
]

# -- fused regions -----------------------------------------------------------------------------


def parameter(index, like):
    """The ``index``-th parameter of a fused body: a variable ``in{index}`` typed as ``like``."""
    return make(VAR, (), (f"in{index}", like.shape, like.dtype))


def _fused_shape(args, outputs, index):
    """The body's output ``index``. The parameters' types are fusion's to get right: checking them
    here would walk the whole body once per output, quadratic in a region of many outputs."""
    if not 0 <= index < len(outputs):
        raise shape_violation(f"output {index} of a fused body of {len(outputs)} outputs")
    return outputs[index].shape


# ``fused(*inputs, outputs=body, index=k)`` is output ``k`` of a fused region: ``body`` is a tuple
# of terms over the parameters ``in0, in1, ...`` (one per input). The terms of one region share
# ``inputs`` and ``body`` and differ in ``index``; a backend runs them as one kernel.
FUSED_OP = Op("fused", None, ("outputs", "index"), _fused_shape,
              lambda args, outputs, index: outputs[index].dtype, FUSED)

OPS = {op.name: op for op in [VAR, CONST] + _ops + [FUSED_OP]}
