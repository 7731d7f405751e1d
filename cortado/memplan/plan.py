"""The memory plan: every intermediate value gets a fixed offset in one arena.

``plan_memory`` takes a program's steps (see ``liveness.Step``), the size of each value and the
values that live elsewhere (state, constants), and returns a ``MemoryPlan``:

1. live intervals over the steps (``liveness``);
2. in-place sharing: a value may take the buffer of a value its step reads elementwise and that
   dies at that step, when the two have the same size; chains of them share one buffer;
3. offsets by best fit: a sweep in time order, and unless that meets the lower bound, greedy
   size-first and lifetime-first orders too, keeping the smallest (``offsets``).

Values of one ``group`` (the gradients one all-reduce call reads) lie side by side, in order, each
aligned: the group is placed as one buffer, live from its first member's start to its last one's end,
and its members neither take nor give a buffer in place, except in an in-place group: a group whose
values are each last read by the step that writes the matching value of a second group over it (an
all-reduce in place), which then takes the first group's place.

A step's workspace is a buffer of its own, live only during the step.
"""

from dataclasses import dataclass

from ..errors import PlanError
from . import liveness
from .offsets import Request, best_placement, most_live


def aligned(nbytes, alignment):
    return -(-nbytes // alignment) * alignment


@dataclass(frozen=True)
class Placement:
    """Where one value lives: ``nbytes`` at ``offset``, from step ``start`` through ``end``.

    ``takes_from`` is the value whose buffer this one took in place (it died at ``start``).
    """

    key: object
    label: str
    offset: int
    nbytes: int
    start: int
    end: int
    takes_from: object = None


@dataclass(frozen=True)
class Buffer:
    """One region of the arena: the values that share it, one after another."""

    placements: tuple
    offset: int
    size: int
    start: int
    end: int

    @property
    def label(self):
        return " → ".join(p.label for p in self.placements)


class MemoryPlan:
    """The arena layout of a program, with the figures to judge it by.

    ``peak_bytes``: the arena's size. ``lower_bound_bytes``: the most bytes live at any one step,
    under the same liveness, sharing and alignment; no placement can need less. ``naive_bytes``:
    one buffer per value, nothing reused.
    """

    def __init__(self, placements, steps, alignment, order, naive_bytes):
        self.placements = tuple(placements)
        self.steps = steps
        self.alignment = alignment
        self.order = order
        self.naive_bytes = naive_bytes
        self._by_key = {p.key: p for p in self.placements}
        self.buffers = _buffers(self.placements, alignment)
        self.peak_bytes = max((b.offset + b.size for b in self.buffers), default=0)
        self.lower_bound_bytes = most_live(self.buffers, steps)

    def __contains__(self, key):
        return key in self._by_key

    def __getitem__(self, key):
        return self._by_key[key]

    def __len__(self):
        return len(self.placements)

    def summary(self):
        ratio = self.naive_bytes / self.peak_bytes if self.peak_bytes else 1.0
        return (f"arena {_kib(self.peak_bytes)} (lower bound {_kib(self.lower_bound_bytes)}, "
                f"one buffer per value {_kib(self.naive_bytes)}: {ratio:.2f}x less); "
                f"{len(self.placements)} values in {len(self.buffers)} buffers over {self.steps} steps, "
                f"{self.order} placement, {self.alignment}-byte alignment")

    def __repr__(self):
        return f"<MemoryPlan: {self.summary()}>"

    def plot(self, path, title=None):
        """Draw the plan as a PNG at ``path``: time across, address up, a rectangle per buffer."""
        from .picture import draw

        return draw(self, path, title)


def _kib(nbytes):
    return f"{nbytes / 1024:.1f} KiB" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.2f} MiB"


def unallocatable(what, nbytes, error):
    """The error for a planned block (an arena, a state block) that the machine could not allocate."""
    return PlanError(f"compile: the program needs {what} of {nbytes} bytes ({nbytes / (1 << 30):.3g} GiB), which "
                     f"could not be allocated ({type(error).__name__}: {error}); use smaller shapes or dtypes")


