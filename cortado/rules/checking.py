"""``check``: whether rewrite rules keep values, tried on every combination of the values where arithmetic is
hardest to get right, as ``gradcheck`` tries a derivative.

A rule's pattern is built with each placeholder a variable (or, where the rule applies only to constants, a
constant), in each dtype asked for; where the rule rewrites it, the written and the rewritten term are evaluated
by the reference interpreter on vectors that hold every combination of the dtype's hard values (zeros of both
signs, ones, halves, infinities, NaN, the dtype's own extremes; for integers their smallest and largest) for up to
three variables, and on random values over the dtype's range; where a form combines elements (a sum, a product of
matrices), each case is a vector of its own (``_cases``). A rewrite may round differently (within ``ulps``
units in the last place of the larger result), never change a value: a NaN where there was none, an infinity or
its sign, the sign of a zero.

    report = ct.rules.check(Rule("sqrt-square", "sqrt(_a * _a)", "_a"))
    print(report)   # sqrt-square changes float32 values: _a = -inf gives inf written (...), -inf rewritten

A pattern with attributes (``axis=_a``) or a splat (``*_xs``) is skipped, and says so: its placeholders would
need values of their own kind.
"""

import itertools
from dataclasses import dataclass, field

import numpy as np

from ..backends.reference import evaluate
from ..errors import CortadoError, DTypeError, RewriteError, ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.graph import Graph
from ..exprgraph.dtypes import as_dtype, finfo, is_float
from ..exprgraph.ops import BROADCAST_TO, ELEMENTWISE, LEAF
from .domains import TENSOR, NotApplicable, rule_problems
from .engine import Rule, RuleSet, as_rule
from .matching import Bindings, instantiate
from .patterns import Named, PatternNode, Splat, placeholder_names

PLAIN_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, np.inf, -np.inf, np.nan)
COMBINED = 3  # the most variables whose hard values are tried in every combination
RANDOM = 64  # random values tried beside them, per variable
CASE = 4  # the values of one case, for a rule over terms that combine elements (a sum): a vector each
SHAPES = ((5,), (3, 3), (2, 3))  # the placeholders' shapes of the random check beside the hard values' vectors


@dataclass
class Counterexample:
    """A value a rule changes: the rule, the dtype, the written term, each placeholder's value there, and the two
    results."""

    rule: str
    dtype: str
    written: object
    inputs: dict
    expected: object
    got: object

    def __str__(self):
        given = ", ".join(f"{name} = {_shown(value)}" for name, value in self.inputs.items())
        return (f"{self.rule} changes {self.dtype} values: {given} gives {_shown(self.expected)} written "
                f"({self.written!r}), {_shown(self.got)} rewritten")


def _shown(value):
    return str(np.asarray(value)[()])  # as the dtype prints it: 1e+30, not float64's 1.0000000150474662e+30


@dataclass
class Report:
    """What ``check`` found: a counterexample for each rule that changes a value, the rules it checked, and those it
    could not (with why)."""

    failures: list = field(default_factory=list)
    checked: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)

    def __bool__(self):
        """True where every rule was checked and none changes a value: a rule skipped is no rule shown right."""
        return not self.failures and not self.skipped

    def __str__(self):
        lines = [str(f) for f in self.failures]
        lines.append(f"{len(self.checked)} rule(s) checked, {len(self.failures)} changing values"
                     + (f"; skipped: {'; '.join(f'{k} ({v})' for k, v in self.skipped.items())}" if self.skipped else ""))
        return "\n".join(lines)


