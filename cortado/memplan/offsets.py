"""Offsets for buffers with known lifetimes: greedy by size, best fit, as XLA's heap simulator.

Buffers are placed one at a time in a chosen order (largest first, or longest-lived first); each
goes into the smallest free gap of the address range that is free for its whole lifetime, or on
top of everything live then when no gap fits. The two orders suit different programs, so
``best_placement`` tries both and keeps the smaller arena.

First, though, it tries the cheapest order of all: by start time, which is an allocator's sweep
over the schedule (best fit among the gaps that dead buffers left), O(n log n). When that meets
the lower bound (the most bytes live at any one step), no order can do better and the greedy
orders are skipped. They are skipped too on programs of more than ``GREEDY_LIMIT`` buffers when
the sweep is within 1% of the bound: on a training step every forward value overlaps every other
until its backward use, the gaps over a long lifetime number in the hundreds, and the greedy
orders grow faster than linearly (measured: 3.4 s of a 6 s compile of 38k terms), for a gain
that was 0.08% of the arena where it was measured.

Finding the free gaps is the costly part: a buffer of a deep network's forward pass overlaps in
time every other one until its backward use, so listing the overlapping buffers would make
planning quadratic. Instead a segment tree over time keeps, at each node, the address ranges of
buffers that span the node and the union of all ranges within it; the taken ranges over any time
span are the union of O(log n) such sets, each of them usually a few ranges long.
"""

import heapq
import itertools
from bisect import bisect_left, bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """A buffer to place: ``size`` bytes (already aligned), live from step ``start`` to ``end``."""

    key: object
    size: int
    start: int
    end: int


def _add_range(flat, lo, hi):
    """Add ``[lo, hi)`` to ``flat``, a sorted list of disjoint ranges ``[a0, b0, a1, b1, ...]``."""
    i = bisect_left(flat, lo)
    j = bisect_right(flat, hi)
    flat[i:j] = [lo] * (i % 2 == 0) + [hi] * (j % 2 == 0)


class _Occupancy:
    """Which address ranges are taken during which steps."""

    def __init__(self, steps):
        self.leaves = 1
        while self.leaves < steps:
            self.leaves *= 2
        self.spanning = [[] for _ in range(2 * self.leaves)]  # ranges of buffers covering the node
        self.within = [[] for _ in range(2 * self.leaves)]  # union of ranges anywhere in the node's span

    def _nodes(self, start, end):
        """The nodes exactly covering steps ``start..end``, and all their ancestors."""
        cover, lo, hi = [], start + self.leaves, end + self.leaves + 1
        while lo < hi:
            if lo & 1:
                cover.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                cover.append(hi)
            lo //= 2
            hi //= 2
        ancestors = set()
        for node in cover:
            node //= 2
            while node and node not in ancestors:
                ancestors.add(node)
                node //= 2
        return cover, ancestors

    def taken(self, start, end):
        """The address ranges taken at some step in ``start..end``, as a flat sorted list."""
        cover, ancestors = self._nodes(start, end)
        sets = [self.within[n] for n in cover] + [self.spanning[n] for n in ancestors]
        sets = [s for s in sets if s]
        if len(sets) <= 1:
            return sets[0] if sets else []
        ranges = sorted(itertools.chain.from_iterable(zip(s[::2], s[1::2]) for s in sets))
        union = [ranges[0][0], ranges[0][1]]
        for lo, hi in ranges:
            if lo > union[-1]:
                union += (lo, hi)
            elif hi > union[-1]:
                union[-1] = hi
        return union

    def take(self, start, end, lo, hi):
        cover, ancestors = self._nodes(start, end)
        for node in cover:
            _add_range(self.spanning[node], lo, hi)
            _add_range(self.within[node], lo, hi)
        for node in ancestors:
            _add_range(self.within[node], lo, hi)


def _best_fit(taken, size):
    """The offset of the smallest gap of ``taken`` that holds ``size`` bytes, else the top."""
    best, best_gap = None, None
    previous_end = 0
    for k in range(0, len(taken), 2):
        gap = taken[k] - previous_end
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = previous_end, gap
        previous_end = taken[k + 1]
    return previous_end if best is None else best


ORDERS = {
    "size-first": lambda r: (-r.size, -(r.end - r.start), r.start),
    "lifetime-first": lambda r: (-(r.end - r.start), -r.size, r.start),
}


def place(requests, steps, order):
    """``({key: offset}, peak)`` for ``requests`` placed greedily in ``order`` (a key of ORDERS)."""
    occupancy = _Occupancy(max(steps, 1))
    offsets, peak = {}, 0
    for r in sorted(requests, key=ORDERS[order]):
        if r.size == 0:
            offsets[r.key] = 0
            continue
        offset = _best_fit(occupancy.taken(r.start, r.end), r.size)
        occupancy.take(r.start, r.end, offset, offset + r.size)
        offsets[r.key] = offset
        peak = max(peak, offset + r.size)
    return offsets, peak


def live_bytes(buffers, steps):
    """The bytes live at each step ``0 .. steps``: ``buffers`` have ``size``, ``start`` and ``end``."""
    delta = [0] * (steps + 2)
    for b in buffers:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    return list(itertools.accumulate(delta[:-1]))


def most_live(buffers, steps):
    """The most bytes live at any one step."""
    return max(live_bytes(buffers, steps), default=0)


def sweep(requests):
    """``({key: offset}, peak)``: requests in order of start, each in the best gap dead ones left."""
    offsets, peak, top = {}, 0, 0
    free = []  # flat sorted ranges below ``top`` that no live buffer holds
    ending = []  # heap of (end, offset, size) of the live buffers
    for r in sorted(requests, key=lambda r: (r.start, -r.size)):
        while ending and ending[0][0] < r.start:
            _, lo, size = heapq.heappop(ending)
            _add_range(free, lo, lo + size)
            if free[-1] == top:  # the gap reaches the top: the top comes down instead
                top = free[-2]
                del free[-2:]
        if r.size == 0:
            offsets[r.key] = 0
            continue
        best = None
        for k in range(0, len(free), 2):
            gap = free[k + 1] - free[k]
            if gap >= r.size and (best is None or gap < free[best + 1] - free[best]):
                best = k
        if best is None:
            offset, top = top, top + r.size
        else:
            offset = free[best]
            if free[best + 1] == offset + r.size:
                del free[best:best + 2]
            else:
                free[best] = offset + r.size
        offsets[r.key] = offset
        peak = max(peak, top)
        heapq.heappush(ending, (r.end, offset, r.size))
    return offsets, peak


GREEDY_LIMIT = 2000  # buffers; beyond it the greedy orders run only where the sweep is 1% above the bound


def best_placement(requests, steps):
    """``(order, {key: offset}, peak)``: the sweep, or the best of it and both greedy orders."""
    offsets, peak = sweep(requests)
    tried = [("time-first", offsets, peak)]
    bound = most_live(requests, steps)
    if peak > bound and (len(requests) <= GREEDY_LIMIT or peak > 1.01 * bound):
        tried += [(order, *place(requests, steps, order)) for order in ORDERS]
    return min(tried, key=lambda t: t[2])
