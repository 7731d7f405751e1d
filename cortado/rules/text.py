"""Python-syntax text as terms, so the rewrite engine can work on untyped symbolic expressions.

Text is read with ``ast`` (never ``eval``) into ``TextTerm``s, which offer the same small interface
as tensor terms (``head``, ``args``, ``rebuild``), and written back formatted exactly as
``ast.unparse`` formats it. Function calls need not name anything real: ``foo(bar(x))`` is a term
with head ``foo``. Reading and writing keep stacks of their own instead of recursing, so text
nested thousands deep (a sum of 5000 terms, 2000 minus signs) works as shallow text does, up to
the depth Python's parser reads; deeper text is a RewriteError, never a RecursionError.

Heads are Python's own spelling: operators are ``+ - * / // % ** @`` (``-`` with one argument is
negation), comparisons ``< <= > >= == !=``, and ``and or not``; a call's head is the function's
(possibly dotted) name. Names are ``symbol`` atoms and literals ``constant`` atoms. Like tensor
terms, text terms are interned: equal text gives the same object.
"""

import ast
import sys
import threading
import weakref

from ..errors import RewriteError
from ..exprgraph.graph import post_order

SYMBOL = "$symbol"
CONSTANT = "$constant"
STARRED = "*()"  # *xs, unpacked into a call
TUPLE = "(,)"
LIST = "[,]"
SUBSCRIPT = "[]"

BINARY = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
    ast.BitXor: "^", ast.BitAnd: "&",
}
UNARY = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not", ast.Invert: "~"}
COMPARISON = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
BOOLEAN = {ast.And: "and", ast.Or: "or"}


COMPARISON_HEADS = frozenset(COMPARISON.values())

_interned = weakref.WeakValueDictionary()
_interning = threading.Lock()


class TextTerm:
    """One node of a text expression: a head applied to arguments, or an atom.

    ``args`` are all the children, the values of a call's keyword arguments last, so that walks
    see (and rewrite) them too; ``keywords`` names those last ones. ``value`` is an atom's name or
    literal. Build text terms with ``parse``, ``symbol``, ``constant`` and ``compound``.
    """

    __slots__ = ("head", "args", "keywords", "value", "__weakref__")

    def __init__(self, *_, **__):
        raise TypeError("text terms are built by cortado.rules.text.parse (or symbol/constant/compound)")

    def __setattr__(self, name, value):
        raise AttributeError("text terms are immutable: rewrites build new terms instead")

    def rebuild(self, args):
        """The same head and keyword names over new children (the rewrite interface)."""
        return _intern(self.head, tuple(args), self.keywords, None) if self.args or args else self

    @property
    def positional(self):
        """The arguments written by position (all but the keyword values)."""
        return self.args[: len(self.args) - len(self.keywords)]

    @property
    def keyword_items(self):
        """``(name, value)`` for each keyword argument."""
        return tuple(zip(self.keywords, self.args[len(self.args) - len(self.keywords):]))

    def __str__(self):
        return unparse(self)

    def __repr__(self):
        return f"<text {shown(self)}>"

    __hash__ = object.__hash__


def _intern(head, args, keywords, value):
    key = (head, args, keywords, type(value), repr(value))
    term = _interned.get(key)
    if term is not None:
        return term
    term = object.__new__(TextTerm)
    for name, field in zip(TextTerm.__slots__, (head, args, keywords, value)):
        object.__setattr__(term, name, field)
    with _interning:
        return _interned.setdefault(key, term)


def symbol(name):
    return _intern(SYMBOL, (), (), name)


def constant(value):
    return _intern(CONSTANT, (), (), value)


def compound(head, args, keywords=()):
    """``head(*args, **dict(keywords))``; ``keywords`` are ``(name, term)`` pairs."""
    children = tuple(args) + tuple(value for _, value in keywords)
    if not all(isinstance(a, TextTerm) for a in children):
        raise RewriteError(f"arguments of the text term {head!r} must be text terms")
    return _intern(head, children, tuple(name for name, _ in keywords), None)


def is_number(term):
    """Whether ``term`` is a numeric literal (bools are not numbers here)."""
    return term.head == CONSTANT and isinstance(term.value, (int, float, complex)) and not isinstance(term.value, bool)


# -- reading ---------------------------------------------------------------------------------


def parse(source):
    """The term for one Python expression; anything else is a RewriteError saying what and where."""
    if not isinstance(source, str):
        raise RewriteError(f"expected Python-syntax text, not {type(source).__name__} {source!r}")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as error:
        raise RewriteError(f"cannot read {_shown(source)} as a Python expression: {error.msg}") from None
    except (RecursionError, MemoryError):
        raise RewriteError(f"cannot read {_shown(source)}: it is nested deeper than Python's parser goes "
                           f"(about {3 * sys.getrecursionlimit()} levels)") from None
    return _read(tree.body, source)


def _shown(source, limit=80):
    """``source`` quoted, cut to ``limit`` characters."""
    return repr(source) if len(source) <= limit else f"{source[:limit]!r}... ({len(source)} characters)"