def check(rules, dtypes=("float32", "float64", "int32"), ulps=4, seed=0):
    """A ``Report`` of whether each rule of ``rules`` (a ``Rule``, a ``RuleSet`` or a list of them) keeps the
    written term's values in each of ``dtypes``, within ``ulps`` units in the last place; true where every rule
    was checked and none changes one."""
    report = Report()
    for rule in _rules(rules):
        problems = rule_problems(rule)
        if problems:
            report.skipped[rule.name] = f"it fits no tensor term: {problems[0]}"
            continue
        why = _unbuildable(rule)
        if why:
            report.skipped[rule.name] = why
            continue
        applied = False
        for dtype in map(as_dtype, dtypes):
            try:
                found, fired = _check(rule, dtype, ulps, np.random.default_rng(seed))
                if found is None and fired:
                    found = _shaped(rule, dtype, ulps, np.random.default_rng(seed))
            except RewriteError as error:  # a replacement no tensor term can be (an op cortado does not have)
                report.skipped[rule.name] = f"it builds no term: {str(error).splitlines()[0]}"
                applied = False
                break
            applied |= fired
            if found is not None:
                report.failures.append(found)
                break
        if applied:
            report.checked.append(rule.name)
        elif rule.name not in report.skipped:
            report.skipped[rule.name] = f"applies to none of {', '.join(map(str, dtypes))} as built"
    return report


def _rules(rules):
    if isinstance(rules, RuleSet):
        return list(rules.rules)
    if isinstance(rules, Rule):
        return [rules]
    if isinstance(rules, (list, tuple)):
        return [r for item in rules for r in _rules(item if isinstance(item, (Rule, RuleSet)) else as_rule(item))]
    raise CortadoError(f"check takes a Rule, a RuleSet or a list of them, not {rules!r}")


def _unbuildable(rule):
    """Why ``rule``'s pattern cannot be built from variables alone, or None."""
    stack = [rule.pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, Splat):
            return "a splat"
        if isinstance(p, Named):
            return f"the variable {p.name!r}"
        if isinstance(p, PatternNode):
            if p.params:
                return "attributes"
            stack.extend(p.args)
    if not isinstance(rule.pattern, PatternNode):
        return "a pattern of a placeholder alone"
    return None


def _check(rule, dtype, ulps, rng):
    """The first counterexample of ``rule`` in ``dtype`` (or None), and whether the rule rewrote any form built:
    each placeholder a variable, then each set of them constants of every hard value."""
    names = sorted(set(placeholder_names(rule.pattern)))
    fired = False
    for count in range(len(names) + 1):
        for constants in itertools.combinations(names, count):
            variables = [n for n in names if n not in constants]
            feeds = _feeds(dtype, variables, rng)
            size = len(next(iter(feeds.values()))) if feeds else 1
            for values in itertools.product(_hard(dtype) + _ordinary(dtype), repeat=count):
                bound = {n: ct.var(n.lstrip("_") or "x", (size,), dtype) for n in variables}
                bound.update({n: ct.const(np.array(v, dtype)) for n, v in zip(constants, values)})
                written = _built(rule, bound)
                rewritten = None if written is None else rule.rewrite(written)
                if rewritten is None or rewritten is written:
                    continue
                if _mixes(written) or _mixes(rewritten):
                    found, applied = _compared_by_case(rule, dtype, bound, variables, feeds, ulps)
                    if not applied:
                        continue
                else:
                    found = _compared(rule, dtype, written, rewritten, bound, feeds, size, ulps)
                fired = True
                if found is not None:
                    return found, True
        if fired:
            return None, True  # checked with the fewest constants it applies with
    return None, fired


def _shaped(rule, dtype, ulps, rng):
    """A counterexample of ``rule`` where its placeholders are variables of ``SHAPES`` (not the vectors of
    ``_check``, where a dot product commutes, a transpose is the identity and every mean is over 4 values) holding
    random values, or None."""
    names = sorted(set(placeholder_names(rule.pattern)))
    for shape in SHAPES:
        bound = {n: ct.var(n.lstrip("_") or "x", shape, dtype) for n in names}
        written = _built(rule, bound)
        rewritten = None if written is None else rule.rewrite(written)
        if rewritten is None or rewritten is written:
            continue
        low = -5 if is_float(dtype) or (dtype != np.bool_ and np.iinfo(dtype).min < 0) else 0
        feeds = {n: (rng.standard_normal(shape) if is_float(dtype) else rng.integers(low, 6 if low else 2, shape))
                 .astype(dtype) for n in names}
        named = {bound[n].name: v for n, v in feeds.items()}
        reads = [(t, set(Graph([t]).variables_by_name())) for t in (written, rewritten)]
        with np.errstate(all="ignore"):
            expected, got = (np.asarray(evaluate(t, {k: v for k, v in named.items() if k in used})) for t, used in reads)
        if expected.shape != got.shape or not _same(expected, got, ulps).all():
            return Counterexample(rule.name, dtype.name, written, feeds, expected, got)
    return None