def _buffers(placements, alignment):
    """The placements grouped by the buffer they share: each chain of in-place takers with its head."""
    by_key = {p.key: p for p in placements}
    head = {}
    for p in placements:
        chain = []
        while p.key not in head and p.takes_from is not None:
            chain.append(p)
            p = by_key[p.takes_from]
        top = head.get(p.key, p)
        for q in chain + [p]:
            head[q.key] = top
    groups = {}
    for p in placements:
        groups.setdefault(head[p.key].key, []).append(p)
    return [Buffer(tuple(sorted(g, key=lambda p: p.start)), g[0].offset, aligned(head[g[0].key].nbytes, alignment),
                   min(p.start for p in g), max(p.end for p in g)) for g in groups.values()]


def plan_memory(steps, nbytes, external=(), live_out=(), alignment=64, labels=None, shared=(), groups=(),
                in_place_groups=(), held=None):
    """The ``MemoryPlan`` of ``steps`` (``liveness.Step``) for the values not in ``external``.

    ``nbytes``: each value's size in bytes. ``external``: values with storage of their own (state,
    constants), never placed. ``live_out``: values read after the last step. ``labels``: a short
    name per value for reports and pictures. ``shared``: in-place pairs the caller has taken
    itself (an update written over its state variable), which may cost workspace. ``groups``: tuples of
    values to place side by side; a group with a member the arena does not hold (external, a view) is
    left out, each of its members placed alone. ``in_place_groups``: pairs ``(read, written)`` of such
    groups, where each value of ``written`` may take the place of its match in ``read``; where one of
    ``read`` lives on after that step (or either holds a value the arena does not), ``written`` is placed
    as a group of its own. ``held``: ``{value: step}`` for the values an asynchronous step may still read until
    that step (which waits for it), kept live until then, unless their step wrote its results in their places; a
    step's workspace (``("workspace", i)``) may be held so too.
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise PlanError(f"the alignment must be a power of two, not {alignment}")
    labels = labels or {}
    external = set(external)
    lives = liveness.intervals(steps, live_out)
    owner = liveness.owners(steps)
    planned = [k for k in lives if k not in external and owner.get(k, k) == k and k in nbytes]
    pairs = [(tuple(read), tuple(written)) for read, written in in_place_groups]
    merged = _mergeable(pairs, planned, lives, nbytes, alignment)
    lives = _held(lives, owner, held or {}, {r for read, _ in merged for r in read})
    forced = {w: r for read, written in merged for r, w in zip(read, written)}
    apart = [group for pair in pairs if pair not in merged for group in pair]
    groups, grouped = _placeable([read for read, _ in merged] + apart + [g for g in groups if not set(g) & set(forced)],
                                 planned)
    takes = _inplace(steps, lives, owner, [k for k in planned if k not in grouped and k not in forced], nbytes,
                     alignment)
    takes.update(forced)
    taken = set(shared) | set(takes.items())
    workspaces = {("workspace", i): s.workspace_with(taken) for i, s in enumerate(steps)}
    workspaces = {key: size for key, size in workspaces.items() if size}

    head = {}
    for k in planned:
        head[k] = head[takes[k]] if k in takes else k
    spans = {}
    for k in planned:
        lo, hi = spans.get(head[k], (lives[k].start, lives[k].end))
        spans[head[k]] = (min(lo, lives[k].start), max(hi, lives[k].end))
    requests = [Request(h, aligned(nbytes[h], alignment), *span) for h, span in spans.items() if h not in grouped]
    requests += [Request(("group", n), sum(aligned(nbytes[k], alignment) for k in g),
                         min(spans[k][0] for k in g), max(spans[k][1] for k in g)) for n, g in enumerate(groups)]
    until = {key: max(key[1], (held or {}).get(key, key[1])) for key in workspaces}  # a step beside holds its own
    requests += [Request(key, aligned(size, alignment), key[1], until[key]) for key, size in workspaces.items()]
    order, offsets, _ = best_placement(requests, len(steps) + 1)
    for n, g in enumerate(groups):
        at = offsets[("group", n)]
        for k in g:
            offsets[k] = at
            at += aligned(nbytes[k], alignment)

    placements = [Placement(k, labels[k] if k in labels else str(k), offsets[head[k]], nbytes[k], lives[k].start, lives[k].end,
                            takes.get(k)) for k in planned]
    placements += [Placement(key, f"workspace of {steps[key[1]].label or key[1]}", offsets[key], size, key[1],
                             until[key]) for key, size in workspaces.items()]
    naive = sum(aligned(nbytes[k], alignment) for k in planned) + sum(aligned(s, alignment) for s in workspaces.values())
    return MemoryPlan(placements, len(steps) + 1, alignment, order, naive)


def _held(lives, owner, held, replaced):
    """``lives`` with each ``held`` value's storage kept until its step, unless its place was ``replaced``."""
    lives = dict(lives)
    for value, until in held.items():
        root = owner.get(value, value)
        if root in lives and root not in replaced and until > lives[root].end:
            lives[root] = liveness.Interval(root, lives[root].start, until)
    return lives


