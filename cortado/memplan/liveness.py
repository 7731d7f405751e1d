"""Live intervals over a schedule of steps, and the in-place sharing they allow.

The planner sees a program as a list of ``Step``s, each writing some values and reading others.
A value is live from the step that writes it to the last step that reads it, or that reads a view
of it: a view (a transpose, say) has no storage of its own and keeps the value it views alive.
Values in ``live_out`` are read after the last step (the program's outputs).
"""

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Step:
    """One step of a program, as the planner sees it.

    ``defines``: the values it writes; ``reads``: the values it reads. ``view_of``: when set, the
    step writes nothing and its one defined value is a view of this one. ``inplace``: pairs
    ``(defined, read)`` where the step may write ``defined`` over ``read`` (an elementwise op
    reads each element before it writes it), or a ``ReadBeforeWrite`` that stands for them (a fused region's,
    whose pairs may be as many as its results times its operands). ``workspace``: scratch bytes needed during
    the step.
    ``within``: pairs ``(part, whole)`` of defined values where the step writes ``part`` inside ``whole``'s
    storage (a slice of it), so that ``part`` owns none.
    """

    defines: tuple
    reads: tuple = ()
    view_of: object = None
    inplace: tuple = ()
    workspace: int = 0
    costs: tuple = ()
    label: str = ""
    within: tuple = ()

    def workspace_with(self, taken):
        """The workspace when the in-place pairs in ``taken`` are taken."""
        return max([self.workspace] + [cost for pair, cost in self.costs if pair in taken])


@dataclass(frozen=True)
class Interval:
    """A value's storage lifetime: written at step ``start``, last read at step ``end``."""

    key: object
    start: int
    end: int


def owners(steps):
    """``{value: the value whose storage it uses}``: itself, or the owner of what it views."""
    owner = {}
    for step in steps:
        for key in step.defines:
            owner[key] = owner.get(step.view_of, step.view_of) if step.view_of is not None else key
        owner.update(step.within)
    return owner


def intervals(steps, live_out=()):
    """``{owner: Interval}`` for every value that owns storage, read through any of its views.

    A value read before any step writes it (a state variable, a constant) starts at step 0.
    Values in ``live_out`` stay live through step ``len(steps)``, which reads the results.
    """
    owner = owners(steps)
    start, end = {}, {}
    for i, step in enumerate(steps):
        for key in step.defines:
            root = owner[key]
            start.setdefault(root, i)
            end.setdefault(root, i)
        for key in step.reads:
            root = owner.get(key, key)
            start.setdefault(root, 0)
            end[root] = i
    for key in live_out:
        root = owner.get(key, key)
        start.setdefault(root, 0)
        end[root] = len(steps)
    return {root: Interval(root, start[root], end[root]) for root in start}


