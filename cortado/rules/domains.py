"""How the engine sees each kind of term: tensor expressions and untyped text.

The engine itself walks terms through ``head``, ``args`` and ``rebuild``, which both kinds offer.
What differs is here, in one domain per kind (``TENSOR``, a ``TensorDomain``; ``TEXT``, a
``TextDomain``): how a pattern's head and attributes match, what counts as a constant, how a
replacement is built, how constants fold, and what a rewrite must preserve. A tensor rewrite must
keep the term's shape and dtype; one that would not is simply not applied there (``x * 1`` with a
broadcasting ``1`` stays as it is).
"""

import inspect
import math
import operator

import numpy as np

from ..errors import DTypeError, RewriteError, ShapeError
from ..exprgraph import constructors
from ..exprgraph.dtypes import is_float, kind_of
from ..exprgraph.ops import CAST, CONST, LAYOUT, OPS, VAR, Constant
from ..exprgraph.printing import inline
from ..exprgraph.semantics import implementation
from ..exprgraph.term import RuleViolation, Term, cortados_function, make
from . import text as textforms
from .patterns import DTYPE_CLASSES, Literal, Pattern, PatternNode, Placeholder, Splat
from .splats import splat_reduction

# Python's operator spelling -> cortado op, by arity (text patterns match tensor terms through it)
OPERATOR_OPS = {
    ("+", 2): "add", ("-", 2): "subtract", ("*", 2): "multiply", ("/", 2): "divide", ("//", 2): "floor_divide",
    ("%", 2): "remainder",
    ("**", 2): "power", ("@", 2): "matmul", ("-", 1): "negative", ("+", 1): "positive",
    ("<", 2): "less", ("<=", 2): "less_equal", (">", 2): "greater", (">=", 2): "greater_equal",
    ("==", 2): "equal", ("!=", 2): "not_equal", (".T", 1): "transpose",
}
OPERATOR_OF_OP = {op: head for (head, _), op in OPERATOR_OPS.items() if head != ".T"}
MODULE_PREFIXES = ("ct.", "cortado.", "np.", "numpy.")
# a constructor's parameter -> the attribute it sets, where the op has that one (take's single axis is "axis")
ATTRIBUTE_OF_PARAMETER = {"axis": "axes"}
FOLD_LIMIT = 1 << 16  # fold a constant expression only if its result has at most this many elements


class NotApplicable(Exception):
    """A replacement cannot be built where the pattern matched: the rule does not apply there."""


def op_name(head, arity):
    """The cortado op a pattern head names: ``+`` with two arguments is ``add``, ``np.exp`` is ``exp``."""
    name = OPERATOR_OPS.get((head, arity))
    if name:
        return name
    for prefix in MODULE_PREFIXES:
        if head.startswith(prefix):
            return head[len(prefix):]
    return head


def tensor_problems(pattern, replacement=False):
    """Why ``pattern`` can match (or, a ``replacement``, build) no tensor term, as strings: a head that is no op
    (terms are matched by their op: ``conv`` matches, ``conv2d`` builds), or a keyword the op does not take (a pattern
    writes a call, ``sum(_x, axis=_a)``, where terms print their attributes, ``axes=(0,)``); empty where none.
    Text has no such limits."""
    problems, stack = [], [pattern]
    while stack:
        node = stack.pop()
        if not isinstance(node, PatternNode):
            continue
        stack.extend(node.args)
        name = op_name(node.head, len(node.args))
        if replacement:
            taken = _replacement_keywords(name)
        else:
            taken = inspect.signature(OPS[name].normalize).parameters if name in OPS else None
        if taken is None:
            problems.append((f"{node.head!r} is no cortado op" if replacement else f"{node.head!r} is the op of no term")
                            + _written_with_others(node.head))
            continue
        arity = OPS[name].arity if name in OPS and not replacement else None
        if arity is not None and len(node.args) != arity and not any(isinstance(a, Splat) for a in node.args):
            keywords = [k for k in taken if k != "args"]
            problems.append(f"{name} takes {arity} operand(s), not {len(node.args)}"
                            + (f": its attributes are keywords ({', '.join(f'{k}=' for k in keywords)})"
                               if len(node.args) > arity and keywords else ""))
            continue
        wrong = [k for k in node.params if k not in taken]
        if wrong and not any(q.kind is q.VAR_KEYWORD for q in taken.values()):
            keywords = [k for k, q in taken.items() if k != "args" and (q.default is not q.empty or not replacement)]
            problems.append(f"{name} takes no {', '.join(f'{k}=' for k in wrong)} (its keywords: "
                            f"{', '.join(f'{k}=' for k in keywords) or 'none'})")
    return problems


