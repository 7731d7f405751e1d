"""Rewriting, Espresso-style: patterns, the engine and its strategies, and rule sets as data.

    import cortado as ct
    ct.rules.rewrite("a + 2*b", "_x + 2*_y", "_x * _y")          # "a * b"
    ct.rules.simplify(3 * (2 * x) + 0)                            # 6 * x, as a term
    ct.rules.rewrite_all(loss, ct.rules.stability)                # log(1 + x) -> log1p(x), ...

The same engine rewrites tensor expressions and Python-syntax text (text in, text out). Rule sets
(``algebra``, ``stability``) are ordered values composed with ``+``.
"""

from .algebra import algebra, fast_math
from .api import findex, matchex, matchingex, rewrite, rewrite_all, simplifier, simplify, subs, tryrewrite
from .checking import check
from .derivatives import Derivative, Derivatives, derivatives
from .engine import Chain, Fixpoint, Postwalk, Prewalk, Rewrite, Rewriter, Rule, RuleSet, Run, Trace, explain
from .guards import constants, floating, not_constant, same_type
from .matching import Bindings
from .patterns import Pattern, Placeholder, Splat, placeholders
from .stability import stability
from .text import TextTerm, parse, unparse

__all__ = [
    "matchex", "matchingex", "rewrite", "tryrewrite", "rewrite_all", "subs", "findex", "simplify", "simplifier",
    "Rule", "RuleSet", "Rewriter", "Chain", "Fixpoint", "Postwalk", "Prewalk", "Run", "Trace", "Rewrite", "explain",
    "placeholders", "Pattern", "Placeholder", "Splat", "Bindings", "constants", "not_constant", "same_type", "floating",
    "TextTerm", "parse", "unparse", "algebra", "fast_math", "stability",
    "derivatives", "Derivative", "Derivatives", "check",
]
