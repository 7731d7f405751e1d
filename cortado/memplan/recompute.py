"""Recomputation: an elementwise value the backward pass reads long after the forward pass made it is made
again, by a copy of its kernel, just before it is read, instead of being held across the memory peak.

A training step's peak is where the forward pass ends: every activation the backward pass will read is
live there. Some are cheap to make again from values that are live there anyway: a gelu's output from its
input (which its gradient reads), a layer norm's normalized rows and output from its centered rows and
statistics. ``choices`` finds, for each fused kernel with outputs live across the peak step, the set of
them whose recomputation frees the most bytes: each output made again must be elementwise over what is
kept (the kernel's other outputs and its operands), all of one shape (the copy is one elementwise kernel: a
layer norm's rows are made again, its reciprocal spread, one value a row, is kept), and every kept value
that would not be live at the peak anyway costs its bytes. A copy reading much more than it makes (a float8
activation from its bfloat16 source) costs more time than the bytes are worth, and is not made
(``MOST_READ_PER_BYTE``). ``recomputed`` rewrites the program: the later readers (after the peak) read the copy's
outputs. The compiler plans the result and keeps it where its arena is smaller (``compiler._recomputing``); the
copy waits for its readers' other operands, so it runs where they do.

    chosen = choices(kernels, steps, plan, nbytes, external, live_out)
    roots, copies, made = recomputed(roots, chosen)   # copies: {copy's term: the terms that read it}
"""

import itertools
from dataclasses import dataclass

from ..exprgraph.graph import post_order
from ..exprgraph.ops import BROADCAST_TO, CONST, ELEMENTWISE, FUSED_OP, PARAM, RESHAPE, TRANSPOSE, WINDOWS, parameter
from ..exprgraph.term import make
from ..rules.fusion import TRANSPOSED_SUMS_KERNEL, kernel_shape
from ..rules.horizontal import Horizontal
from .liveness import intervals, owners
from .offsets import Request, live_bytes

MOST_OUTPUTS = 6  # kernels with more outputs than this are not searched (2**n subsets)
LEAST_GAIN = 1 / 200  # of the arena: a copy freeing less is not worth its kernel
# the most bytes a copy reads for each byte it makes: a value made again from one as wide (a gelu's output from its
# input, a layer norm's rows from its centered rows) costs about what holding it would; a float8 copy of a bfloat16
# activation reads two bytes a byte, and making those again cost the large float8 GPT step 0.9 ms (16.06 against
# 15.19 ms on an H100) for a 27% smaller arena
MOST_READ_PER_BYTE = 1.5


@dataclass(frozen=True)
class Choice:
    """Recompute outputs ``again`` (indices) of the kernel whose terms are ``terms``, from ``leaves``, for the
    ``late`` readers (terms) of each; the kernel stops computing those of them it makes for late readers alone
    (``dropped``)."""

    terms: tuple
    again: tuple
    leaves: tuple  # what the copy reads: kept outputs and operands
    late: dict  # output index -> the reader terms after the peak
    dropped: tuple = ()


def peak_step(plan):
    """The step at which the most bytes are placed (the first of equals)."""
    usage = live_bytes([Request(p.key, p.nbytes, p.start, p.end) for b in plan.buffers for p in b.placements],
                       plan.steps)
    return max(range(len(usage)), key=usage.__getitem__)


def _elementwise_over(body_terms, kept):
    """Whether the body terms compute elementwise from ``kept`` body terms and parameters: no reduction between."""
    stack, seen = list(body_terms), set()
    while stack:
        t = stack.pop()
        if t in seen or t in kept or t.op in (PARAM, CONST):
            continue
        seen.add(t)
        if not (t.op.kind == ELEMENTWISE or t.op is BROADCAST_TO):
            return False
        stack.extend(t.args)
    return True


def _leaves(body, again, kept, args, terms):
    """The values a copy computing outputs ``again`` reads: the kept outputs it uses and the operands left."""
    replaced = {body[j]: terms[j] for j in kept}
    found, stack, seen = [], [body[i] for i in again], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in replaced:
            found.append(replaced[t])
        elif t.op is PARAM:
            found.append(args[t.attr("index")])
        else:
            stack.extend(t.args)
    return list(dict.fromkeys(found))


def cheap(leaves, made):
    """Whether a copy reading ``leaves`` to make ``made`` bytes reads at most ``MOST_READ_PER_BYTE`` bytes a byte."""
    return sum(v.size * v.dtype.itemsize for v in leaves) <= MOST_READ_PER_BYTE * made


