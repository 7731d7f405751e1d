"""The rewrite engine: rules, ordered rule sets, strategies, and the trace of what fired.

Every rewriter here is called as ``rewriter(term, run)`` and returns the new term, or None when
it changes nothing; ``run`` (a ``Run``) carries the trace and the per-strategy memo of one
rewriting. Strategies follow SymbolicUtils.jl: ``Prewalk`` and ``Postwalk`` apply a rewriter at
every subterm once, top-down or bottom-up; ``Chain`` applies rewriters in turn; ``Fixpoint``
repeats one until nothing changes. Walks are iterative and memoised per term (terms are interned,
so a shared subterm is rewritten once), and every strategy has a cap: a rule set that rewrites in
a cycle, or grows a term without end, stops with a RewriteError that names the rules involved.
"""

from collections import Counter
from dataclasses import dataclass

from ..errors import DTypeError, RewriteError, ShapeError
from ..exprgraph.graph import folded, post_order
from ..exprgraph.term import Term
from .matching import Bindings, instantiate, match
from .patterns import Pattern, PatternNode, as_pattern, matchable, placeholder_names
from .text import TextTerm
from .domains import NotApplicable, op_name, domain_of


@dataclass(frozen=True)
class Rewrite:
    """One step of a trace: ``rule`` rewrote ``before`` into ``after``."""

    rule: str
    before: object
    after: object

    def __str__(self):
        domain = domain_of(self.before)
        return f"{self.rule}: {domain.describe(self.before)}  ->  {domain.describe(self.after)}"


class Trace(list):
    """Every rewrite of a run, in order. ``explain`` prints it; ``counts`` tallies rules; ``label``, where set, names
    the stage in a program's ``explain()`` (``simplify (fast_math)``). ``refused``: the first ``REFUSALS_KEPT``
    matches whose replacement could not stand for the term (another shape or dtype, or operands its ops refuse),
    as ``(rule, term, why)``: what a rule author looks for when a rule that should fire does not."""

    label = None

    def __init__(self, *steps):
        super().__init__(*steps)
        self.refused = []

    def counts(self):
        return Counter(step.rule for step in self)

    def explain(self, limit=40):
        return explain(self, limit)


def explain(trace, limit=40):
    """The trace as text: the rules that fired with their counts, then each rewrite in order, then the matches
    refused (the first of each rule, with why)."""
    counts = Counter(step.rule for step in trace)
    lines = [f"{len(trace)} rewrites by {len(counts)} rules: "
             + ", ".join(f"{name} x{n}" for name, n in counts.most_common())] if trace else ["no rule fired"]
    lines += [f"{i:4}. {step}" for i, step in enumerate(trace[:limit], start=1)]
    if len(trace) > limit:
        lines.append(f"      ... and {len(trace) - limit} more")
    refused = getattr(trace, "refused", ())
    if refused:
        lines.append(f"{len(refused)} match(es) refused:")
        lines += [f"      {line}" for line in refusals(trace)]
    return "\n".join(lines)


def refusals(trace, kept_only=False):
    """A line for the first refused match of each rule in ``trace``: the rule, where, and why; with ``kept_only``,
    at terms no other rule of the trace rewrote."""
    rewritten = {step.before for step in trace} if kept_only else set()
    first = {}
    for rule, term, why in getattr(trace, "refused", ()):
        if term not in rewritten:
            first.setdefault(rule, (term, why))
    return [f"{rule} at {domain_of(term).describe(term)}: {why}" for rule, (term, why) in first.items()]


REFUSALS_KEPT = 1000  # the matches refused a trace keeps (the first of each rule is what explain shows)
REWRITES_PER_TERM = 50  # a run may make this many rewrites per term it was given (plus 10k) before it is stopped