def _written_with_others(name):
    """Where ``name`` is a function of cortado's that builds other ops (``ct.min``, ``ct.argmax``), a hint saying so."""
    if name in OPS or not cortados_function(name):
        return ""
    return f" (ct.{name} is a function written with other ops, which a rule writes out: see print(ct.{name}(x)))"


def _replacement_keywords(name):
    """The parameters of the function a replacement's call of ``name`` builds with (``TensorDomain.build``), or None
    where there is none."""
    if name == "positive":
        return {}
    if name not in constructors.__all__ or name in ("var", "const", "as_term"):
        return None
    return inspect.signature(getattr(constructors, name)).parameters


def rule_problems(rule):
    """``tensor_problems`` of a rule's pattern and of its replacement, where that is a pattern."""
    problems = tensor_problems(rule.pattern)
    if isinstance(rule.replacement, Pattern):
        problems += tensor_problems(rule.replacement, replacement=True)
    return problems


def same_binding(a, b):
    """Whether two bound values are equal: terms by identity (they are interned), values by ==."""
    if isinstance(a, (Term, textforms.TextTerm)) or isinstance(b, (Term, textforms.TextTerm)):
        return a is b
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_binding(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class TensorDomain:
    name = "tensor"

    def positional(self, term):
        return term.args

    def head_matches(self, head, arity, term):
        return op_name(head, arity) == term.op.name

    def match_params(self, params, term, bind, match):
        """Whether the call's ``params`` normalise, over the term's own operands, to its attributes.

        A placeholder among them binds the attribute's value (``sum(_x, axis=_a)`` binds ``_a``
        to the axes tuple), which a replacement can pass on.
        """
        given = {}
        for name, value in params.items():
            if isinstance(value, Placeholder):
                attribute = ATTRIBUTE_OF_PARAMETER.get(name, name)
                attribute = attribute if attribute in term.op.attr_names else name
                if attribute not in term.op.attr_names or not bind(value, term.attr(attribute)):
                    return False
                given[name] = term.attr(attribute)
            elif isinstance(value, Literal):
                given[name] = value.value
            elif isinstance(value, Pattern):
                return False  # an attribute is a plain value, not an expression
            else:
                given[name] = value
        try:
            return term.op.normalize(term.args, **given) == term.attrs
        except (RuleViolation, TypeError):
            return False

    def is_constant(self, term):
        return term.op is CONST

    def literal_matches(self, value, term):
        if term.op is not CONST or isinstance(value, str) or value is None:
            return False
        if (term.dtype.kind == "b") != isinstance(value, bool):
            return False  # 1 is no boolean True: True + x is a logical or
        scalar = term.attr("value").scalar
        return scalar is not None and bool(scalar == value)

    def named_matches(self, name, term):
        return term.op is VAR and term.name == name

    def satisfies(self, placeholder, term):
        if placeholder.const and term.op is not CONST:
            return False
        if placeholder.rank is not None and term.ndim != placeholder.rank:
            return False
        dtype = placeholder.dtype
        if dtype is not None:
            return kind_of(term.dtype) in DTYPE_CLASSES[dtype] if isinstance(dtype, str) else term.dtype == dtype
        return True

    def literal(self, value):
        return value  # a Python scalar stays weak in cortado's functions and takes the right dtype

    def named(self, name):
        raise RewriteError(f"a replacement names the variable {name!r}; use a placeholder bound by the pattern")

    def build(self, head, args, params):
        name = op_name(head, len(args))
        if name == "positive" and len(args) == 1:
            return args[0]
        function = getattr(constructors, name, None)
        if name not in constructors.__all__ or name in ("var", "const", "as_term"):
            raise RewriteError(f"a replacement calls {head!r}, which is no cortado op")
        try:
            return function(*args, **params)
        except (ShapeError, DTypeError) as error:
            raise NotApplicable(str(error)) from None
        except TypeError as error:
            raise RewriteError(f"a replacement calls {name} wrongly: {error}") from None

    def finish(self, result, original):
        """The replacement if it can stand for ``original`` (same shape and dtype), else None; a number is filled to
        its shape; anything else is no replacement (a RewriteError)."""
        if not isinstance(result, Term):
            if not isinstance(result, int | float | np.number | np.bool_) and not (
                    isinstance(result, np.ndarray) and result.ndim == 0):
                raise RewriteError(f"a replacement gave {type(result).__name__} {result!r:.60}, where it gives a "
                                   f"term, a number (filled to the term's shape) or None to decline")
            result = self.full_like(original, result)
        if result is None or result.shape != original.shape or result.dtype != original.dtype:
            return None
        return result

    def full_like(self, term, value):
        """A constant of ``term``'s shape and dtype with every element ``value`` (None if inexact)."""
        try:
            with np.errstate(over="ignore"):
                element = np.array(value, dtype=term.dtype)
        except (OverflowError, ValueError, TypeError):
            return None
        exact = element.item() == value or (is_float(element.dtype) and np.isnan(element) and np.isnan(value))
        if not exact:  # compared in Python: a float16 inf is not 70000
            return None
        return make(CONST, (), (Constant(np.broadcast_to(element, term.shape)),))

    def is_finite(self, term):
        value = term.attr("value")
        return not is_float(term.dtype) or bool(np.isfinite(value.scalar if value.scalar is not None else value.array).all())

    def fold(self, term):
        """``term`` evaluated now, as a constant, when all its operands are constants; else None.

        Elementwise ops, layout ops and reductions of one-value constants fold at any size: their
        result is one value too (a reduction's in closed form, ``splats``). Anything else folds up to
        ``FOLD_LIMIT`` elements, except a cast that widens an array: the program keeps the narrow
        array (int8 weights take a quarter of float32's bytes), and a quantized weight stays
        recognisable as one (``cast(q, float32) * scale``).
        """
        if not term.args or any(a.op is not CONST for a in term.args):
            return None
        values = [a.attr("value") for a in term.args]
        splats = all(v.scalar is not None for v in values)
        if splats and term.op.kind == LAYOUT:
            return _splat(values[0].scalar, term.shape)
        closed = splat_reduction(term, values[0].scalar) if splats else None
        if closed is not None:
            return _splat(closed, term.shape)
        pointwise = term.op.elementwise and splats
        if term.op is CAST and not splats and term.dtype.itemsize > term.args[0].dtype.itemsize:
            return None
        if not pointwise and term.size > FOLD_LIMIT:
            return None
        arrays = [v.scalar if pointwise else v.array for v in values]
        try:
            with np.errstate(all="ignore"):
                result = np.asarray(implementation(term.op)(arrays, *term.attrs)).astype(term.dtype)
        except (ArithmeticError, ValueError):
            return None
        return _splat(result, term.shape) if pointwise else make(CONST, (), (Constant(result),))

    def describe(self, term):
        return inline(term, depth=4)


def _splat(value, shape):
    """A constant of ``shape`` whose every element is ``value``; None where its bytes would overflow NumPy's
    sizes, so such a term stays unfolded."""
    try:
        return make(CONST, (), (Constant(np.broadcast_to(value, shape)),))
    except ValueError:  # "array is too big"
        return None


_TEXT_ARITHMETIC = {
    ("+", 2): operator.add, ("-", 2): operator.sub, ("*", 2): operator.mul, ("/", 2): operator.truediv,
    ("//", 2): operator.floordiv, ("%", 2): operator.mod, ("**", 2): operator.pow,
    ("-", 1): operator.neg, ("+", 1): operator.pos,
}
_LARGEST_TEXT_POWER = 64  # folding 10 ** 10 ** 10 would take forever; such powers stay as text
_LARGEST_TEXT_INT_BITS = 4096  # nor fold ints of more than about 1200 digits


class TextDomain:
    name = "text"

    def positional(self, term):
        return term.positional

    def head_matches(self, head, arity, term):
        return term.head == head or OPERATOR_OPS.get((term.head, arity)) == head

    def match_params(self, params, term, bind, match):
        """Whether the call has exactly these keywords, their values matching."""
        keywords = dict(term.keyword_items)
        if set(keywords) != set(params):
            return False
        for name, value in params.items():
            if isinstance(value, Pattern):
                if not match(value, keywords[name]):
                    return False
            elif textforms.from_value(value) is not keywords[name]:
                return False
        return True

    def is_constant(self, term):
        return textforms.is_number(term)

    def literal_matches(self, value, term):
        if term.head != textforms.CONSTANT:
            return False
        if isinstance(value, bool) or isinstance(term.value, bool) or not textforms.is_number(term):
            return type(term.value) is type(value) and term.value == value
        return term.value == value

    def named_matches(self, name, term):
        return term.head == textforms.SYMBOL and term.value == name

    def satisfies(self, placeholder, term):
        if placeholder.dtype is not None or placeholder.rank is not None:
            return False  # text has no dtypes or shapes
        return not placeholder.const or textforms.is_number(term)

    def literal(self, value):
        return textforms.from_value(value)

    def named(self, name):
        return textforms.symbol(name)

    def build(self, head, args, params):
        operator_head = OPERATOR_OF_OP.get(head)
        if operator_head and (operator_head, len(args)) in OPERATOR_OPS and not params:
            head = operator_head  # a pattern written in code: add(a, b) is a + b
        keywords = [(name, textforms.from_value(value)) for name, value in params.items()]
        return textforms.compound(head, args, keywords)

    def finish(self, result, original):
        return result if isinstance(result, textforms.TextTerm) else textforms.from_value(result)

    def fold(self, term):
        function = _TEXT_ARITHMETIC.get((term.head, len(term.args)))
        if function is None or not all(textforms.is_number(a) for a in term.args):
            return None
        values = [a.value for a in term.args]
        if term.head == "**" and (abs(values[1]) > _LARGEST_TEXT_POWER or abs(values[0]) > 2 ** 64):
            return None
        try:
            result = function(*values)
        except (ArithmeticError, ValueError, TypeError):  # 1/0, 1j // 2, ...
            return None
        if isinstance(result, complex) and not any(isinstance(v, complex) for v in values):
            return None  # (-8) ** (1/3) is complex in Python; leave it as written
        if isinstance(result, int) and result.bit_length() > _LARGEST_TEXT_INT_BITS:
            return None  # Python will not even print it
        return textforms.constant(result)

    def is_finite(self, term):
        value = term.value
        if isinstance(value, int):
            return True
        return all(math.isfinite(part) for part in ((value.real, value.imag) if isinstance(value, complex) else (value,)))

    def describe(self, term):
        return textforms.shown(term)


TENSOR = TensorDomain()
TEXT = TextDomain()


def domain_of(term):
    if isinstance(term, Term):
        return TENSOR
    if isinstance(term, textforms.TextTerm):
        return TEXT
    raise RewriteError(f"expected a cortado term or Python-syntax text, not {type(term).__name__} {term!r}")