def _mergeable(in_place_groups, planned, lives, nbytes, alignment):
    """The ``(read, written)`` pairs of groups whose written values may each take their match's place: all held
    by the arena, matched in size, each read value last read where its match is written."""
    plannable, merged, claimed = set(planned), [], set()
    for read, written in in_place_groups:
        members = set(read) | set(written)
        if (len(read) == len(written) and members <= plannable and len(members) == 2 * len(read)
                and not members & claimed
                and all(lives[r].end == lives[w].start and aligned(nbytes[r], alignment) == aligned(nbytes[w], alignment)
                        for r, w in zip(read, written))):
            merged.append((read, written))
            claimed |= members
    return merged


def _placeable(groups, planned):
    """The ``groups`` whose members are all ``planned`` and in no group before, and the values they hold."""
    plannable, placeable, grouped = set(planned), [], set()
    for group in map(tuple, groups):
        members = set(group)
        if members <= plannable and len(members) == len(group) and not members & grouped:
            placeable.append(group)
            grouped |= members
    return placeable, grouped


def read_through_view(step, value, owner):
    """Whether ``step`` also reads ``value`` through a view (``x + x.T``): then it may not write over it."""
    return any(r is not value and owner.get(r) is value for r in step.reads)


def _inplace(steps, lives, owner, planned, nbytes, alignment):
    """``{value: the value whose buffer it takes}`` for each sharing the steps allow: at each step, its pairs in the
    order of the workspace each leaves the step (``costs``), each taken where both values are in no pair taken
    before, the read one dies at the step (and is read through no view of it) and the two have one size."""
    planned = set(planned)
    takes, given = {}, set()
    for i, step in enumerate(steps):
        costs = dict(step.costs)
        viewed = {owner[r] for r in step.reads if r in owner and owner[r] is not r}  # ``read_through_view``, once a step

        def takes_place(defined, i=i):
            return defined not in takes and defined in planned and lives[defined].start == i

        def free(read, i=i, viewed=viewed):
            return (read not in given and read in planned and owner.get(read, read) is read and lives[read].end == i
                    and read not in viewed)

        def size(value):
            return aligned(nbytes[value], alignment)

        if isinstance(step.inplace, liveness.ReadBeforeWrite):
            taken = step.inplace.matched(costs, step.workspace, takes_place, free, size)
        else:
            pairs = sorted(step.inplace, key=lambda pair: costs.get(pair, step.workspace))
            taken = liveness.matched_in_order(pairs, takes_place, free, size)
        for defined, read in taken:
            takes[defined] = read
            given.add(read)
    return takes