def _unsupported(node, source, what=None):
    what = what or f"{type(node).__name__} expressions are"
    snippet = ast.get_source_segment(source.strip(), node) or ast.unparse(node)
    return RewriteError(f"cannot rewrite {_shown(source)}: {what} not supported (at {_shown(snippet)})")


def _dotted(node):
    """``a.b.c`` as the string "a.b.c", or None if ``node`` is not a chain of names."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _negatable(value):
    """Whether ``-value`` is a number that prints back as written (the int -0 would print as 0)."""
    return type(value) is float or (type(value) is int and value != 0)


def _read(root, source):
    """The term for an ``ast`` expression, read children first with a stack of its own (text nested
    thousands deep reads as well as shallow text)."""
    read = {}  # id of an ast node -> its term (the tree keeps every node alive)
    stack = [(root, False)]
    while stack:
        node, children_read = stack.pop()
        children, build = _reading(node, source)
        if children_read:
            read[id(node)] = build([read.pop(id(child)) for child in children])
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(children))
    return read[id(root)]


def _reading(node, source):
    """``(children, build)``: the ast nodes ``node``'s term is built of, and how, from their terms."""
    if isinstance(node, ast.Name):
        return (), lambda _: symbol(node.id)
    if isinstance(node, ast.Constant):
        return (), lambda _: constant(node.value)
    if isinstance(node, ast.UnaryOp):
        operand = node.operand
        if isinstance(node.op, ast.USub) and isinstance(operand, ast.Constant) and _negatable(operand.value):
            return (), lambda _: constant(-operand.value)  # -1 is a number, as a reader expects
        return (operand,), lambda terms: compound(UNARY[type(node.op)], terms)
    if isinstance(node, ast.BinOp):
        return (node.left, node.right), lambda terms: compound(BINARY[type(node.op)], terms)
    if isinstance(node, ast.BoolOp):
        return node.values, lambda terms: compound(BOOLEAN[type(node.op)], terms)
    if isinstance(node, ast.Compare):
        if len(node.ops) > 1:
            raise _unsupported(node, source, "chained comparisons are")
        return (node.left, node.comparators[0]), lambda terms: compound(COMPARISON[type(node.ops[0])], terms)
    if isinstance(node, ast.Call):
        head = _dotted(node.func)
        if head is None:
            raise _unsupported(node, source, "calls of anything but a (dotted) name are")
        if any(k.arg is None for k in node.keywords):
            raise _unsupported(node, source, "**keyword unpacking is")
        names = [k.arg for k in node.keywords]
        positional = len(node.args)
        return (*node.args, *(k.value for k in node.keywords)), lambda terms: compound(
            head, terms[:positional], list(zip(names, terms[positional:])))
    if isinstance(node, ast.Starred):
        return (node.value,), lambda terms: compound(STARRED, terms)
    if isinstance(node, ast.Attribute):
        return (node.value,), lambda terms: compound("." + node.attr, terms)
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            raise _unsupported(node, source, "slices are")
        return (node.value, node.slice), lambda terms: compound(SUBSCRIPT, terms)
    if isinstance(node, ast.Tuple):
        return node.elts, lambda terms: compound(TUPLE, terms)
    if isinstance(node, ast.List):
        return node.elts, lambda terms: compound(LIST, terms)
    raise _unsupported(node, source)


# -- writing ---------------------------------------------------------------------------------

# ast.unparse's precedence levels (``ast._Precedence``): a child is put in parentheses where its
# parent asks for a higher level than the child's own
TUPLE_LEVEL, TEST, OR, AND, NOT, CMP, EXPR, BXOR, BAND, SHIFT, ARITH, TERM, FACTOR, POWER, ATOM = (
    2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18)
BINARY_LEVEL = {
    "+": ARITH, "-": ARITH, "*": TERM, "/": TERM, "//": TERM, "%": TERM, "@": TERM,
    "<<": SHIFT, ">>": SHIFT, "|": EXPR, "^": BXOR, "&": BAND, "**": POWER,
}
UNARY_LEVEL = {"-": FACTOR, "+": FACTOR, "~": FACTOR, "not": NOT}
BOOLEAN_LEVEL = {"or": OR, "and": AND}
MAX_PRINTED_SUBTERMS = 10_000_000  # printed, a shared subterm counts once per place it appears


def unparse(term):
    """``term`` as text, formatted as ``ast.unparse`` formats it (so ``a*b`` comes back as ``a * b``).

    Written with a stack of its own, so a term nested thousands deep prints as a shallow one does; a
    term whose text would hold more than ``MAX_PRINTED_SUBTERMS`` subterms (shared ones repeat in
    text) is a RewriteError: ``abbreviated`` shows such a term in part.
    """
    size = _printed_size(term)
    if size > MAX_PRINTED_SUBTERMS:
        raise RewriteError(f"this text term would print as {size} subterms (shared subterms repeat in text), "
                           f"more than cortado prints ({MAX_PRINTED_SUBTERMS}); its head is {term.head!r}: "
                           f"{_text(abbreviated(term))}")
    return _text(term)