@dataclass(frozen=True)
class ReadBeforeWrite:
    """The in-place pairs of a step that writes each of its results at one place in its body and reads each operand for
    the last time at one place (a fused region): ``defined[k]`` may take the place of ``reads[m]`` where the two are of
    one kind (``defined_kinds[k] == read_kinds[m]``: a shape and dtype) and the body reads ``reads[m]`` for the last
    time before it writes ``defined[k]`` (``last_read[m] < written[k]``), or as it writes it, element for element
    (``(k, m)`` in ``at_write``). Iterating gives the pairs, ``defined`` by ``defined``, each one's ``reads`` in order;
    ``in`` asks for one; ``matched`` takes them as the planner does without listing them, which for a region of n
    results and n operands would be n * n pairs."""

    defined: tuple
    written: tuple
    defined_kinds: tuple
    reads: tuple
    last_read: tuple
    read_kinds: tuple
    at_write: frozenset = frozenset()

    def renamed(self, defined, reads):
        """These pairs with ``defined[k]`` for each defined value ``k`` and ``reads[r]`` for each read ``r`` (a region's
        pairs found over its body's positions, given its kernel's values)."""
        return ReadBeforeWrite(tuple(defined[k] for k in self.defined), self.written, self.defined_kinds,
                               tuple(reads[r] for r in self.reads), self.last_read, self.read_kinds, self.at_write)

    def candidates(self, k):
        """The positions ``m`` of the reads that ``defined[k]`` may take the place of, in order."""
        kind, written = self.defined_kinds[k], self.written[k]
        return [m for m, (read_at, read_kind) in enumerate(zip(self.last_read, self.read_kinds))
                if read_kind == kind and (read_at < written or (k, m) in self.at_write)]

    def __iter__(self):
        for k, defined in enumerate(self.defined):
            for m in self.candidates(k):
                yield defined, self.reads[m]

    @cached_property
    def _positions(self):
        defined = {d: k for k, d in enumerate(self.defined)}
        reads = {}
        for m, r in enumerate(self.reads):
            reads.setdefault(r, []).append(m)
        return defined, reads

    def __contains__(self, pair):
        defined, read = pair
        positions, reads = self._positions
        k = positions.get(defined)
        return k is not None and any(
            self.read_kinds[m] == self.defined_kinds[k] and (self.last_read[m] < self.written[k] or (k, m) in self.at_write)
            for m in reads.get(read, ()))

    def matched(self, costs, cost, takes_place, free, size):
        """The pairs the planner takes, in order: the pairs sorted by their cost (``costs``: ``{pair: cost}``, ``cost``
        for any other; a stable sort), each taken where its defined value ``takes_place``, its read is ``free`` and
        neither is in a pair taken before, and the two are of one ``size``. Each defined value's pairs are consecutive
        in that order where they cost the same: then a defined value takes the first read free of its candidates,
        found in logarithmic time (``_Earliest``); else the pairs are listed and sorted (``matched_in_order``)."""
        own = {}
        for pair, value in costs.items():
            if pair in self:
                own.setdefault(pair[0], []).append(value)
        counted = {self._positions[0][d]: values for d, values in own.items()}
        for k, values in counted.items():
            if len(set(values)) > 1 or len(values) != len(self.candidates(k)):
                return matched_in_order(sorted(self, key=lambda pair: costs.get(pair, cost)), takes_place, free, size)
        order = sorted(range(len(self.defined)), key=lambda k: counted[k][0] if k in counted else cost)
        groups = {}  # (kind, size) -> the free reads of that kind and size: their positions m, in order
        for m, read in enumerate(self.reads):
            if free(read):
                groups.setdefault((self.read_kinds[m], size(read)), []).append(m)
        earliest = {key: _Earliest([self.last_read[m] for m in ms]) for key, ms in groups.items()}
        place = {m: (key, n) for key, ms in groups.items() for n, m in enumerate(ms)}
        at_write = {}
        for k, m in self.at_write:
            at_write.setdefault(k, []).append(m)
        _, positions = self._positions
        taken, defined_taken, given = [], set(), set()
        for k in order:
            defined = self.defined[k]
            key = (self.defined_kinds[k], size(defined)) if takes_place(defined) else None
            if key not in groups or defined in defined_taken:
                continue
            n = earliest[key].first_below(self.written[k])
            best = groups[key][n] if n is not None else None
            for m in at_write.get(k, ()):  # (read as it is written: not below its bound)
                if m in place and place[m][0] == key and self.reads[m] not in given and (best is None or m < best):
                    best = m
            if best is None:
                continue
            read = self.reads[best]
            taken.append((defined, read))
            defined_taken.add(defined)
            given.add(read)
            for m in positions[read]:  # the read given, at each place it holds among the reads
                if m in place:
                    earliest[place[m][0]].remove(place[m][1])
        return taken


def matched_in_order(pairs, takes_place, free, size):
    """The pairs taken from ``pairs`` in turn: each whose defined value ``takes_place``, whose read is ``free``, where
    neither is in a pair taken before and the two are of one ``size``."""
    taken, defined_taken, given = [], set(), set()
    for defined, read in pairs:
        if defined in defined_taken or read in given or not takes_place(defined) or not free(read):
            continue
        if size(defined) != size(read):
            continue
        taken.append((defined, read))
        defined_taken.add(defined)
        given.add(read)
    return taken


class _Earliest:
    """Numbers at positions 0, 1, ...; ``first_below(bound)``: the first position whose number is below ``bound``, and
    ``remove(n)`` takes position ``n``'s out, each in logarithmic time (a tree of minima)."""

    def __init__(self, numbers):
        self.leaves = 1
        while self.leaves < len(numbers):
            self.leaves *= 2
        self.tree = [_NONE] * (2 * self.leaves)
        self.tree[self.leaves:self.leaves + len(numbers)] = numbers
        for p in range(self.leaves - 1, 0, -1):
            self.tree[p] = min(self.tree[2 * p], self.tree[2 * p + 1])

    def first_below(self, bound):
        if self.tree[1] >= bound:
            return None
        p = 1
        while p < self.leaves:
            p = 2 * p if self.tree[2 * p] < bound else 2 * p + 1
        return p - self.leaves

    def remove(self, n):
        p = n + self.leaves
        self.tree[p] = _NONE
        while p > 1:
            p //= 2
            self.tree[p] = min(self.tree[2 * p], self.tree[2 * p + 1])


_NONE = float("inf")
