"""The Espresso-style functions, on tensor expressions and on Python-syntax text alike.

Text in gives text out: ``rewrite("a + 2*b", "_x + 2*_y", "_x * _y") == "a * b"``, and bindings
of a text match are text too. Tensor terms in give tensor terms out.
"""

import numbers

import numpy as np

from ..errors import RewriteError
from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float
from ..exprgraph.graph import two_variables_named
from ..exprgraph.ops import VAR
from ..exprgraph.term import Term
from . import text as textforms
from .algebra import algebra, fast_math, gradient_markers
from .engine import Fixpoint, Postwalk, Rule, RuleSet, substitute, subterms
from .matching import match
from .patterns import as_pattern, matchable
from .domains import TENSOR, domain_of


def _read(ex):
    """``(term, was_text)``: text is parsed, terms pass through."""
    if isinstance(ex, str):
        return textforms.parse(ex), True
    domain_of(ex)  # refuses anything that is neither
    return ex, False


def _write(value, as_text):
    if not as_text:
        return value
    if isinstance(value, textforms.TextTerm):
        return textforms.unparse(value)
    if isinstance(value, tuple):
        return tuple(_write(v, True) for v in value)
    return value


def matchex(pattern, ex, exact=False):
    """The bindings (``{"_x": ..., ...}``) of ``pattern`` matched at the root of ``ex``, or None.

    ``exact=True`` also requires distinct placeholders to bind distinct terms.
    """
    term, as_text = _read(ex)
    bound = match(matchable(pattern), term, domain_of(term), exact)
    return None if bound is None else {name: _write(v, as_text) for name, v in bound.items()}


def matchingex(pattern, ex, exact=False):
    """Whether ``pattern`` matches at the root of ``ex``."""
    return matchex(pattern, ex, exact) is not None


def tryrewrite(ex, pattern, replacement, guard=None):
    """``ex`` rewritten at its root by ``pattern -> replacement``, or None if it does not match."""
    term, as_text = _read(ex)
    result = Rule("rewrite", pattern, replacement, guard).rewrite(term)
    return None if result is None else _write(result, as_text)


def rewrite(ex, pattern, replacement, guard=None):
    """As ``tryrewrite``, but a pattern that does not match is a RewriteError."""
    result = tryrewrite(ex, pattern, replacement, guard)
    if result is None:
        term, _ = _read(ex)
        shown = domain_of(term).describe(term)
        if matchex(pattern, ex) is None:
            raise RewriteError(f"the pattern {as_pattern(pattern)!r} does not match {shown}")
        raise RewriteError(f"the pattern {as_pattern(pattern)!r} matches {shown}, but the guard refuses it or "
                           f"the replacement cannot stand for it (a tensor rewrite must keep shape and dtype)")
    return result


def _rule_set(rules):
    if isinstance(rules, (Rule, RuleSet)):
        return rules
    return RuleSet(list(rules))


def rewrite_all(ex, rules, trace=None):
    """One bottom-up pass over ``ex``: at every subterm, the first of ``rules`` that applies.

    ``rules`` is a RuleSet, a Rule, or a list of Rules and ``(pattern, replacement)`` pairs.
    """
    term, as_text = _read(ex)
    return _write(Postwalk(_rule_set(rules)).run(term, trace), as_text)


simplifier = Fixpoint(Postwalk(Fixpoint(algebra)))
gradient_simplifier = Fixpoint(Postwalk(Fixpoint(RuleSet([r for r in algebra if r not in gradient_markers.rules]))))
fast_simplifier = Fixpoint(Postwalk(Fixpoint(algebra + fast_math)))


def simplify(ex, trace=None, keep=()):
    """``ex`` with the ``algebra`` rules applied everywhere until none applies.

    ``ex`` is text, a term or a list of terms (rewritten together, sharing their subterms). The
    subterms in ``keep`` are left as they are: ``ct.grad`` keeps the model's terms, so that its
    gradients share them with the model as the user wrote it.
    """
    if isinstance(ex, str):
        return textforms.unparse(simplifier.run(textforms.parse(ex), trace, keep))
    return simplifier.run(ex, trace, keep)


def findex(pattern, ex):
    """Every distinct subterm of ``ex`` that ``pattern`` matches, innermost first."""
    term, as_text = _read(ex)
    pattern = matchable(pattern)
    domain = domain_of(term)
    return [_write(t, as_text) for t in subterms(term) if match(pattern, t, domain) is not None]


def subs(ex, mapping=None, /, **names):
    """``ex`` with subterms replaced: ``subs("x + y", x="a * b")`` is ``"a * b + y"``.

    Keys are terms, or names (a symbol in text, a variable's name in a tensor expression; in text
    any key is read as an expression). Values are terms, text (in text), or numbers. A number
    replacing a tensor variable becomes a constant of the variable's shape and dtype.
    """
    term, as_text = _read(ex)
    pairs = list((mapping or {}).items()) + list(names.items())
    variables = None
    substitution = {}
    for key, value in pairs:
        if isinstance(term, Term):
            if isinstance(key, str):
                variables = variables or _variables_by_name(term)
                if key not in variables:
                    raise RewriteError(f"subs: the expression has no variable named {key!r} "
                                       f"(it has {', '.join(sorted(variables)) or 'none'})")
                key = variables[key]
            substitution[key] = _tensor_value(key, value)
        else:
            key = textforms.parse(key) if isinstance(key, str) else key
            substitution[key] = textforms.parse(value) if isinstance(value, str) else textforms.from_value(value)
    return _write(substitute(term, substitution), as_text)


def _variables_by_name(term):
    """``{name: variable}`` of ``term``'s variables; a RewriteError where two variables share a name, since a name
    would then say which to replace no more than feeds can (each ``ct.var`` call declares its own variable)."""
    found = {}
    for t in subterms(term):
        if t.op is VAR and found.setdefault(t.name, t) is not t:
            raise RewriteError(f"subs: {two_variables_named(found[t.name], t)}; or pass the variable itself as the key")
    return found


def _tensor_value(key, value):
    """``value`` as a term that can stand for ``key``: same shape and dtype, values exact."""
    if isinstance(value, Term):
        term = value
    elif isinstance(value, numbers.Number):
        term = TENSOR.full_like(key, value)
        if term is None:
            raise RewriteError(f"subs: {value!r} is not exactly a {key.dtype.name} value (for {key!r})")
    else:
        array = np.asarray(value)
        try:
            converted = array.astype(key.dtype)
        except (TypeError, ValueError) as error:
            raise RewriteError(f"subs: the value for {key!r} is not {key.dtype.name}: {error}") from None
        if not np.array_equal(converted, array, equal_nan=is_float(converted.dtype)):
            raise RewriteError(f"subs: the values for {key!r} are not exactly {key.dtype.name} values")
        term = ct.const(converted)
    if (term.shape, term.dtype) != (key.shape, key.dtype):
        raise RewriteError(f"subs: {term!r} cannot replace {key!r}: a substitute must have the same shape and dtype")
    return term

