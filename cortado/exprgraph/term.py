"""Terms: immutable, hash-consed nodes of the expression graph.

A term is an op applied to argument terms with some attributes. Building the same term twice
returns the same object, so structural equality is identity, common subexpressions are shared
for free, and passes can memoise by identity. A variable's attributes include its declaration
(``ops.leaves.Declaration``), so each ``ct.var`` call is a term of its own. The interning table
holds its terms weakly: a term that nobody references any more is freed, and its entry goes with it.

``==`` and ``!=`` on terms are therefore identity (terms are dict keys: ``state={W: value}``);
the elementwise comparisons are ``ct.equal`` and ``ct.not_equal``. ``< <= > >=`` build terms.
The operators and NumPy-style methods (``x + y``, ``x @ W``, ``x.T``, ``x.sum()``, ...) are the
functions of constructors.py, which installs them on ``Term``: this module, which those
functions build on, knows nothing of them.
"""

import contextlib
import numbers
import threading
import weakref

import numpy as np

from ..errors import DTypeError, ShapeError
from .dtypes import type_string
from .location import format_location, user_location

_interned = weakref.WeakValueDictionary()
_interning = threading.Lock()  # two threads building one term must get one object


def interned_count():
    """How many terms are alive in the interning table (tests use it to prove it does not leak)."""
    return len(_interned)


class RuleViolation(Exception):
    """Raised by an op's shape or dtype rule; ``make`` turns it into a full ShapeError/DTypeError."""

    def __init__(self, reason, kind=ShapeError):
        super().__init__(reason)
        self.kind = kind


def shape_violation(reason):
    return RuleViolation(reason, ShapeError)


def dtype_violation(reason):
    return RuleViolation(reason, DTypeError)


def _describe(operand):
    if not isinstance(operand, Term):
        return repr(operand)  # a Python scalar or other value: show what the user wrote
    from .ops import CONST  # here, not above: the op table imports this module

    if operand.op is CONST and operand.attr("value").weak:
        return repr(operand.attr("value"))
    return type_string(operand.shape, operand.dtype)


def describe_operands(args):
    return ", ".join(_describe(a) for a in args)


_calls = threading.local()  # the call the user made that the terms being built carry out, for their errors


@contextlib.contextmanager
def user_call(text):
    """While a constructor builds a call the user made out of other ops (``conv2d`` out of a ``conv``, pooling out of
    ``windows``), what those ops reject is reported as that call, ``text``, which the user wrote, not as the inner
    op, which they did not. The outermost call is the one the user made."""
    outer = getattr(_calls, "text", None)
    _calls.text = outer or text
    try:
        yield
    finally:
        _calls.text = outer


def rejection(op_name, args, violation):
    """The user-facing error for a rule violation: the user's call (or the op) with its operand types, and the user's
    line."""
    where = getattr(_calls, "text", None) or (f"{op_name}({describe_operands(args)})" if args else op_name)
    return violation.kind(
        f"{where}: {violation}\n"
        f"  built at {format_location(user_location())}"
    )


def apply(op, args, **params):
    """Build ``op(*args)`` from user-level parameters, normalised by the op into attributes."""
    try:
        attrs = op.normalize(args, **params)
    except RuleViolation as violation:
        raise rejection(op.name, args, violation) from None
    return make(op, args, attrs)


class HashedTuple(tuple):
    """A tuple that computes its hash once: for the tuples that many terms hold alike, a fused region's operands and
    body, which each of its results holds. Making (interning) a term hashes its args and attributes; with plain
    tuples, making the n results of a region of n outputs and n operands would hash n * n terms. Equal to, and hashed
    as, the plain tuple of the same items."""

    def __hash__(self):
        found = self.__dict__.get("hash")
        if found is None:
            found = self.__dict__["hash"] = tuple.__hash__(self)
        return found