class Run:
    """The state of one rewriting of ``roots``: its trace, each walk's memo, and its budget.

    The budget of rewrites is what stops a rule set that grows terms without end (a Fixpoint caps
    rounds, but one round of a Postwalk can double a term). ``uses`` tells a rule whether a term
    is shared in the graph being rewritten, so it can decline a rewrite that would keep the shared
    term alive and add more.
    """

    def __init__(self, trace=None, roots=(), max_rewrites=None, keep=()):
        self.trace = Trace() if trace is None else trace
        self.roots = tuple(roots)
        self.max_rewrites = max_rewrites
        self.keep = tuple(keep)
        self.rewrites = 0
        self.rebuilt_from = {}  # a term rebuilt over rewritten arguments -> the term it stands for
        self._memos = {}
        self._uses = None

    def memo(self, strategy):
        """The memo of ``strategy`` for this run: results stay valid because terms are immutable.

        The terms to ``keep`` start in it as their own results, so no walk rewrites them.
        """
        memo = self._memos.get(id(strategy))
        if memo is None:
            memo = self._memos[id(strategy)] = {t: t for t in self.keep}
        return memo

    def record(self, rule, before, after):
        if self.max_rewrites is None:
            self.max_rewrites = REWRITES_PER_TERM * len(post_order(self.roots)) + 10_000
        self.rewrites += 1
        self.trace.append(Rewrite(rule, before, after))
        if self.rewrites > self.max_rewrites:
            raise _cycle_error(self.trace[-6:], f"made more than {self.max_rewrites} rewrites of "
                                                f"{len(self.roots)} term(s); do they grow terms without end?")

    def refuse(self, rule, term, why):
        if len(self.trace.refused) < REFUSALS_KEPT:
            self.trace.refused.append((rule, term, why))

    def rebuilt(self, original, rebuilt):
        self.rebuilt_from[rebuilt] = self.rebuilt_from.get(original, original)

    def uses(self, term):
        """How many times ``term`` is read in the graph being rewritten (outputs count once more)."""
        if self._uses is None:
            self._uses = Counter(a for t in post_order(self.roots) for a in t.args)
            self._uses.update(self.roots)
        return self._uses.get(self.rebuilt_from.get(term, term), 1)


class Rewriter:
    """Base of rules, rule sets and strategies: ``run`` applies one to terms from the outside."""

    def __call__(self, term, run):
        raise NotImplementedError

    def run(self, terms, trace=None, keep=()):
        """The rewritten term (or list of terms, sharing one memo); ``trace`` collects the rewrites.

        The walks leave the terms in ``keep`` as they are (terms above them may still change).
        """
        if isinstance(terms, (Term, TextTerm)):
            return _result(self(terms, Run(trace, [terms], keep=keep)), terms)
        try:
            terms = list(terms)
        except TypeError:
            raise RewriteError(f"expected a term or a list of terms, not {type(terms).__name__} {terms!r}") from None
        for t in terms:
            domain_of(t)  # a clear error for anything that is not a term
        run = Run(trace, terms, keep=keep)
        return [_result(self(t, run), t) for t in terms]


def _result(new, old):
    return old if new is None else new


def _cycle_error(steps, what):
    names = list(dict.fromkeys(step.rule for step in steps)) or ["(none recorded: a rewriter of your own?)"]
    shown = " | ".join(str(step) for step in steps[:6])
    more = f" | ... ({len(steps) - 6} more)" if len(steps) > 6 else ""
    return RewriteError(f"rules {', '.join(names)} {what}: {shown}{more}")


# -- rules -----------------------------------------------------------------------------------