def _built(rule, bound):
    """The rule's pattern with the placeholders bound, or None where its ops refuse those operands."""
    try:
        return instantiate(rule.pattern, Bindings(bound, None, TENSOR), TENSOR)
    except (NotApplicable, ShapeError, DTypeError):
        return None


def _compared(rule, dtype, written, rewritten, bound, feeds, size, ulps):
    """A counterexample where ``rewritten`` gives another value than ``written`` on ``feeds`` (vectors of ``size``),
    else None."""
    named = {bound[n].name: value for n, value in feeds.items()}

    def value(term):
        used = Graph([term]).variables_by_name()
        return np.broadcast_to(np.asarray(evaluate(term, {k: v for k, v in named.items() if k in used})), (size,))

    with np.errstate(all="ignore"):
        expected, got = value(written), value(rewritten)
    differ = np.flatnonzero(~_same(expected, got, ulps))
    if not len(differ):
        return None
    with np.errstate(all="ignore"):  # the most telling: another value before another sign of a zero
        gap = np.abs(expected[differ].astype(np.float64) - got[differ].astype(np.float64))
    i = differ[int(np.argmax(np.where(np.isnan(gap), np.inf, gap)))]
    inputs = {n: feeds[n][i] for n in feeds}
    inputs.update({n: bound[n].attr("value").scalar for n in bound if n not in feeds})
    return Counterexample(rule.name, dtype.name, written, inputs, expected[i], got[i])


def _mixes(term):
    """Whether ``term`` combines elements of its operands (a sum, a product of matrices, a softmax), so that the
    elements of one vector are no separate cases."""
    return any(t.op.kind not in (ELEMENTWISE, LEAF) and t.op is not BROADCAST_TO for t in Graph([term]).schedule)


def _compared_by_case(rule, dtype, bound, variables, feeds, ulps):
    """As ``_compared``, for a rule over terms that combine elements: each case its own vector of ``CASE`` values
    for each variable (``_cases``), the written and the rewritten term evaluated on each. Also whether the rule
    rewrites the form built of such vectors at all (a guard may want longer ones)."""
    small = {n: ct.var(bound[n].name, (CASE,), dtype) if n in variables else bound[n] for n in bound}
    written = _built(rule, small)
    rewritten = None if written is None else rule.rewrite(written)
    if rewritten is None or rewritten is written:
        return None, False
    reads = [(t, set(Graph([t]).variables_by_name())) for t in (written, rewritten)]
    for case in _cases(dtype, variables, feeds):
        named = {small[n].name: value for n, value in case.items()}
        with np.errstate(all="ignore"):
            expected, got = (np.asarray(evaluate(t, {k: v for k, v in named.items() if k in used})) for t, used in reads)
        if not _same(expected, got, ulps).all():
            inputs = dict(case)
            inputs.update({n: small[n].attr("value").scalar for n in small if n not in case})
            return Counterexample(rule.name, dtype.name, written, inputs, expected, got), True
    return None, True


def _cases(dtype, variables, feeds):
    """``{placeholder: vector}`` cases: every pair of hard values in one vector, ``[a, b, b, a]`` (every variable
    the same), then ``feeds`` (every combination of hard values across the variables, then random values) cut into
    vectors of ``CASE``; one case of none where there are no variables."""
    if not variables:
        yield {}
        return
    hard = _hard(dtype)
    for a, b in itertools.product(hard, repeat=2):
        yield {n: np.array([a, b, b, a]).astype(dtype) for n in variables}
    size = len(feeds[variables[0]])
    for start in range(0, size - size % CASE, CASE):
        yield {n: feeds[n][start:start + CASE] for n in variables}