def choices(kernels, steps, plan, nbytes, external, live_out):
    """The recomputations worth planning: per fused kernel, the outputs to make again that free the most bytes at
    the peak step, net of what their copy keeps alive that would not be anyway (the fewest outputs among equals),
    of those whose copy reads at most ``MOST_READ_PER_BYTE`` bytes for each byte it makes."""
    peak = peak_step(plan)
    owner = owners(steps)
    lives = intervals(steps, live_out)
    external = set(external)
    readers = {}  # owner -> the steps reading it or a view of it
    for j, step in enumerate(steps):
        if step.view_of is None:
            for key in step.reads:
                readers.setdefault(owner.get(key, key), set()).add(j)

    def held(v):  # across the peak, but read there only by steps after it: a copy could take those
        life, read = lives.get(v), readers.get(v, ())
        return (v not in external and life is not None and life.start < peak < life.end
                and all(r != peak for r in read) and max(read, default=-1) == life.end)  # not a result, nor viewed by one

    free = {v for v, life in lives.items() if v in external or life.start < peak < life.end}
    found = []
    for kernel in kernels[:peak]:
        t, terms = kernel.term, kernel.terms
        if t.op is not FUSED_OP or len(terms) > MOST_OUTPUTS or isinstance(t.attr("kernel"), Horizontal) \
                or t.attr("kernel") == TRANSPOSED_SUMS_KERNEL:  # kinds a body of fewer outputs is not: kept whole
            continue
        body, best = t.attr("outputs"), None
        candidates = [j for j, v in enumerate(terms) if held(v)]
        for size in range(1, len(candidates) + 1):
            for again in itertools.combinations(candidates, size):
                if len({terms[j].shape for j in again}) > 1:  # a copy is one elementwise kernel: one shape
                    continue
                kept = [j for j in range(len(terms)) if j not in again]
                if not _elementwise_over([body[j] for j in again], {body[j] for j in kept}):
                    continue
                leaves = _leaves(body, again, kept, t.args, terms)
                made = sum(nbytes[terms[j]] for j in again)
                if not cheap(leaves, made):
                    continue
                held_anew = [v for v in leaves if owner.get(v, v) not in free]  # a view of a free value is free
                gain = made - sum(nbytes.get(v, 0) for v in held_anew)
                if gain >= LEAST_GAIN * plan.peak_bytes and (best is None or gain > best[0]):
                    best = (gain, again, leaves)
        if best is not None:
            _, again, leaves = best
            free.update(owner.get(v, v) for v in leaves)
            late = {j: tuple(kernels[r].term for r in sorted(readers[terms[j]]) if r > peak) for j in again}
            dropped = tuple(j for j in again if min(readers[terms[j]]) > peak)
            found.append(Choice(terms, again, tuple(leaves), late, dropped if len(dropped) < len(terms) else ()))
    return found


def _rebuilt(outputs, known, param):
    """Body terms ``outputs`` rebuilt bottom-up over new parameters: a term in ``known`` as it maps there, a
    parameter of index ``k`` as ``param(k)``."""
    rebuilt = dict(known)

    def rebuild(t):
        if t not in rebuilt:
            rebuilt[t] = param(t.attr("index")) if t.op is PARAM else \
                t.rebuild([rebuild(a) for a in t.args]) if t.args else t
        return rebuilt[t]

    return tuple(rebuild(t) for t in outputs)


def _copy(choice, leaves):
    """``{output term: the copy's term computing it}`` for the outputs ``choice`` makes again, from ``leaves`` (its
    leaves, as the rewritten program has them)."""
    terms, again = choice.terms, choice.again
    body, args = terms[0].attr("outputs"), terms[0].args
    places = {v: parameter(k, v) for k, v in enumerate(choice.leaves)}
    kept = {body[j]: places[terms[j]] for j in range(len(terms)) if j not in again and terms[j] in places}
    outputs = _rebuilt([body[j] for j in again], kept, lambda k: places[args[k]])
    return {terms[j]: make(FUSED_OP, leaves, (outputs, k, True, kernel_shape(outputs))) for k, j in enumerate(again)}


def _slimmed(choice):
    """``{term: (body, index, operands kept)}``: the outputs the kernel of ``choice`` keeps, in its body without those
    it drops, over the operands that body still reads (renumbered)."""
    if not choice.dropped:
        return {}
    body = choice.terms[0].attr("outputs")
    kept = [j for j in range(len(body)) if j not in choice.dropped]
    read = sorted({t.attr("index") for j in kept for t in post_order([body[j]]) if t.op is PARAM})
    places = {k: parameter(n, choice.terms[0].args[k]) for n, k in enumerate(read)}
    slim = _rebuilt([body[j] for j in kept], {}, places.__getitem__)
    return {choice.terms[j]: (slim, k, tuple(read)) for k, j in enumerate(kept)}


def _rebased(a, value, copy):
    """``a`` (``value`` or a chain of views of it) over ``copy`` instead."""
    if a is value:
        return copy
    return a.rebuild([_rebased(a.args[0], value, copy)] + list(a.args[1:]))


def _views_of(a, value):
    while a is not value and a.args and a.op in (RESHAPE, TRANSPOSE, BROADCAST_TO, WINDOWS):
        a = a.args[0]
    return a is value


def recomputed(roots, chosen):
    """``(roots, copies, made)``: ``roots`` with each choice's late readers reading its copy's outputs, and its
    kernel without the outputs only they read; ``copies``: ``{copy's output term: the rewritten terms reading it}``;
    ``made``: ``{value: its copy}``."""
    swaps, slimmed = {}, {}  # reader term -> [(value, choice)]; kept output -> (new body, its index, operands)
    for choice in chosen:
        slimmed.update(_slimmed(choice))
        for j in choice.again:
            for reader in choice.late[j]:
                for r in reader.op.results_of(reader):
                    swaps.setdefault(r, []).append((choice.terms[j], choice))
    replaced, copies, made = {}, {}, {}

    def copy_of(value, choice):
        if value not in made:
            made.update(_copy(choice, [replaced.get(v, v) for v in choice.leaves]))
        return made[value]

    for t in post_order([v for choice in chosen for v in choice.leaves] + list(roots)):  # a copy's leaves first
        args, reading = [], []
        for a in t.args:
            new = replaced.get(a, a)
            for value, choice in swaps.get(t, ()):
                if _views_of(a, value):
                    new = _rebased(a, value, copy_of(value, choice))
                    reading.append(made[value])
            args.append(new)
        if t in slimmed:
            body, index, read = slimmed[t]
            replaced[t] = make(FUSED_OP, [args[k] for k in read], (body, index, t.attr("again"), kernel_shape(body)))
        elif any(n is not o for n, o in zip(args, t.args)):
            replaced[t] = t.rebuild(args)
        for copy in reading:
            copies.setdefault(copy, []).append(replaced.get(t, t))  # unchanged where it read this copy already
    return [replaced.get(r, r) for r in roots], {c: tuple(rs) for c, rs in copies.items()}, made
