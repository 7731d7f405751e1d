"""``compile``: a graph in, a runnable ``Program`` out.

The pipeline, each stage a pass over values that returns new values:

1. check the signature: every variable the outputs and updates read is an input or state;
2. rules: ``simplify`` (algebra), ``stability``, the backend's lowering, the composite ops spelled out in
   primitives (``rules.primitives``: no backend emits sigmoid, softplus or gelu), then ``fuse``, and for a
   backend that declares ``horizontal`` the joins of fused kernels (a row max into the kernel making its rows or
   one reading them, an elementwise kernel into one reading all it reads, scalars into a reduction's epilogue,
   small kernels side by side);
3. schedule the rewritten outputs and update values, one kernel per op or fused region, in the
   order that keeps the fewest bytes live (``memplan.memory_order``); asynchronous kernels (an
   all-reduce) as early as they can run, what waits for them last (``memplan.overlapped``), and
   what they read kept live until then (``held``), unless they write their results in its place;
   so too what the kernels the backend runs beside the others read (an update that only writes
   state: ``memplan.beside_joins``), where that adds nothing to the most bytes live
   (``memplan.affordable``);
4. plan memory: the backend says which kernels are views, what they may do in place and what
   workspace they need; an update that can be computed straight into its state buffer is. Where the
   backend proposes other variants of its lowering for the planned step (the GPU's: bias gradients
   that a GEMM would hold at the arena's peak computed apart), each is planned too and the smallest
   arena kept; then the elementwise values held across the peak that are cheap to make again are
   recomputed where their late readers need them (``memplan.recompute``), while that shrinks the arena;
5. build the backend's executor over one arena.

With ``data_parallel=True`` the signature's updates are first rewritten to average every gradient
they read over the ranks (``distributed.rewrite``).

The compiler knows backends only through ``backends.interface.Backend``.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
import warnings

import numpy as np

from .backends import interface
from .errors import BackendError, DTypeError, FeedError, PlanError, RewriteError, ShapeError
from .exprgraph import feeds as feed_checks, owed
from .exprgraph.graph import as_outputs, collector_paused, post_order, schedule, two_variables_named
from .exprgraph.ops import CONST, FUSED, VAR, may_fail, reads_unchecked_indices
from .exprgraph.printing import result_label
from .exprgraph.term import Term
from .memplan.copy_hosts import into_row_kernels
from .memplan.recompute import choices, recomputed
from .memplan import (affordable, beside_joins, intervals, joins, memory_order, overlapped, owners, plan_memory,
                      read_through_view, verify)
from .rules.api import fast_simplifier, simplifier
from .rules.domains import rule_problems
from .rules.engine import Fixpoint, Postwalk, Rewrite, Rewriter, Rule, RuleSet, Trace
from .rules.fusion import fuse
from .rules.row_epilogues import into_producers, into_siblings
from .rules.row_values import made_by_readers
from .rules.shared_reads import into_readers
from .rules.scalar_epilogues import into_reductions
from .rules.horizontal import side_by_side
from .rules.kept_casts import kept_casts
from .rules.primitives import primitives
from .rules.stability import stabiliser

PIPELINE = ("simplify", "stability", "lowering", "primitives", "fusion")


@dataclass(frozen=True)
class Signature:
    """What a program reads and writes: outputs, fed inputs, state with its initial values, updates."""

    outputs: tuple
    inputs: tuple
    state: dict
    updates: dict
    single: bool  # one output term was given (not a list): calls return one array
    ranks: int = 1  # the ranks a data-parallel step's all-reduces reach (1: a world of one, or none)


@dataclass(frozen=True)
class Kernel:
    """One step of the schedule: the terms it defines (several for a multi-output region), what it reads."""

    terms: tuple
    reads: tuple

    @property
    def term(self):
        return self.terms[0]

    @property
    def is_load(self):
        return self.term.op is VAR


def _variable(v, what):
    if not isinstance(v, Term) or v.op is not VAR:
        raise FeedError(f"compile: {what} must be variables (ct.var), not {v!r}")
    return v


def _mapping(given, what, example):
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise FeedError(f"compile: {what} must be a dict mapping {example}, not {type(given).__name__} {given!r}")
    return dict(given)


def _signature(outputs, inputs, state, updates):
    single = isinstance(outputs, Term)
    outputs = as_outputs(outputs)
    if isinstance(inputs, Term):  # one variable, as one output term may be given alone
        inputs = [inputs]
    inputs = tuple(_variable(v, "inputs") for v in (inputs or ()))
    state = _mapping(state, "state", "each variable to its initial value ({W: W_value})")
    updates = _mapping(updates, "updates", "each state variable to its new value ({W: W - 0.1 * gW})")
    names = {}
    for v in list(inputs) + [_variable(v, "state keys") for v in state]:
        if v.name in names and names[v.name] is not v:
            raise FeedError(f"compile: {two_variables_named(names[v.name], v)}")
        if v.name in names:
            raise FeedError(f"compile: {v.name!r} is both an input and state, or an input twice; "
                            f"each variable is fed or kept, once, under its own name")
        names[v.name] = v
    values = feed_checks.bind({v.name: v for v in state}, {v.name: value for v, value in state.items()},
                              what="the first value of")
    state = {v: np.array(values[v], copy=True) for v in state}
    for v, new in updates.items():
        _variable(v, "update keys")
        if v not in state:
            if v.name in names:  # another variable of that name is in state (or an input)
                raise FeedError(f"compile: {two_variables_named(names[v.name], v)}")
            raise FeedError(f"compile: the update of {v.name!r} needs {v.name!r} in state, with its initial value")
        if not isinstance(new, Term):
            raise DTypeError(f"compile: the update of {v.name!r} must be a cortado term, not {type(new).__name__}")
        if new.shape != v.shape:
            raise ShapeError(f"compile: the update of {v.name!r} has shape {new.shape}, the variable {v.shape}")
        if new.dtype != v.dtype:
            raise DTypeError(f"compile: the update of {v.name!r} has dtype {new.dtype}, the variable {v.dtype}; "
                             f"use ct.cast(..., {v.dtype.name!r})")
    computed = schedule(list(outputs) + list(updates.values()))
    _warn_of_training_modes(computed, updates)
    read = [t for t in computed if t.op is VAR]
    for v in read:
        if v.name in names and names[v.name] is not v:
            raise FeedError(f"compile: {two_variables_named(names[v.name], v)}")
        if v.name not in names:
            raise FeedError(f"compile: the graph reads variable {v.name!r} ({v.attr('declaration')!r}), "
                            f"but it is neither an input nor state")
    return Signature(outputs, inputs, state, updates, single)


def _warn_of_training_modes(computed, updates):
    """Warns where layers in training (a batch norm, a dropout) compute what ``computed`` holds but the program's
    ``updates`` leave their state as it is: a training step without ``model.state_updates``, or a program that
    updates nothing and computes no gradient, an evaluation program built before ``model.eval()`` (a module's mode
    is read where ``model(x)`` builds the terms, so ``eval()`` called afterwards changes nothing). A program of
    gradients without updates (a gradient check) is a look at a training step: nothing is owed."""
    from .grad import gradient_of

    if updates:
        for what, owing, unupdated in owed.unpaid(computed, {v.name for v in updates}):
            warnings.warn(f"compile: the step computes {what} in training, but its updates leave {list(owing)} as "
                          f"they are, so {unupdated}: add model.state_updates(outputs) to updates, or call "
                          f"model.eval() for inference", stacklevel=5)
        return
    training = sorted({what for what, _, _ in owed.unpaid(computed, ())})
    if training and not any(gradient_of(t) for t in computed):
        warnings.warn(f"compile: the program computes {' and '.join(training)} in training mode and updates nothing: "
                      f"a batch norm normalises by each batch's statistics and a dropout draws the same mask every "
                      f"call. For inference, call model.eval() before model(x) builds the program's terms (the mode "
                      f"is read there, so eval() afterwards changes nothing); for training, give it "
                      f"updates=model.state_updates(outputs)", stacklevel=5)


@dataclass(frozen=True)
class _Rewriting:
    """What the caller asked of the rules: ``fast_math``, and ``yours``, the caller's own rules as a strategy run
    before every other stage (None: none)."""

    fast_math: bool = False
    yours: object = None


def _yours(rules):
    """``compile``'s ``rules``: a strategy as it is, a ``Rule``, a ``RuleSet`` or a list of them (or of ``(pattern,
    replacement)`` pairs, as a ``RuleSet`` takes) run as the built-in algebra is, bottom-up to a fixpoint; None for
    none."""
    if rules is None:
        return None
    if isinstance(rules, Rewriter) and not isinstance(rules, (Rule, RuleSet)):
        strategy = rules
    else:
        if isinstance(rules, (Rule, RuleSet)):
            rules = [rules]
        if not isinstance(rules, (list, tuple)) or not all(isinstance(r, (Rule, RuleSet, tuple)) for r in rules):
            raise RewriteError(f"compile: rules is a Rule, a RuleSet, a list of them (or of (pattern, replacement) "
                               f"pairs) or a strategy (Postwalk, Chain, ...), not {rules!r}")
        strategy = Fixpoint(Postwalk(Fixpoint(RuleSet(rules, name="yours"))))
    for rule in _rules_in(strategy):  # a pattern that fits no term would never fire, without a word
        problems = rule_problems(rule)
        if problems:
            raise RewriteError(f"compile: your rule {rule.name!r} fits no term of a program: {problems[0]}")
    return strategy


def _rules_in(rewriter):
    """The ``Rule`` s a strategy runs: those of its rule sets and of the strategies it wraps."""
    if isinstance(rewriter, Rule):
        return [rewriter]
    if isinstance(rewriter, RuleSet):
        return list(rewriter.rules)
    inner = [getattr(rewriter, "rewriter", None), *getattr(rewriter, "rewriters", ())]
    return [rule for r in inner if isinstance(r, Rewriter) for rule in _rules_in(r)]


def _variables_read(roots):
    return {t for t in post_order(roots) if t.op is VAR}


def _no_new_variables(signature, written, roots, trace):
    """A RewriteError where the caller's rules made ``roots`` read a variable that the program as ``written`` did not
    and that is neither an input nor state: the step would fail when it loads it (``_signature`` checks the written
    program's own variables)."""
    known = _variables_read(written) | set(signature.inputs) | set(signature.state)
    for v in sorted(_variables_read(roots) - known, key=lambda v: v.name):
        rules = sorted({step.rule for step in trace if isinstance(step.after, Term) and v in post_order([step.after])})
        same_name = [k for k in known if k.name == v.name]
        if same_name:
            raise RewriteError(f"compile: your rules (rule {', '.join(rules) or '?'}) made the program read another "
                               f"variable: {two_variables_named(same_name[0], v)}")
        raise RewriteError(f"compile: your rules made the program read variable {v.name!r} ({v.attr('declaration')!r}), "
                           f"which is neither an input nor state (rule {', '.join(rules) or '?'}); feed it as an "
                           f"input or keep it as state, or write the rule so that it reads only what the program "
                           f"reads")


def _rewrite(roots, backend, traces, variant=None, rewriting=_Rewriting()):
    """The rule pipeline over all roots at once, so they keep sharing their subterms; ``variant``: of the
    backend's lowering (one of its ``alternatives``)."""
    roots = list(roots)
    if rewriting.yours is not None:
        traces["your rules"] = Trace()
        roots = rewriting.yours.run(roots, traces["your rules"])
    traces.update({stage: Trace() for stage in PIPELINE})
    if rewriting.fast_math:
        traces["simplify"].label = "simplify (fast_math)"  # explain() says fast_math is on, fired or not
    roots = (fast_simplifier if rewriting.fast_math else simplifier).run(roots, traces["simplify"])
    roots = stabiliser.run(roots, traces["stability"])
    if backend.lowering is not None:
        roots = backend.lowering.run(roots, traces["lowering"], variant)
    roots = primitives.run(roots, traces["primitives"])
    roots, _ = fuse(roots, traces["fusion"], backend.kernel_shapes)
    if backend.kernel_shapes.horizontal:
        joined = into_siblings(into_producers(roots, traces["fusion"]), traces["fusion"])
        joined = made_by_readers(into_readers(joined, traces["fusion"]), traces["fusion"])
        joined = into_reductions(joined, traces["fusion"])
        roots = side_by_side(joined, traces["fusion"])
    return list(backend.after_fusion(roots, traces["fusion"]))


def _kernels(roots, signature, updates=None):
    """The schedule as kernels: one per op, one per set of results of an op with several (a fused region of
    several outputs), one load per input. A kernel computing an update that does not read its state variable reads
    it all the same, in name only: it may write the update over the variable once the variable's readers are done
    (``_sinks``), rather than into a buffer copied in after the step."""
    kernels, made = [], set()  # every term the kernels so far define
    state = set(signature.state)
    overwritten = {}
    for var, value in (updates or {}).items():
        overwritten.setdefault(value, []).append(var)
    for t in schedule(roots):
        if t.op is CONST or t in state or t in made:  # made: a result of a kernel listed already (its results are
            continue  # built once a kernel, not once a result: a region of n outputs would build n * n terms)
        terms = t.op.results_of(t)
        made.update(terms)
        reads = tuple(dict.fromkeys(t.args))
        named = [v for d in terms for v in overwritten.get(d, ()) if v not in reads]
        kernels.append(Kernel(terms, reads + tuple(dict.fromkeys(named))))
    return kernels


def _may_raise(kernel, gathers_raise):
    """Whether ``kernel`` can stop its call on its values, in a fused body too: an integer power whose exponent may
    be negative, or, where the backend's gathers check their indices (``gathers_raise``), a gather at indices known
    only when the program runs."""
    # a kernel's results share one body: walked once, not once a result (quadratic in a region's outputs)
    inside = tuple(schedule(kernel.term.attr("outputs"))) if kernel.term.op.kind == FUSED else ()
    return any(may_fail(t) or (gathers_raise and reads_unchecked_indices(t)) for t in kernel.terms + inside)


def _sinks(kernels, steps, updates, live_out, gathers_raise):
    """``{update value: state variable}`` for updates computed straight into their state buffer.

    An update may write over its variable when the kernel computing it reads the variable for the
    last time and may write that operand in place, and no kernel that can stop the call on its values
    (``_may_raise``) runs from it on: a failed call must leave the state as it was. The others are
    computed into buffers of their own and copied in after the step.
    """
    last_failing = max((i for i, k in enumerate(kernels) if _may_raise(k, gathers_raise)), default=-1)
    lives = intervals(steps, live_out)
    owner = owners(steps)
    defined_at = {t: i for i, k in enumerate(kernels) for t in k.terms}
    sinks = {}
    for var, value in updates.items():
        i = defined_at.get(value)
        if i is None or i <= last_failing or value in sinks or var not in lives or lives[var].end != i:
            continue
        if (value, var) in steps[i].inplace and not read_through_view(steps[i], var, owner):
            sinks[value] = var
    return sinks


def _ordered(kernels, steps, nbytes, kept, live_out, updates, copies, ranks=1):
    """The kernels and their steps in ``memplan.memory_order``. An update its kernel may write over its
    state variable (see ``_sinks``) costs no buffer and waits for every other reader of the variable,
    unless a reader must wait for it (through data, or an earlier update's wait): then it is computed into
    a buffer of its own and copied in after the step. A recomputed value's copy (``copies``: the value ->
    its readers) waits for everything else its readers read, so that it is made where they need it. Where
    all-reduces reach other ranks (``ranks``), each bucket's gradients are made before the next one's
    (``_bucket_by_bucket``)."""
    defined_at = {t: i for i, k in enumerate(kernels) for t in k.terms}
    owner = owners(steps)
    users, readers = {}, {}  # step -> the steps reading what it defines; stored value -> the steps reading it
    for i, s in enumerate(steps):
        for r in s.reads:
            if r in defined_at:
                users.setdefault(defined_at[r], set()).add(i)
            readers.setdefault(owner.get(r, r), set()).add(i)
    external, after = set(kept), []
    for var, value in updates.items():
        j = defined_at.get(value)
        if j is None or (value, var) not in steps[j].inplace:
            continue
        others = readers.get(var, set()) - {j}
        if others & _downstream(j, users):  # coupled updates ({a: a + b, b: a - b}): one must be copied in
            continue
        external.add(value)
        after += [(i, j) for i in sorted(others)]
        for i in others:
            users.setdefault(i, set()).add(j)
    for copy, copy_readers in copies.items():
        j = defined_at[copy]
        waiting = _downstream(j, users) | {j}  # what the copy's result flows into cannot go before it
        for i in {defined_at[a] for reader in copy_readers for a in reader.args if a in defined_at} - waiting:
            after.append((i, j))
            users.setdefault(i, set()).add(j)
    if ranks > 1:
        after += _bucket_by_bucket(kernels, defined_at, users)
    order = memory_order(steps, nbytes, external, live_out, after)
    order = overlapped(order, steps, _issue_order(kernels), after)
    return [kernels[i] for i in order], [steps[i] for i in order]


def _bucket_by_bucket(kernels, defined_at, users):
    """Orderings ``(i, j)`` that make the values of each asynchronous kernel (an all-reduce's gradients) before those
    of the next one issued: each is issued once the last of its values exists, in turn, so a value of an earlier one
    made late (a block of a gradient the schedule reached last) would hold back every later one. Where a value of
    the later one must come first (through data), that pair is left to the data. The order may keep more alive than
    the greedy one (a value made early for its bucket): worth it only where the all-reduces take time beside the
    step, over several ranks."""
    found = []
    issue = _issue_order(kernels)
    for earlier, later in zip(issue, issue[1:]):
        made = [{defined_at[v] for v in kernels[k].term.args if v in defined_at} for k in (earlier, later)]
        for j in made[1]:
            downstream = _downstream(j, users)
            for i in made[0] - downstream - {j}:
                found.append((i, j))
                users.setdefault(i, set()).add(j)
    return found


def _issue_order(kernels):
    """The asynchronous kernels in the order to issue them: by their attributes (an all-reduce's bucket first),
    which every rank of a job has alike, whatever its own schedule (NCCL pairs the ranks' calls in order)."""
    return sorted((i for i, k in enumerate(kernels) if k.term.op.asynchronous), key=lambda i: kernels[i].term.attrs)


def _held(kernels, steps, beside):
    """``{value: step}``: what each asynchronous kernel (and each kernel run ``beside`` the others) reads, its workspace,
    and the step that waits for it (until then the kernel may still be using them, beside the steps between;
    ``len(steps)``: the step's end)."""
    asynchronous = [i for i, k in enumerate(kernels) if k.term.op.asynchronous]
    held = {}
    for i, j in {**joins(steps, asynchronous), **beside}.items():
        for value in (*steps[i].reads, ("workspace", i)):
            held[value] = max(held.get(value, j), j)
    return held


def _groups(kernels):
    """What each grouped kernel (an all-reduce) reads and what it writes, each placed side by side, the results
    in the operands' places where the plan can."""
    return [(k.term.args, k.terms) for k in kernels if k.term.op.grouped]


def _downstream(j, users):
    """The steps that must run after step ``j``, directly or through others (``users``: step -> the steps
    waiting for it)."""
    found, frontier = set(), [j]
    while frontier:
        for u in users.get(frontier.pop(), ()):
            if u not in found:
                found.add(u)
                frontier.append(u)
    return found


def compile(outputs, inputs=(), state=None, updates=None, backend="numpy", debug=False, data_parallel=False,
            recompute=True, fast_math=False, rules=None, **options):
    """A ``Program`` computing ``outputs`` from fed ``inputs`` and persistent ``state``.

    ``state``: ``{variable: initial value}``. ``updates``: ``{state variable: new value term}``;
    after each call every update is written, all computed from the values before the call.
    ``backend``: ``"numpy"`` or ``"cupy"`` (the GPU; options ``cuda_graph=True`` to replay each
    step as one CUDA graph, ``tf32=True`` to let float32 GEMMs and convolutions use TF32 tensor
    cores, ``autotune=True`` to time the candidates of each GEMM and convolution (cuBLASLt's
    algorithms, cuDNN's plans) when building (a GEMM of 2^38 multiply-adds or more keeps cuBLASLt's
    first choice), ``nhwc`` to store the images that convolutions make,
    and the elementwise regions that follow them, channels last: ``"auto"`` (the default) for the
    dtypes cuDNN convolves on tensor cores (float16, bfloat16; float32 with ``tf32``), True or False
    for all or none; ``deterministic=False`` to let cuDNN add partial sums in any order, which is
    faster for some float32 weight gradients but no longer gives the same bits on every run;
    ``channels_last_io=True`` to take and return arrays of 4 or more axes channels last, NHWC memory
    of an NCHW shape as torch's ``channels_last`` tensors, read in place where a CuPy feed is so).
    ``debug=True`` verifies the memory plan as it is made. ``data_parallel=True`` makes one rank's step of a
    data-parallel job (``cortado.distributed``): each rank feeds its own shard of the batch, every gradient an
    update reads is averaged over the ranks in buckets, each one all-reduce that runs beside the rest of the
    backward pass, and the state starts as rank 0's; a dict instead of True sets the buckets' byte caps
    (``{"bucket_bytes": 25 << 20, "first_bucket_bytes": 1 << 20}``, DDP's defaults) and the blocks' of the last
    gradient (``"block_bytes"``, 64 MiB; ``distributed.rewrite``). ``recompute=False`` keeps
    every value the backward pass reads from the forward pass, instead of making again the elementwise ones that
    are cheap to make where that shrinks the arena (``memplan.recompute``: a gelu's output, a layer norm's rows).
    By default the program computes what the expressions say, each result within rounding of the written
    operations; ``fast_math=True`` adds the ``rules.fast_math`` rewrites, which may change a float result by
    more: ``x - x`` is 0 even for inf and nan, and constants are collected across sums and products whatever
    the grouping (``(x + 1e8) - 1e8`` becomes ``x``; ``(x * 1e30) * 1e-30`` no longer overflows). ``rules``: your
    own rewrites, run before every other stage: a ``Rule``, a ``RuleSet`` or a list of them (bottom-up to a
    fixpoint, as the built-in algebra runs), or a strategy (``Postwalk``, ``Chain``, ...); ``explain()`` lists what
    they did as "your rules". A rule may change a value: ``ct.rules.check(rules)`` tests it first.

        step = ct.compile([loss], inputs=[x, y], state={W: Wv}, updates={W: W - 0.1 * gW})
        (loss_value,) = step(x=xv, y=yv)
    """
    with collector_paused():  # a collection during compile would rescan every live term, again and again
        return _compile(outputs, inputs, state, updates, backend, debug, data_parallel, recompute, fast_math, rules,
                        options)


def _options(engine, given):
    known = engine.options
    unknown = sorted(set(given) - set(known))
    if unknown:
        takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
        raise BackendError(f"compile: the {engine.name} backend has no option {', '.join(unknown)}; {takes}")
    return {**known, **given}


@dataclass
class _Built:
    """A step rewritten, scheduled and planned: what an executor is made from."""

    traces: dict
    roots: list
    outputs: list
    updates: dict
    kernels: list
    steps: list
    sinks: dict
    beside: dict
    plan: object
    nbytes: dict
    kept: list
    live_out: list


def _built(signature, engine, options, variant=None, rewriting=_Rewriting()):
    """The rule pipeline, the kernels, their memory-aware order and the memory plan of one step."""
    traces = {}
    written = list(signature.outputs) + list(signature.updates.values())
    roots = _rewrite(written, engine, traces, variant, rewriting)
    if rewriting.yours is not None:
        _no_new_variables(signature, written, roots, traces["your rules"])
    return _planned(roots, signature, engine, options, traces)


def _planned(roots, signature, engine, options, traces, copies=None):
    """The kernels of the rewritten ``roots``, their memory-aware order and the memory plan; ``copies``:
    ``{recomputed value: its readers}`` (``memplan.recompute``), each copy ordered after its readers' other
    operands."""
    outputs, values = roots[:len(signature.outputs)], roots[len(signature.outputs):]
    updates = dict(zip(signature.updates, values))
    kernels = _kernels(roots, signature, updates)
    nbytes = _sizes(kernels)
    steps = engine.steps(kernels, options)
    live_out = list(outputs) + list(values)
    kept = [t for t in schedule(roots) if t.op is CONST or t in signature.state]
    if engine.feeds_in_place:
        kept += [k.term for k in kernels if k.is_load]
    kernels, steps = _ordered(kernels, steps, nbytes, kept, live_out, updates, copies or {}, signature.ranks)
    sinks = _sinks(kernels, steps, updates, live_out, engine.gathers_raise)
    direct = engine.direct_outputs(kernels, steps, outputs, sinks, options)
    external = kept + list(sinks) + direct
    labels = {t: result_label(t, i) for i, k in enumerate(kernels) for t in k.terms}
    placed_out = [v for v in live_out if v not in sinks and v not in direct]
    beside = affordable(steps, nbytes, external, placed_out,
                        beside_joins(steps, engine.beside(kernels, steps, sinks, options), sinks))
    plan = plan_memory(steps, nbytes, external, placed_out, engine.alignment, labels,
                       shared=sinks.items(), in_place_groups=_groups(kernels), held=_held(kernels, steps, beside))
    return _Built(traces, roots, outputs, updates, kernels, steps, sinks, beside, plan, nbytes, kept, live_out)


def _recomputing(built, signature, engine, options, rounds=3):
    """``built``, or the program that makes again what the backward pass reads of the forward pass's elementwise
    values where that plans a smaller arena (``memplan.recompute``), a few rounds over (the peak moves); then with
    the backend's rewrites of what recomputation made (``Backend.after_recomputation``)."""
    copies = {}
    for _ in range(rounds):
        chosen = choices(built.kernels, built.steps, built.plan, built.nbytes, built.kept, built.live_out)
        if not chosen:
            break
        roots, round_copies, made = recomputed(built.roots, chosen)
        roots, round_copies, joined = into_row_kernels(roots, round_copies)
        other = _planned(roots, signature, engine, options, built.traces, round_copies)
        if other.plan.peak_bytes >= built.plan.peak_bytes:
            break
        trace = built.traces.setdefault("recompute", Trace())
        for value, copy in made.items():
            trace.append(Rewrite("recompute-after-the-peak", value, copy))
            if copy in joined:
                trace.append(Rewrite("copy-into-row-kernel", copy, joined[copy]))
        built, copies = other, round_copies
    return _rewritten_after_recomputation(built, copies, signature, engine, options)


# the most a backend's rewrites after recomputation may grow the arena (a fraction of it): the GPU's columns of ones
# add an eighth of the padded inputs' columns at most, about 1% of the GPT's inputs to its weight gradients
ARENA_GROWTH = 0.01


def _rewritten_after_recomputation(built, copies, signature, engine, options):
    """``built`` with the backend's rewrites once recomputation is settled (``Backend.after_recomputation``; ``copies``:
    the copies ``built`` orders), where they grow the arena by at most ``ARENA_GROWTH``."""
    rewritten = Trace()
    roots, copies = engine.after_recomputation(built.roots, copies, rewritten)
    if not rewritten:
        return built
    other = _planned(roots, signature, engine, options, built.traces, copies)
    if other.plan.peak_bytes > built.plan.peak_bytes * (1 + ARENA_GROWTH):
        return built
    other.traces.setdefault("recompute", Trace()).extend(rewritten)
    return other


def _sizes(kernels):
    """The bytes of every value the kernels define; a PlanError for one larger than any array can be."""
    nbytes = {t: t.size * t.dtype.itemsize for k in kernels for t in k.terms}
    for t, size in nbytes.items():
        if size > np.iinfo(np.intp).max:
            raise PlanError(f"compile: {t!r}, built at {t.where_built}, would take {size} bytes, "
                            f"more than any array can hold")
    return nbytes


def _compile(outputs, inputs, state, updates, backend, debug, data_parallel, recompute, fast_math, rules, options):
    from .backends import backend_named
    from .program import Program

    signature = _signature(outputs, inputs, state, updates)
    engine = backend_named(backend)
    options = _options(engine, options)
    buckets = ()
    if data_parallel:
        signature, buckets = _data_parallel(signature, engine, {} if data_parallel is True else data_parallel)
    state_trace, casts = Trace(), {}
    if engine.keeps_casts:
        kept_outputs, kept_state, kept_updates, casts = kept_casts(signature.outputs, signature.state,
                                                                   signature.updates, state_trace, signature.inputs)
        signature = replace(signature, outputs=kept_outputs, state=kept_state, updates=kept_updates)
    rewriting = _Rewriting(fast_math, _yours(rules))
    built = _built(signature, engine, options, rewriting=rewriting)
    for variant in engine.alternatives(interface.PlannedStep(built.plan, built.traces)):
        other = _built(signature, engine, options, variant, rewriting)
        if other.plan.peak_bytes < built.plan.peak_bytes:
            built = other
    if recompute:
        built = _recomputing(built, signature, engine, options)
    else:
        built = _rewritten_after_recomputation(built, {}, signature, engine, options)
    if debug:
        verify(built.plan)
    executor = engine.executor(built.kernels, built.steps, built.plan, signature, built.outputs, built.updates,
                               built.sinks, built.beside, **options)
    traces = {"state": state_trace, **built.traces} if state_trace else built.traces
    return Program(signature, built.outputs, built.updates, built.kernels, built.plan, executor, traces,
                   engine.name, built.sinks, buckets, casts)


def _data_parallel(signature, engine, caps):
    """The signature with its updates averaging the gradients they read over the ranks, and the buckets."""
    from . import distributed

    known = {"bucket_bytes", "first_bucket_bytes", "block_bytes"}
    if not isinstance(caps, Mapping) or set(caps) - known or not all(isinstance(v, int) and v > 0 for v in caps.values()):
        raise FeedError(f"compile: data_parallel is True, False or a dict of positive byte caps with keys "
                        f"{sorted(known)}, not {caps!r}")
    ranks = max(distributed.world().size, distributed.described_size())
    if ranks > 1 and not engine.collectives:
        raise BackendError(f"compile(data_parallel=True): this process is one of {ranks} ranks, "
                           f"and the {engine.name} backend cannot reduce over them; use backend='cupy'")
    if ranks > 1:
        distributed.init()  # a launched script that did not join its job yet: its ranks would train apart
    updates, buckets = distributed.data_parallel(signature.updates, signature.inputs, blocks=ranks > 1, **caps)
    return replace(signature, updates=updates, ranks=ranks), buckets