def _hard(dtype):
    if dtype == np.bool_:
        return (False, True)
    if is_float(dtype):  # the plain values, then the dtype's own extremes: its smallest subnormal and normal, the
        info = finfo(dtype)  # square root of its largest (a square's edge) and its largest, of both signs
        extremes = [float(info.smallest_subnormal), float(info.tiny), float(np.sqrt(float(info.max))), float(info.max)]
        values = list(PLAIN_FLOATS) + extremes + [-v for v in extremes]
        return tuple(float(np.array(v).astype(dtype)) for v in values)  # (a set would take -0.0 as 0.0)
    info = np.iinfo(dtype)
    return tuple(dict.fromkeys((0, 1, -1 if info.min < 0 else 2, 7, info.min, info.max, info.min + 1, info.max - 1)))


def _ordinary(dtype):
    """Constants beside the hard values: a guard may admit only values near a hard one (``c`` within 1% of 1),
    where the hard value alone would show the rule right."""
    if dtype == np.bool_:
        return ()
    values = (1.001, 0.999, 2.5, -1.5, 1e-3, 100.0) if is_float(dtype) else (2, 3, 100, -5)
    return tuple(v for v in (np.array(v).astype(dtype).item() for v in values)
                 if is_float(dtype) or np.iinfo(dtype).min <= v <= np.iinfo(dtype).max)


def _feeds(dtype, variables, rng):
    """Vectors holding every combination of the hard values for the first ``COMBINED`` variables (the others the
    hard values in turn), then random values."""
    hard = np.array(_hard(dtype), dtype=np.float64 if is_float(dtype) else dtype)  # cast to dtype below
    combined = variables[:COMBINED]
    grids = np.meshgrid(*[np.arange(len(hard))] * len(combined), indexing="ij") if combined else []
    picks = {n: g.ravel() for n, g in zip(combined, grids)}
    size = len(next(iter(picks.values()))) if picks else len(hard)
    for k, n in enumerate(variables[COMBINED:]):
        picks[n] = (np.arange(size) + k) % len(hard)
    feeds = {}
    for n in variables:
        chosen = hard[picks[n]]
        if dtype == np.bool_:
            extra = rng.integers(0, 2, RANDOM).astype(bool)
        elif is_float(dtype):  # half of moderate size, half spread over the dtype's whole range of exponents
            info = finfo(dtype)
            exponents = rng.uniform(np.log2(float(info.tiny)), np.log2(float(info.max)), RANDOM - RANDOM // 2)
            extra = np.concatenate([rng.standard_normal(RANDOM // 2) * 10.0 ** rng.integers(-3, 4, RANDOM // 2),
                                    rng.choice([-1.0, 1.0], len(exponents)) * 2.0 ** exponents])
        else:
            info = np.iinfo(dtype)
            extra = rng.integers(max(info.min, -1000), min(info.max, 1000), RANDOM, endpoint=True)
        feeds[n] = np.concatenate([chosen, extra]).astype(dtype)
    return feeds


def _same(expected, got, ulps):
    """Elementwise: the same value up to ``ulps`` units in the last place of the results' dtype (which integer
    operands may give too: a log), NaN for NaN, and the same sign."""
    dtype = expected.dtype
    if not is_float(dtype):
        return expected == got
    e, g = expected.astype(np.float64), got.astype(np.float64)
    nan = np.isnan(e) | np.isnan(g)
    with np.errstate(invalid="ignore", over="ignore"):
        spacing = np.maximum(np.abs(e), np.abs(g)) * float(finfo(dtype).eps) + float(finfo(dtype).smallest_subnormal)
        close = (e == g) | (np.abs(e - g) <= ulps * spacing)
    signs = np.signbit(e) == np.signbit(g)
    return np.where(nan, np.isnan(e) & np.isnan(g), close & signs & (np.isinf(e) == np.isinf(g)))
