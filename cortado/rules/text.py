"""Python-syntax text as terms, so the rewrite engine can work on untyped symbolic expressions.

Text is read with ``ast`` (never ``eval``) into ``TextTerm``s, which offer the same small interface
as tensor terms (``head``, ``args``, ``rebuild``), and written back with ``ast.unparse``, so what
comes out is formatted exactly as ``ast.unparse`` formats it. Function calls need not name
anything real: ``foo(bar(x))`` is a term with head ``foo``.

Heads are Python's own spelling: operators are ``+ - * / // % ** @`` (``-`` with one argument is
negation), comparisons ``< <= > >= == !=``, and ``and or not``; a call's head is the function's
(possibly dotted) name. Names are ``symbol`` atoms and literals ``constant`` atoms. Like tensor
terms, text terms are interned: equal text gives the same object.
"""

import ast
import threading
import weakref

from ..errors import RewriteError

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


def _reverse(table):
    return {head: node for node, head in table.items()}


_AST_BINARY, _AST_UNARY, _AST_COMPARISON, _AST_BOOLEAN = map(_reverse, (BINARY, UNARY, COMPARISON, BOOLEAN))

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
        return f"<text {unparse(self)}>"

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
        raise RewriteError(f"cannot read {source!r} as a Python expression: {error.msg}") from None
    return _read(tree.body, source)


def _unsupported(node, source, what=None):
    what = what or f"{type(node).__name__} expressions are"
    snippet = ast.get_source_segment(source.strip(), node) or ast.unparse(node)
    return RewriteError(f"cannot rewrite {source!r}: {what} not supported (at {snippet!r})")


def _dotted(node):
    """``a.b.c`` as the string "a.b.c", or None if ``node`` is not a chain of names."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _negatable(value):
    """Whether ``-value`` is a number that prints back as written (the int -0 would print as 0)."""
    return type(value) is float or (type(value) is int and value != 0)


def _read(node, source):
    read = lambda child: _read(child, source)  # noqa: E731
    if isinstance(node, ast.Name):
        return symbol(node.id)
    if isinstance(node, ast.Constant):
        return constant(node.value)
    if isinstance(node, ast.UnaryOp):
        operand = node.operand
        if isinstance(node.op, ast.USub) and isinstance(operand, ast.Constant) and _negatable(operand.value):
            return constant(-operand.value)  # -1 is a number, as a reader expects
        return compound(UNARY[type(node.op)], (read(operand),))
    if isinstance(node, ast.BinOp):
        return compound(BINARY[type(node.op)], (read(node.left), read(node.right)))
    if isinstance(node, ast.BoolOp):
        return compound(BOOLEAN[type(node.op)], [read(v) for v in node.values])
    if isinstance(node, ast.Compare):
        if len(node.ops) > 1:
            raise _unsupported(node, source, "chained comparisons are")
        return compound(COMPARISON[type(node.ops[0])], (read(node.left), read(node.comparators[0])))
    if isinstance(node, ast.Call):
        head = _dotted(node.func)
        if head is None:
            raise _unsupported(node, source, "calls of anything but a (dotted) name are")
        if any(k.arg is None for k in node.keywords):
            raise _unsupported(node, source, "**keyword unpacking is")
        return compound(head, [read(a) for a in node.args], [(k.arg, read(k.value)) for k in node.keywords])
    if isinstance(node, ast.Starred):
        return compound(STARRED, (read(node.value),))
    if isinstance(node, ast.Attribute):
        return compound("." + node.attr, (read(node.value),))
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            raise _unsupported(node, source, "slices are")
        return compound(SUBSCRIPT, (read(node.value), read(node.slice)))
    if isinstance(node, ast.Tuple):
        return compound(TUPLE, [read(e) for e in node.elts])
    if isinstance(node, ast.List):
        return compound(LIST, [read(e) for e in node.elts])
    raise _unsupported(node, source)


# -- writing ---------------------------------------------------------------------------------


def unparse(term):
    """``term`` as text, formatted by ``ast.unparse`` (so ``a*b`` comes back as ``a * b``)."""
    return ast.unparse(ast.fix_missing_locations(_tree(term)))


def _name_node(dotted):
    parts = dotted.split(".")
    node = ast.Name(parts[0], ast.Load())
    for part in parts[1:]:
        node = ast.Attribute(node, part, ast.Load())
    return node


def _tree(term):
    head, args = term.head, term.positional
    if head == SYMBOL:
        return _name_node(term.value)
    if head == CONSTANT:
        value = term.value
        if type(value) in (int, float) and (value < 0 or (value == 0 and str(value).startswith("-"))):
            return ast.UnaryOp(ast.USub(), ast.Constant(-value))  # so precedence comes out right
        return ast.Constant(value)
    trees = [_tree(a) for a in term.positional]
    if head in _AST_BINARY and len(args) == 2:
        return ast.BinOp(trees[0], _AST_BINARY[head](), trees[1])
    if head in _AST_UNARY and len(args) == 1:
        return ast.UnaryOp(_AST_UNARY[head](), trees[0])
    if head in _AST_COMPARISON and len(args) == 2:
        return ast.Compare(trees[0], [_AST_COMPARISON[head]()], [trees[1]])
    if head in _AST_BOOLEAN and len(args) >= 2:
        return ast.BoolOp(_AST_BOOLEAN[head](), trees)
    if head == STARRED and len(args) == 1:
        return ast.Starred(trees[0], ast.Load())
    if head == TUPLE:
        return ast.Tuple(trees, ast.Load())
    if head == LIST:
        return ast.List(trees, ast.Load())
    if head == SUBSCRIPT and len(args) == 2:
        return ast.Subscript(trees[0], trees[1], ast.Load())
    if head.startswith(".") and len(args) == 1:
        return ast.Attribute(trees[0], head[1:], ast.Load())
    keywords = [ast.keyword(name, _tree(value)) for name, value in term.keyword_items]
    return ast.Call(_name_node(head), trees, keywords)


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
