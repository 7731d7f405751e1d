"""What every family of ops shares: the ``Op`` record, the kinds of op, and the shape and dtype
helpers that the families' rules are written with.
"""

import functools
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import DTypeError
from ..dtypes import BFLOAT16, as_dtype, is_bfloat16, is_float, is_float8, is_narrow_float
from ..term import dtype_violation, make, shape_violation

ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
LEAF = "leaf"
CONTRACTION = "contraction"
LAYOUT = "layout"
FUSED = "fused"
LOWERED = "lowered"  # built only by a backend's lowering rules, after differentiation
INDEXING = "indexing"  # reads elements of one operand at the places another one holds
# the kinds of op that take float8 operands: they hold, move or multiply values (``dtypes``); a lowered op's own
# dtype rule says which it takes
FLOAT8_KINDS = (LEAF, LAYOUT, CONTRACTION, INDEXING, FUSED, LOWERED)


@dataclass(frozen=True, eq=False)
class Op:
    """An op: its name, arity (None: any number), attribute names, rules, kind and meaning. Stages dispatch on the
    record itself (``term.op is MATMUL``, dicts keyed by it), never on its name, and read a term's attributes by
    name (``term.attrs.strides``): ``attributes`` is the named tuple they are kept in."""

    name: str
    arity: int | None
    attr_names: tuple
    shape_rule: Callable
    dtype_rule: Callable
    kind: str
    normalize: Callable | None = None  # user parameters -> attribute tuple; may raise RuleViolation
    results: Callable | None = None  # attributes -> how many results one kernel of it makes (None: one)
    result_attr: str | None = None  # with ``results``: the attribute that says which result a term is
    evaluate: Callable | None = None  # the reference semantics: (operand arrays, *attributes) -> array
    computes_in_float32: Callable | None = None  # operand dtype -> whether it is computed in float32, rounded once
    formula: Callable | None = None  # a composite's meaning in primitives, ``(x, xp) -> value`` over the namespace
    # ``xp`` (NumPy's, or the constructors'): its reference semantics, and what it is spelled out as before any
    # backend emits a kernel (``rules.primitives``), so that its formula is written once (in ``numerics``)
    grouped: bool = False  # one kernel of it reads its operands as one piece of memory, and writes its results so
    asynchronous: bool = False  # it runs beside the kernels after it (another stream) until one reads a result;
    # such kernels are issued in the order of their attributes, the same on every rank of a job
    positions: tuple = ()  # the operands read as places (indices), not as numbers: never converted to a float
    turns: tuple | None = None  # where a unary op's value turns (it is monotone between): the test strategies
    # bound its values by its ``evaluate`` at these points and at an interval's ends (None: they know it otherwise)
    takes_float8: bool = False  # it takes float8 operands though its kind does not (``cast``)

    def __post_init__(self):
        object.__setattr__(self, "attributes", namedtuple(f"{self.name}_attributes", self.attr_names))
        if not (self.takes_float8 or self.kind in FLOAT8_KINDS):
            object.__setattr__(self, "dtype_rule", _no_float8(self.name, self.dtype_rule))

    @property
    def elementwise(self):
        return self.kind == ELEMENTWISE

    def results_of(self, term):
        """Every result of the kernel that computes ``term``, in order (``term`` alone for most ops):
        terms that differ from ``term`` only in ``result_attr``."""
        if self.result_count(term) == 1:
            return (term,)
        return tuple(make(self, term.args, term.attrs._replace(**{self.result_attr: k}))
                     for k in range(self.result_count(term)))

    def result_count(self, term):
        """How many results the kernel that computes ``term`` makes."""
        return 1 if self.results is None else self.results(*term.attrs)

    def __repr__(self):
        return f"Op({self.name})"


def _no_float8(name, dtype_rule):
    """``dtype_rule``, refusing float8 operands first: ``name`` does arithmetic, which float8 values are not for."""

    def rule(args, *attrs):
        for a in args:
            if is_float8(a.dtype):
                raise dtype_violation(f"{name} does not take {a.dtype.name} values: float8 tensors are cast, moved "
                                      f"and multiplied (matmul, einsum) only; cast to float32 or bfloat16 first")
        return dtype_rule(args, *attrs)

    return rule


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


def narrow_once_floating(dtype):
    """Whether ``dtype`` is narrow in the float exp computes it in (float16, bfloat16; int8, uint8 and bool, which
    become float16): the operands an op that computes in float32 takes so."""
    return is_narrow_float(dtype if is_float(dtype) else ufunc_loop(np.exp, (dtype,))[-1])


def floating(x):
    """Array ``x`` in the floating dtype NumPy's exp would compute it in (ints and bools widen)."""
    return x if is_float(x.dtype) else x.astype(ufunc_loop(np.exp, (x.dtype,))[-1])


def float_result(args):
    """The dtype ``exp`` would give: floats keep theirs, ints and bool become floating."""
    return ufunc_loop(np.exp, (args[0].dtype,))[-1]


def dtype_attr(spec, what):
    """A dtype attribute, checked: an unsupported one is refused naming ``what`` it was for."""
    try:
        return as_dtype(spec)
    except DTypeError as error:
        raise dtype_violation(f"{what}: {error}") from None


def no_attributes(args):
    """The ``normalize`` of an op that takes no parameters."""
    return ()
