"""Patterns: terms with holes, written in code or in Python-syntax text.

In text a name that starts with ``_`` is a placeholder (``_x + 2*_y``) and ``*_xs`` as the last
argument of a call matches the remaining arguments. In code, ``placeholders("x y")`` gives
placeholders that build patterns with the usual operators and with cortado's functions
(``ct.exp(x) + 1``), and placeholders may be constrained to constants, a dtype class or a rank.
Any other name in a text pattern matches itself (in a tensor expression: the variable of that
name), a number matches a number (in a tensor expression: a constant whose every element equals
it), and a term put in a code pattern matches exactly that term.
"""

import numbers

from ..errors import RewriteError
from ..exprgraph.term import Term
from . import text as textforms

DTYPE_CLASSES = {
    "floating": "f", "integer": "iu", "signed": "i", "unsigned": "u", "bool": "b", "numeric": "iuf",
}


class Pattern:
    """Base of pattern nodes: operators and cortado's functions build bigger patterns."""

    __slots__ = ()

    @classmethod
    def __cortado_function__(cls, name, operands, params):
        return PatternNode(name, operands, params)

    def _node(self, head, *args):
        return PatternNode(head, args)

    def __add__(self, other):
        return self._node("add", self, other)

    def __radd__(self, other):
        return self._node("add", other, self)

    def __sub__(self, other):
        return self._node("subtract", self, other)

    def __rsub__(self, other):
        return self._node("subtract", other, self)

    def __mul__(self, other):
        return self._node("multiply", self, other)

    def __rmul__(self, other):
        return self._node("multiply", other, self)

    def __truediv__(self, other):
        return self._node("divide", self, other)

    def __rtruediv__(self, other):
        return self._node("divide", other, self)

    def __floordiv__(self, other):
        return self._node("floor_divide", self, other)

    def __rfloordiv__(self, other):
        return self._node("floor_divide", other, self)

    def __mod__(self, other):
        return self._node("remainder", self, other)

    def __rmod__(self, other):
        return self._node("remainder", other, self)

    def __pow__(self, other):
        return self._node("power", self, other)

    def __rpow__(self, other):
        return self._node("power", other, self)

    def __matmul__(self, other):
        return self._node("matmul", self, other)

    def __rmatmul__(self, other):
        return self._node("matmul", other, self)

    def __neg__(self):
        return self._node("negative", self)

    def __lt__(self, other):
        return self._node("less", self, other)

    def __le__(self, other):
        return self._node("less_equal", self, other)

    def __gt__(self, other):
        return self._node("greater", self, other)

    def __ge__(self, other):
        return self._node("greater_equal", self, other)

    @property
    def T(self):
        return PatternNode("transpose", (self,))

    __hash__ = object.__hash__

    def __eq__(self, other):  # identity, as for terms: patterns are dict keys
        return self is other

    def __bool__(self):
        raise TypeError("a pattern has no truth value; match it with cortado.rules.matchex")


class Placeholder(Pattern):
    """Matches any term (meeting its constraints); a name used twice must bind equal terms."""

    __slots__ = ("name", "const", "dtype", "rank")

    def __init__(self, name, const=False, dtype=None, rank=None):
        if dtype is not None and dtype not in DTYPE_CLASSES:
            from ..exprgraph.dtypes import as_dtype

            dtype = as_dtype(dtype)
        self.name, self.const, self.dtype, self.rank = name, const, dtype, rank

    def __repr__(self):
        return self.name


class Splat(Pattern):
    """``*xs``: as the last argument, matches all remaining arguments (as a tuple)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __iter__(self):  # so that f(*xs) in code passes the splat itself as the last argument
        yield self

    def __repr__(self):
        return f"*{self.name}"


class Literal(Pattern):
    """A number (or other Python literal) in a pattern."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return repr(self.value)