def make(op, args, attrs=()):
    """The unique term ``op(*args)`` with attribute values ``attrs`` (in ``op.attr_names`` order).

    Shape and dtype are inferred by the op's rules; a rule that rejects its operands raises a
    ShapeError or DTypeError naming the op, the operands and the user's line. ``args`` that are a ``HashedTuple`` are
    kept as they are.
    """
    args = args if type(args) is HashedTuple else tuple(args)
    try:
        attrs = op.attributes._make(attrs)
    except TypeError:
        raise TypeError(f"{op.name} takes the attributes {op.attr_names}, got {tuple(attrs)!r}") from None
    key = (op, args, attrs)
    term = _interned.get(key)
    if term is not None:
        return term
    if op.arity is not None and len(args) != op.arity:
        raise TypeError(f"{op.name} takes {op.arity} operands, got {len(args)}")
    try:
        shape = op.shape_rule(args, *attrs)
        dtype = op.dtype_rule(args, *attrs)
    except RuleViolation as violation:
        raise rejection(op.name, args, violation) from None
    term = Term.__new__(Term)
    _set(term, "op", op)
    _set(term, "args", args)
    _set(term, "attrs", attrs)
    _set(term, "shape", tuple(shape))
    _set(term, "dtype", dtype)
    _set(term, "location", user_location())
    with _interning:
        return _interned.setdefault(key, term)


_set = object.__setattr__


def _refuse_elementwise(other, operator, function):
    """Raise where ``other`` is what an elementwise comparison takes: a number, an array or a list of numbers."""
    if isinstance(other, (numbers.Number, np.ndarray, np.generic, list)):
        raise TypeError(f"`{operator}` on a term is identity (terms are dict keys), not an elementwise test: "
                        f"use {function}(x, y)")


class Identity:
    """What ``==`` and ``!=`` between two terms give: whether they are one term, as a bool (terms are dict keys, and
    ``if x == y`` reads it). It is no number, index or axis: arithmetic on it, an op or an index given it, is refused,
    since ``x == y`` meant elementwise is ``ct.equal(x, y)``; a plain bool made ``mask * (pred == labels)`` a
    constant 0, and an int ``x[pred == labels]`` row 0."""

    __slots__ = ("same",)

    def __init__(self, same):
        object.__setattr__(self, "same", bool(same))

    def __bool__(self):
        return self.same

    def __eq__(self, other):
        return self.same == (other.same if isinstance(other, Identity) else other)

    def __hash__(self):
        return hash(self.same)

    def __repr__(self):
        return repr(self.same)

    def _refused(self, *_):
        raise TypeError(f"{self!r} here is what == or != between two terms gives: they compare the terms themselves "
                        f"(terms are dict keys), not their elements; ct.equal(x, y) and ct.not_equal(x, y) compare "
                        f"the elements")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refused
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = _refused
    __abs__ = __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __invert__ = __float__ = _refused
    __matmul__ = __rmatmul__ = __int__ = __index__ = __array__ = _refused


def cortados_function(name):
    """Whether ``ct.<name>`` is a function (not a module, ``ct.nn``, or a class): what an error may send a user to."""
    import inspect

    import cortado

    found = getattr(cortado, name, None)
    return inspect.isfunction(found) or inspect.isbuiltin(found)


# NumPy's ufuncs that Python's operators call between an array and a term: (the term's operator, its reflection)
OPERATOR_UFUNCS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"), "multiply": ("__mul__", "__rmul__"),
    "divide": ("__truediv__", "__rtruediv__"), "floor_divide": ("__floordiv__", "__rfloordiv__"),
    "remainder": ("__mod__", "__rmod__"), "power": ("__pow__", "__rpow__"), "matmul": ("__matmul__", "__rmatmul__"),
    "less": ("__lt__", "__gt__"), "less_equal": ("__le__", "__ge__"), "greater": ("__gt__", "__lt__"),
    "greater_equal": ("__ge__", "__le__"), "equal": ("__eq__", "__eq__"), "not_equal": ("__ne__", "__ne__"),
    "bitwise_and": ("__and__", "__rand__"), "bitwise_or": ("__or__", "__ror__"),
    "bitwise_xor": ("__xor__", "__rxor__"),
}


