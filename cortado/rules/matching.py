"""Matching a pattern against a term, and building a replacement from the bindings.

Matching is syntactic, as in Espresso: no commutativity, no backtracking. A placeholder used twice
must bind equal terms; ``exact=True`` also requires distinct placeholders to bind distinct terms.
"""

from ..errors import RewriteError
from ..exprgraph.term import Term
from . import text as textforms
from .patterns import Exact, Literal, Named, Pattern, PatternNode, Placeholder, Splat
from .domains import same_binding


class Bindings(dict):
    """What a pattern's placeholders bound, by name; ``term`` is the whole matched term.

    Replacement functions and guards receive this, so they can read both the parts and the whole
    (for a tensor rule: its shape and dtype); ``domain`` builds terms of the matched kind, and
    ``run`` (None outside a rewriting run) says how often a term is used.
    """

    def __init__(self, values, term, domain, run=None):
        super().__init__(values)
        self.term = term
        self.domain = domain
        self.run = run

    def shared(self, term):
        """Whether ``term`` has other users in the graph being rewritten (False outside a run)."""
        return self.run is not None and self.run.uses(term) > 1


def match(pattern, term, domain, exact=False):
    """The bindings of ``pattern`` matched against ``term``, or None."""
    bindings = {}

    def bind(placeholder, value):
        if isinstance(value, (Term, textforms.TextTerm)) and not domain.satisfies(placeholder, value):
            return False
        if placeholder.name in bindings:
            return same_binding(bindings[placeholder.name], value)
        bindings[placeholder.name] = value
        return True

    def visit(p, t):
        if isinstance(p, Placeholder):
            return bind(p, t)
        if isinstance(p, PatternNode):
            return _node_matches(p, t, domain, bind, visit)
        if isinstance(p, Literal):
            return domain.literal_matches(p.value, t)
        if isinstance(p, Exact):
            return p.term is t
        if isinstance(p, Named):
            return domain.named_matches(p.name, t)
        raise RewriteError(f"{p!r} cannot appear there in a pattern")

    if not visit(pattern, term):
        return None
    if exact and not _distinct(bindings.values()):
        return None
    return bindings


def _node_matches(node, term, domain, bind, visit):
    args = domain.positional(term)
    if node.splat is None:
        if len(args) != len(node.args) or not domain.head_matches(node.head, len(args), term):
            return False
        for p, t in zip(node.args, args):
            if not visit(p, t):
                return False
    else:
        fixed = node.args[:-1]
        if len(args) < len(fixed) or not domain.head_matches(node.head, len(args), term):
            return False
        for p, t in zip(fixed, args):
            if not visit(p, t):
                return False
        if not bind(node.splat, tuple(args[len(fixed):])):
            return False
    return domain.match_params(node.params, term, bind, visit)


def _distinct(values):
    """Whether the bound terms are pairwise distinct (attribute values may repeat)."""
    values = [v for v in values if isinstance(v, (Term, textforms.TextTerm))]
    return all(not same_binding(a, b) for i, a in enumerate(values) for b in values[i + 1:])


def instantiate(pattern, bindings, domain, fold=False):
    """The replacement ``pattern`` with the bound values put in; built by ``domain``.

    ``fold=True`` evaluates at once each node it builds whose arguments are all constants.
    """
    if isinstance(pattern, (Placeholder, Splat)):
        if pattern.name not in bindings:
            raise RewriteError(f"the replacement uses {pattern.name}, which the pattern does not bind")
        return bindings[pattern.name]
    if isinstance(pattern, Literal):
        return domain.literal(pattern.value)
    if isinstance(pattern, Exact):
        return pattern.term
    if isinstance(pattern, Named):
        return domain.named(pattern.name)
    args = []
    for arg in pattern.args:
        value = instantiate(arg, bindings, domain, fold)
        args.extend(value if isinstance(arg, Splat) else [value])
    params = {}
    for name, value in pattern.params.items():
        if isinstance(value, Literal):
            value = value.value
        elif isinstance(value, Pattern):
            value = instantiate(value, bindings, domain, fold)
        params[name] = value
    built = domain.build(pattern.head, args, params)
    folded = domain.fold(built) if fold and hasattr(built, "args") else None
    return built if folded is None else folded