class Named(Pattern):
    """A name in a text pattern that is no placeholder: the symbol, or the tensor variable, of that name."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


class Exact(Pattern):
    """A term put into a pattern: matches that very term."""

    __slots__ = ("term",)

    def __init__(self, term):
        self.term = term

    def __repr__(self):
        return repr(self.term)


class PatternNode(Pattern):
    """``head(*args, **params)``: ``params`` are attributes (``axis=``, ``keepdims=``, ...)."""

    __slots__ = ("head", "args", "params", "splat")

    def __init__(self, head, args, params=None):
        self.head = head
        self.args = tuple(as_pattern(a) for a in args)
        self.params = dict(params or {})
        self.splat = self.args[-1] if self.args and isinstance(self.args[-1], Splat) else None  # trailing *xs

    def __repr__(self):
        """As it is written: an operator of a text pattern between its operands (``_a + _b``), in parentheses where
        it is an operand itself; any other head as a call."""
        if _operator(self) and len(self.args) == 2:
            return f"{_operand(self.args[0])} {self.head} {_operand(self.args[1])}"
        if _operator(self):
            return f"{self.head}{' ' if self.head == 'not' else ''}{_operand(self.args[0])}"
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.params.items()]
        return f"{self.head}({', '.join(parts)})"


INFIX = frozenset({"+", "-", "*", "/", "//", "%", "**", "@", "<", "<=", ">", ">=", "==", "!=", "and", "or", "&", "|",
                   "^", "<<", ">>"})  # a text pattern's binary operators, its heads
PREFIX = frozenset({"-", "+", "~", "not"})  # and its unary ones


def _operator(pattern):
    """Whether ``pattern`` is a call of a text pattern's operator, written with it rather than as a call."""
    return isinstance(pattern, PatternNode) and not pattern.params and (
        pattern.head in INFIX and len(pattern.args) == 2 or pattern.head in PREFIX and len(pattern.args) == 1)


def _operand(pattern):
    """``pattern`` as an operand of an operator: in parentheses where it is an operator's call itself."""
    return f"({pattern!r})" if _operator(pattern) else repr(pattern)


def placeholders(names, *, const=False, dtype=None, rank=None):
    """Placeholders for the space-separated ``names``; ``*name`` makes a ``Splat``.

    ``const=True`` matches constants only, ``dtype`` a dtype class ("floating", "integer",
    "signed", "unsigned", "bool", "numeric") or one dtype, ``rank`` tensors of that rank. One
    name gives one placeholder, several give a tuple.
    """
    made = []
    for name in names.replace(",", " ").split():
        if name.startswith("*"):
            made.append(Splat(name[1:]))
        else:
            made.append(Placeholder(name, const=const, dtype=dtype, rank=rank))
    if not made:
        raise RewriteError(f"placeholders: no names in {names!r}")
    return made[0] if len(made) == 1 else tuple(made)


def as_pattern(value):
    """``value`` as a pattern: text is parsed, terms match themselves, numbers are literals."""
    if isinstance(value, Pattern):
        return value
    if isinstance(value, str):
        return from_text(textforms.parse(value))
    if isinstance(value, (Term, textforms.TextTerm)):
        return Exact(value)
    if isinstance(value, (numbers.Number, bool)):
        return Literal(value)
    raise RewriteError(f"cannot use {type(value).__name__} {value!r} in a pattern")


def from_text(term):
    """A parsed text pattern as a pattern: ``_x`` placeholders, ``*_xs`` splats, literals."""
    head = term.head
    if head == textforms.SYMBOL:
        return Placeholder(term.value) if term.value.startswith("_") else Named(term.value)
    if head == textforms.CONSTANT:
        return Literal(term.value)
    if head == textforms.STARRED and term.args[0].head == textforms.SYMBOL and term.args[0].value.startswith("_"):
        return Splat(term.args[0].value)
    params = {name: _keyword(value) for name, value in term.keyword_items}
    return PatternNode(head, [from_text(a) for a in term.positional], params)


def _keyword(term):
    """A keyword argument of a text pattern: a placeholder, a Python literal, or a sub-pattern."""
    if term.head == textforms.SYMBOL and term.value.startswith("_"):
        return Placeholder(term.value)
    try:
        return textforms.literal_value(term)
    except ValueError:
        return from_text(term)


def placeholder_names(pattern):
    """Every placeholder and splat name that ``pattern`` binds, in order of appearance."""
    found = []

    def visit(p):
        if isinstance(p, (Placeholder, Splat)) and p.name not in found:
            found.append(p.name)
        elif isinstance(p, PatternNode):
            for a in p.args:
                visit(a)
            for v in p.params.values():
                if isinstance(v, Pattern):
                    visit(v)

    visit(pattern)
    return found


def matchable(value):
    """``value`` as a pattern to match with: a splat may only stand last among arguments there
    (in a replacement it may stand anywhere, spliced in)."""
    pattern = as_pattern(value)
    stack = [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, PatternNode):
            for position, arg in enumerate(p.args):
                if isinstance(arg, Splat) and position != len(p.args) - 1:
                    raise RewriteError(f"in the pattern {pattern!r}, {arg!r} must be the last argument: "
                                       f"it matches all the remaining ones")
            stack.extend(p.args)
    return pattern