class Term:
    """One node of an expression: ``op(*args)`` with attributes, a shape and a dtype.

    Build terms with the functions of ``cortado`` (``ct.var``, ``ct.exp``, ``x @ W``, ...),
    never with this class directly.
    """

    __slots__ = ("op", "args", "attrs", "shape", "dtype", "location", "__weakref__")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """An array's operator with a term (``array + term``, which NumPy calls as ``np.add``) is the term's own
        reflected operator; NumPy's other ufuncs (``np.exp(term)``) refuse the term naming cortado's function, as
        NumPy's functions do (``__array_function__``)."""
        names = OPERATOR_UFUNCS.get(ufunc.__name__)
        if method == "__call__" and not kwargs and names and len(inputs) == 2:
            if inputs[1] is self:
                return getattr(self, names[1])(inputs[0])
            return getattr(self, names[0])(inputs[1])
        name = ufunc.__name__
        hint = f"use ct.{name}" if cortados_function(name) else "use cortado's functions"
        if "out" in kwargs:
            hint = "an array cannot hold a term: write a = a + term, not a += term"
        raise TypeError(f"NumPy's {name} does not take a symbolic term: {hint} (ct.evaluate gives a term's value)")

    def __getattr__(self, name):
        """A method a PyTorch tensor or a NumPy array has and a term lacks (``.numpy()``, ``.argmax(1)``) is refused
        saying what a term is and, where there is one, cortado's function of that name."""
        if name.startswith("__"):
            raise AttributeError(name)
        hint = f"; ct.{name}(x, ...) is cortado's function" if cortados_function(name) else ""
        raise AttributeError(f"a term has no attribute {name!r}: it is a symbolic expression, whose value "
                             f"ct.evaluate(term, feeds) or a compiled program's call gives{hint}")

    def __array_function__(self, func, types, args, kwargs):
        """NumPy's functions (``np.sum``, ``np.concatenate``) refuse terms with the function that takes them, instead
        of an error about an argument the term lacks or an array of one object."""
        name = func.__name__
        hint = f"use ct.{name}" if cortados_function(name) else "use cortado's functions"
        raise TypeError(f"NumPy's {name} does not take a symbolic term: {hint} (ct.evaluate gives a term's value)")

    def __array__(self, dtype=None, copy=None):
        raise TypeError("a symbolic term is no array: ct.evaluate(term, feeds) gives its value, and a compiled "
                        "program's call its outputs")

    def __init__(self, *_, **__):
        raise TypeError("terms are built with cortado's functions (ct.var, ct.exp, x @ W, ...)")

    def __setattr__(self, name, value):
        raise AttributeError("terms are immutable: passes build new terms instead")

    # -- what a term is -------------------------------------------------------------------

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def head(self):
        """The op's name: what the rewrite engine matches on (``"add"``, ``"matmul"``, ...)."""
        return self.op.name

    @property
    def name(self):
        """The variable's name for a ``var`` (the one op with a ``name`` attribute), otherwise None."""
        return getattr(self.attrs, "name", None)

    def attr(self, name):
        """The value of the attribute ``name`` of this term's op (``term.attrs.name`` where the name is known)."""
        if name not in self.op.attr_names:  # (a named tuple's own methods, index and count, are no attributes)
            raise AttributeError(f"{self.op.name} has no attribute {name!r}; it has {', '.join(self.op.attr_names)}")
        return getattr(self.attrs, name)

    @property
    def attr_dict(self):
        return self.attrs._asdict()

    def rebuild(self, args):
        """The same op with the same attributes applied to ``args`` (the rewrite interface)."""
        return make(self.op, args, self.attrs)

    @property
    def where_built(self):
        """``file:line`` of the user code that first built this term."""
        return format_location(self.location)

    def __repr__(self):
        from .printing import inline

        return f"<{inline(self)} : {type_string(self.shape, self.dtype)}>"

    def __bool__(self):
        raise TypeError(
            "a symbolic term has no truth value; use ct.where for a choice, "
            "and `is` (or ==, which is identity) to compare terms"
        )

    def __eq__(self, other):
        """Identity, so that terms key dicts (a program's state, the gradients of variables). A term compared with a
        number or an array, NumPy's elementwise test, is refused rather than answered ``False``, which
        ``ct.where(x == 0, ...)`` would take for a constant condition."""
        if isinstance(other, Term):
            return Identity(self is other)
        _refuse_elementwise(other, "==", "ct.equal")
        return NotImplemented

    def __ne__(self, other):
        if isinstance(other, Term):
            return Identity(self is not other)
        _refuse_elementwise(other, "!=", "ct.not_equal")
        return NotImplemented

    def __getitem__(self, key):
        """NumPy's basic indexing, ``x[1:, ::-1, None, ..., 0]``: crops, flips, strided windows and a reshape
        (slicing.py, imported here lazily, since it builds on the constructors that build on this module)."""
        from .slicing import index

        return index(self, key)

    def __iter__(self):
        # without it, __getitem__ would make terms iterable by Python's old protocol, which stops only at an IndexError
        raise TypeError("a symbolic term is not iterable; index it (x[i]) or split it (ct.split)")

    __hash__ = object.__hash__
