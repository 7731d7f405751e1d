"""An independent check of a memory plan: no two values live at the same time share a byte.

It reads only the placements (offset, size, first and last step of each value), not how the
planner chose them, and sweeps the steps in order keeping the live values sorted by offset. Live
values never overlap, so a new value need only be checked against its neighbours in that order:
O(n log n) for n values. The one overlap allowed is an in-place take: a value written at the
very step its donor is last read, at the donor's offset, with the donor's size.
"""

from bisect import bisect_left, insort
from heapq import heappop, heappush

from ..errors import PlanError


def _describe(p):
    return f"{p.label} (bytes {p.offset}..{p.offset + p.nbytes}, steps {p.start}..{p.end})"


def verify(plan):
    """Raise PlanError naming the first two values that overlap in both time and address."""
    by_key = {p.key: p for p in plan.placements}
    for p in plan.placements:
        if p.offset < 0 or p.offset + p.nbytes > plan.peak_bytes or p.offset % plan.alignment:
            raise PlanError(f"{_describe(p)} lies outside the {plan.peak_bytes}-byte arena or is misaligned")
        donor = by_key.get(p.takes_from)
        if p.takes_from is not None and (donor is None or (donor.offset, donor.end) != (p.offset, p.start)):
            raise PlanError(f"{_describe(p)} takes the buffer of a value that is not dying in the same place")
    values = [p for p in plan.placements if p.nbytes]
    live, ending = [], []  # (offset, index) of the live values sorted by offset; a heap of (end, offset, index)
    taken_over = set()  # donors already dropped from ``live``
    for i in sorted(range(len(values)), key=lambda i: (values[i].start, values[i].end)):
        p = values[i]
        while ending and ending[0][0] < p.start:
            _, offset, j = heappop(ending)
            if j not in taken_over:
                del live[bisect_left(live, (offset, j))]
        while True:
            position = bisect_left(live, (p.offset, -1))
            clash = next((entry for entry in live[max(position - 1, 0):position + 1] if _overlap(values[entry[1]], p)), None)
            if clash is None:
                break
            q = values[clash[1]]
            if p.takes_from is None or not (q.key is p.takes_from or q.key == p.takes_from):
                raise PlanError(f"the plan overlaps {_describe(q)} and {_describe(p)}")
            live.remove(clash)  # the donor dies as p is written over it
            taken_over.add(clash[1])
        insort(live, (p.offset, i))
        heappush(ending, (p.end, p.offset, i))
    return True


def _overlap(p, q):
    return p.offset < q.offset + q.nbytes and q.offset < p.offset + p.nbytes