class Rule(Rewriter):
    """``pattern`` rewrites to ``replacement`` where ``guard(bindings)`` (if given) holds.

    ``pattern`` is text (``"log(1 + _x)"``) or a pattern built in code; ``replacement`` is a
    pattern too, or a function of the ``Bindings`` that returns the new term (or None to decline).
    A rule applies at the root of the term it is given; strategies apply it elsewhere.
    """

    def __init__(self, name, pattern, replacement, guard=None, declined=None):
        self.name = name
        self.declined = declined  # where given, why the guard declined, noted in the run's trace (explain: kept)
        self.pattern = matchable(pattern)
        function = callable(replacement) and not isinstance(replacement, Pattern)
        self.replacement = replacement if function else as_pattern(replacement)
        if guard is not None and not callable(guard):  # ("log(1 + _a)", "log1p(_a)", "my-name") took a name for it
            raise RewriteError(f"rule {name!r}: its guard is a function of the bindings, not {guard!r}; a rule is "
                               f"named with Rule(name, pattern, replacement)")
        self.guard = guard
        if not function:
            unbound = set(placeholder_names(self.replacement)) - set(placeholder_names(self.pattern))
            if unbound:
                raise RewriteError(f"rule {name!r}: the replacement uses {', '.join(sorted(unbound))}, "
                                   f"which the pattern {self.pattern!r} does not bind")

    @property
    def key(self):
        """The op name a term must have for this rule to match it (None: any term)."""
        p = self.pattern
        return op_name(p.head, len(p.args)) if isinstance(p, PatternNode) else None

    def rewrite(self, term, run=None):
        """The replacement where the rule applies at the root of ``term`` (maybe ``term`` itself), else None.

        A replacement that cannot be built there (its ops refuse the shapes or dtypes) or that
        would change the term's shape or dtype means the rule does not apply there.
        """
        domain = domain_of(term)
        bound = match(self.pattern, term, domain)
        if bound is None:
            return None
        bindings = Bindings(bound, term, domain, run)
        if self.guard is not None and not self.guard(bindings):
            if self.declined and run is not None:
                run.refuse(self.name, term, self.declined)
            return None
        try:
            if isinstance(self.replacement, Pattern):
                result = instantiate(self.replacement, bindings, domain)
            else:
                result = self.replacement(bindings)
                if result is None:
                    return None
            try:
                finished = domain.finish(result, term)
            except RewriteError as error:
                raise RewriteError(f"rule {self.name!r}: {error}") from None
        except (NotApplicable, ShapeError, DTypeError) as error:
            # a replacement pattern whose ops refuse the operands is refused; a function declining is no refusal
            if run is not None and isinstance(self.replacement, Pattern):
                run.refuse(self.name, term, f"its replacement's ops refuse it: {str(error).splitlines()[0]}")
            return None
        if finished is None and run is not None:
            made = f"{result.dtype}{list(result.shape)}" if isinstance(result, Term) else repr(result)
            run.refuse(self.name, term, f"its replacement would be {made}, not the term's "
                                        f"{getattr(term, 'dtype', '')}{list(getattr(term, 'shape', ()))}")
        return finished

    def __call__(self, term, run):
        result = self.rewrite(term, run)
        if result is None or result is term:
            return None
        run.record(self.name, term, result)
        run.rebuilt(term, result)  # the result takes the term's place: its uses are the term's
        return result

    def __repr__(self):
        return f"Rule({self.name!r}: {self.pattern!r} -> {getattr(self.replacement, '__name__', self.replacement)!r})"


def as_rule(item):
    """A Rule from a Rule or a ``(pattern, replacement)`` pair (named after its pattern)."""
    if isinstance(item, Rule):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        pattern, replacement, *guard = item
        return Rule(str(pattern), pattern, replacement, *guard)
    raise RewriteError(f"expected a Rule or a (pattern, replacement) pair, not {item!r}")


class RuleSet(Rewriter):
    """Rules in order: at a term, the first rule that applies rewrites it. ``+`` concatenates."""

    def __init__(self, rules, name=None):
        flat = []
        for item in rules:
            flat.extend(item.rules if isinstance(item, RuleSet) else [as_rule(item)])
        self.rules = tuple(flat)
        self.name = name
        self._keys = {rule.key for rule in self.rules}
        self._by_key = {}

    def __add__(self, other):
        other = RuleSet([other] if isinstance(other, Rule) else other)
        return RuleSet(self.rules + other.rules)

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)

    def __getitem__(self, name):
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(f"no rule named {name!r} in {self!r}")

    def candidates(self, term):
        """The rules that could match ``term`` (by its op), in order; found once per op a rule names.

        Every other op (text has as many as it has function names) shares the rules that match
        any op, so what is remembered stays as small as the rule set.
        """
        key = op_name(term.head, len(term.args))
        if key not in self._keys:
            key = None
        found = self._by_key.get(key)
        if found is None:
            found = self._by_key[key] = tuple(r for r in self.rules if r.key in (None, key))
        return found

    def __call__(self, term, run):
        for rule in self.candidates(term):
            result = rule(term, run)
            if result is not None:
                return result
        return None

    def __repr__(self):
        return f"RuleSet({self.name or ''}: {', '.join(r.name for r in self.rules)})"


# -- strategies ------------------------------------------------------------------------------


class Chain(Rewriter):
    """Each rewriter in turn, each on the result of the one before."""

    def __init__(self, *rewriters):
        self.rewriters = rewriters

    def __call__(self, term, run):
        current = term
        for rewriter in self.rewriters:
            current = _result(rewriter(current, run), current)
        return None if current is term else current