def _text(term):
    pieces = []
    stack = [(term, TEST)]  # text to write, or (a term, the level its parent asks of it), last first
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            pieces.append(item)
        else:
            stack.extend(reversed(_written(*item)))
    return "".join(pieces)


def _printed_size(term):
    size = {}
    for t in post_order([term]):
        size[t] = 1 + sum(size[a] for a in t.args)
    return size[term]


def _comma_separated(terms):
    pieces = []
    for i, t in enumerate(terms):
        pieces += [", "] * bool(i) + [(t, TEST)]
    return pieces


def _items(terms):
    """A tuple's items: one item takes a trailing comma."""
    return [(terms[0], TEST), ","] if len(terms) == 1 else _comma_separated(terms)


def _parenthesised(pieces, needed):
    return ["(", *pieces, ")"] if needed else pieces


def _prints_negative(value):
    return type(value) in (int, float) and (value < 0 or (value == 0 and str(value).startswith("-")))


def _written(term, level):
    """One level of ``term``'s text: strings and ``(child, the level asked of it)`` pairs, in order."""
    head, args = term.head, term.positional
    if head == SYMBOL:
        return [term.value]
    if head == CONSTANT:
        value = term.value
        if _prints_negative(value):  # as the unary minus of a positive number, so precedence comes out right
            return _parenthesised(["-", ast.unparse(ast.Constant(-value))], level > FACTOR)
        return [ast.unparse(ast.Constant(value))]
    if head in BINARY_LEVEL and len(args) == 2:
        own = BINARY_LEVEL[head]
        right_associative = head == "**"
        left, right = (_next(own), own) if right_associative else (own, _next(own))
        return _parenthesised([(args[0], left), f" {head} ", (args[1], right)], level > own)
    if head in UNARY_LEVEL and len(args) == 1:
        own = UNARY_LEVEL[head]
        return _parenthesised([head + (" " if own != FACTOR else ""), (args[0], own)], level > own)
    if head in COMPARISON_HEADS and len(args) == 2:
        return _parenthesised([(args[0], _next(CMP)), f" {head} ", (args[1], _next(CMP))], level > CMP)
    if head in BOOLEAN_LEVEL and len(args) >= 2:
        own = BOOLEAN_LEVEL[head]
        pieces = []  # as ast.unparse: each operand is asked one level more than the one before it
        for i, operand in enumerate(args):
            pieces += [f" {head} "] * bool(i) + [(operand, min(own + 1 + i, ATOM))]
        return _parenthesised(pieces, level > own)
    if head == STARRED and len(args) == 1:
        return ["*", (args[0], EXPR)]
    if head == TUPLE:
        return _parenthesised(_items(args), not args or level > TUPLE_LEVEL)
    if head == LIST:
        return ["[", *_comma_separated(args), "]"]
    if head == SUBSCRIPT and len(args) == 2:
        index = args[1]
        inside = _items(index.args) if index.head == TUPLE and index.args else [(index, TEST)]
        return [(args[0], ATOM), "[", *inside, "]"]
    if head.startswith(".") and len(args) == 1:
        owner = args[0]
        integer = owner.head == CONSTANT and isinstance(owner.value, int) and not _prints_negative(owner.value)
        return [(owner, ATOM), " " * integer + head]  # 3 .real: 3.real would be a syntax error
    pieces = _comma_separated(args)
    for name, value in term.keyword_items:
        pieces += [", "] * bool(pieces) + [f"{name}=", (value, TEST)]
    return [head, "(", *pieces, ")"]


def _next(level):
    return min(level + 1, ATOM)


def shown(term, largest=200):
    """``term`` as text for a message: whole up to ``largest`` printed subterms, else ``abbreviated``."""
    return _text(term if _printed_size(term) <= largest else abbreviated(term))


def abbreviated(term, depth=6, budget=40):
    """``term`` with what lies below ``depth``, or past the first ``budget`` compound subterms, cut to
    ``...``: a text term of any size or nesting, shown in a line (error messages, traces)."""
    remaining = budget

    def cut(t, depth):
        nonlocal remaining
        if not t.args:
            return t
        if depth == 0 or remaining <= 0:
            return constant(...)
        remaining -= 1
        return t.rebuild([cut(a, depth - 1) for a in t.args])

    return cut(term, depth)


def from_value(value):
    """A Python literal (number, string, None, or a tuple or list of them) as a text term."""
    if isinstance(value, tuple):
        return compound(TUPLE, [from_value(v) for v in value])
    if isinstance(value, list):
        return compound(LIST, [from_value(v) for v in value])
    if isinstance(value, TextTerm):
        return value
    return constant(value)


def literal_value(term):
    """The Python value of a literal term (constants, and tuples and lists of them), else raise ValueError."""
    if term.head == CONSTANT:
        return term.value
    if term.head == TUPLE:
        return tuple(literal_value(a) for a in term.args)
    if term.head == LIST:
        return [literal_value(a) for a in term.args]
    raise ValueError(f"{unparse(term)} is not a literal")