class Fixpoint(Rewriter):
    """``rewriter`` again and again until nothing changes; a cycle or the cap is a RewriteError."""

    def __init__(self, rewriter, max_iterations=100):
        if not isinstance(max_iterations, int) or max_iterations < 1:
            raise RewriteError(f"Fixpoint: max_iterations must be a positive int, not {max_iterations!r}")
        self.rewriter = rewriter
        self.max_iterations = max_iterations

    def __call__(self, term, run):
        seen = {term: len(run.trace)}
        current = term
        for _ in range(self.max_iterations):
            start = len(run.trace)
            new = self.rewriter(current, run)
            if new is None:
                return None if current is term else current
            if new in seen:
                raise _cycle_error(run.trace[seen[new]:], "rewrite in a cycle, so no rewriting with them ends")
            seen[new] = len(run.trace)
            current = new
        if len(run.trace) > start:
            raise _cycle_error(run.trace[start:], f"were still rewriting after {self.max_iterations} rounds "
                                                  f"(the last round is shown); does one undo or grow another?")
        # the last rounds only replayed a walk's memoised rewrites inside a term that grows: the rewrites that began it
        raise _cycle_error(run.trace[seen[term]:], f"were still rewriting after {self.max_iterations} rounds, each "
                                                   f"round the term grown by their rewrites (shown) inside it again; "
                                                   f"does one grow the term it matched?")


class Postwalk(Rewriter):
    """``rewriter`` at every subterm once, children first (bottom-up), memoised per term."""

    def __init__(self, rewriter):
        self.rewriter = rewriter

    def __call__(self, term, run):
        memo = run.memo(self)

        def finish(original, rebuilt):
            if rebuilt is not original:
                run.rebuilt(original, rebuilt)  # before any rule sees it: its uses are the original's
            new = self.rewriter(rebuilt, run)
            if new is not None:
                return new
            if rebuilt is not original and all(memo.get(a) is a for a in rebuilt.args):
                memo[rebuilt] = rebuilt  # final too: a later round need not look inside it again
            return rebuilt

        result = bottom_up(term, memo, finish)
        return None if result is term else result


class Prewalk(Rewriter):
    """``rewriter`` at every subterm once, parents first (top-down), memoised per term.

    The children visited are those of the rewritten parent. A rewrite that puts a term inside
    its own result, or ``max_depth`` rewrites nested one inside another, is a RewriteError.
    """

    def __init__(self, rewriter, max_depth=1000):
        self.rewriter = rewriter
        self.max_depth = max_depth

    def __call__(self, term, run):
        memo = run.memo(self)
        active = set()
        stack = [(term, None, 0)]  # (term, its rewrite once visited, rewrites above it)
        while stack:
            t, new, depth = stack[-1]
            if new is None:
                if t in memo:
                    stack.pop()
                    continue
                start = len(run.trace)
                new = _result(self.rewriter(t, run), t)
                depth += new is not t
                if depth > self.max_depth:
                    raise _cycle_error(run.trace[-10:], f"nested {self.max_depth} rewrites deep (the last ten are shown)")
                stack[-1] = (t, new, depth)
                active.add(t)
                for a in new.args:
                    if a in active:
                        raise _cycle_error(run.trace[start:], "rewrite a term into one that contains it")
                    if a not in memo:
                        stack.append((a, None, depth))
                continue
            stack.pop()
            active.discard(t)
            args = tuple(memo[a] for a in new.args)
            memo[t] = new if all(a is b for a, b in zip(args, new.args)) else new.rebuild(args)
            if memo[t] is not new:
                run.rebuilt(new, memo[t])
        result = memo[term]
        return None if result is term else result


def substitute(term, mapping):
    """``term`` with every occurrence of each key of ``mapping`` replaced by its value, bottom-up.

    Values are not searched again, so ``x -> x + 1`` is one substitution, not a loop.
    """
    return bottom_up(term, dict(mapping), lambda original, rebuilt: rebuilt)


def bottom_up(root, memo, finish):
    """Walk ``root`` children first, iteratively, skipping terms already in ``memo``.

    Each term's arguments are replaced by their results; ``finish(term, rebuilt)`` gives the
    term's own result, which goes into ``memo``.
    """
    def result(t):
        args = tuple(memo[a] for a in t.args)
        return finish(t, t if all(a is b for a, b in zip(args, t.args)) else t.rebuild(args))

    return folded(root, memo, result)


def subterms(term):
    """Every subterm of ``term`` once, each after its arguments (text and tensor terms alike)."""
    return post_order([term])
