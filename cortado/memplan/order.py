"""The order of a program's steps: the depth-first order it was built in, or one that keeps less alive.

A depth-first schedule of a training step runs the backward pass as the first update reached
asks for it; the updates of the other parameters come last, and each keeps alive what it reads
(an activation, a gradient) long after the step that could have been its last reader. XLA's
list scheduler answers this greedily, and so does ``memory_order``: of the steps whose inputs
are ready, run the one that frees the most bytes net of what it allocates, the earliest in the
depth-first order among equals. The greedy order is kept only where it keeps fewer bytes live at
its worst step than the depth-first order does.

``after`` adds orderings that data alone does not impose: an update computed in place over its
state variable must run after every other step that reads the variable.

``overlapped`` then rearranges the order for asynchronous steps (an all-reduce on a stream of its
own): each is issued as soon as what it reads exists, and whatever waits for one runs last, so
that the communication runs beside the rest of the step; ``joins`` says where each is waited for.
``beside_joins`` says the same of the steps a backend runs beside the others in the order given (the updates that
only write state), and ``affordable`` keeps those whose waiting costs no memory.
"""

import heapq

from ..errors import PlanError
from .liveness import intervals, owners
from .offsets import Request, live_bytes, most_live


def memory_order(steps, nbytes, external=(), live_out=(), after=()):
    """Step indices in the order to run them: the greedy order, or the given one where that keeps every ``after``
    and no more bytes live at its worst step.

    ``nbytes``: the size of each value the program places (views and ``external`` values cost
    nothing). ``after``: pairs ``(i, j)``, step ``i`` before step ``j``, on top of the data flow.
    """
    given = list(range(len(steps)))
    greedy = _greedy(steps, nbytes, set(external), set(live_out), after)
    if greedy == given or any(i > j for i, j in after):  # the given order breaks a constraint: not a choice
        return greedy
    costs = [_peak([steps[i] for i in order], nbytes, external, live_out) for order in (greedy, given)]
    return greedy if costs[0] < costs[1] else given


def _peak(steps, nbytes, external, live_out):
    """The most bytes live at one step of ``steps`` run in this order (no sharing in place)."""
    owner = owners(steps)
    external = set(external)
    lives = intervals(steps, live_out)
    return most_live([Request(k, nbytes.get(k, 0), v.start, v.end) for k, v in lives.items()
                      if k not in external and owner.get(k, k) == k], len(steps) + 1)


def _waits(steps, after=()):
    """For each step, the steps it must wait for: those defining what it reads, and ``after``'s."""
    defined_at = {key: i for i, s in enumerate(steps) for key in s.defines}
    before = [set() for _ in steps]
    for j, step in enumerate(steps):
        for key in step.reads:
            i = defined_at.get(key)
            if i is not None and i != j:
                before[j].add(i)
    for i, j in after:
        if i != j:
            before[j].add(i)
    return before


def overlapped(order, steps, asynchronous, after=()):
    """``order`` (step indices) with the steps of ``asynchronous`` issued in that sequence (every rank of a job
    must issue its all-reduces in one order), each as soon as the last step it waits for has run, and every step
    that waits for one, directly or not (through data or ``after``), moved to the end: those waiting for earlier
    ones first (the updates of the gradients averaged first run while the last average is still on its way), in
    their order among equals."""
    sequence = list(asynchronous)
    asynchronous = set(sequence)
    if not asynchronous:
        return list(order)
    before = _waits(steps, list(after) + list(zip(sequence, sequence[1:])))
    late = set()
    for j in order:
        if any(i in late or (i in asynchronous and j not in asynchronous) for i in before[j]):
            late.add(j)
    early, placed = [], set()
    waiting = [j for j in order if j in asynchronous and j not in late]

    def issue_ready():
        ready = [j for j in waiting if before[j] <= placed]
        while ready:  # one issued may let the next in the sequence go
            for j in ready:
                waiting.remove(j)
                early.append(j)
                placed.add(j)
            ready = [j for j in waiting if before[j] <= placed]

    issue_ready()
    for j in order:
        if j in late or j in asynchronous:
            continue
        early.append(j)
        placed.add(j)
        issue_ready()
    issued = {j: k for k, j in enumerate(early) if j in asynchronous}
    awaited = {}  # late step -> the position of the last asynchronous step it waits for, directly or not
    for j in order:
        if j in late:
            awaited[j] = max([issued.get(i, -1) for i in before[j]] + [awaited.get(i, -1) for i in before[j]])
    arranged = early + sorted((j for j in order if j in late), key=awaited.__getitem__)
    if sorted(arranged) != sorted(order):
        raise PlanError("the asynchronous steps' sequence contradicts what they wait for")
    return arranged


def joins(steps, asynchronous):
    """``{i: j}`` for each asynchronous step ``i``: ``j`` is the first step after it that reads what it defines
    (directly or through a view, whose own step reads nothing), which must wait for it; ``len(steps)`` for none."""
    owner = owners(steps)
    found = {}
    for i in asynchronous:
        mine = set(steps[i].defines)
        found[i] = next((j for j in range(i + 1, len(steps)) if steps[j].view_of is None
                         and any(owner.get(key, key) in mine for key in steps[j].reads)), len(steps))
    return found


def beside_joins(steps, beside, sinks):
    """``{i: j}`` for each step ``i`` of ``beside`` (steps run on a stream beside the program's, in turn, each after
    what the program's stream queued before it): ``j`` is the step that waits for it, until which what it reads and
    its workspace stay where they are: the first later step that reads what it defines or writes over a state
    variable it reads (``sinks``: ``{value: the state variable written in its place}``), else ``len(steps)``, the
    step's end."""
    owner = owners(steps)
    found = {}
    for i in beside:
        mine = set(steps[i].defines) | {sinks[d] for d in steps[i].defines if d in sinks}
        reads = {owner.get(key, key) for key in steps[i].reads}
        found[i] = next((j for j in range(i + 1, len(steps)) if steps[j].view_of is None and (
            any(owner.get(key, key) in mine for key in steps[j].reads)
            or any(sinks.get(key) in reads for key in steps[j].defines))), len(steps))
    return found


def affordable(steps, nbytes, external, live_out, joins):
    """The entries ``i: j`` of ``joins`` (steps beside the others and where each is waited for, ``beside_joins``)
    whose hold adds nothing to the most bytes live at any step: what each reads, and its workspace, kept until its
    join. Taken in order, each where the bytes live with it and the ones taken before stay within the most the
    program has live without them; the others run in order."""
    if not joins:
        return {}
    owner = owners(steps)
    external = set(external)
    lives = intervals(steps, live_out)
    sized = {k: v for k, v in lives.items() if k not in external and owner.get(k, k) == k and k in nbytes}
    curve = live_bytes([Request(k, nbytes[k], v.start, v.end) for k, v in sized.items()]
                       + [Request(i, s.workspace, i, i) for i, s in enumerate(steps) if s.workspace], len(steps) + 1)
    most, ends, taken = max(curve, default=0), {k: v.end for k, v in sized.items()}, {}
    for i, j in sorted(joins.items()):
        extra = [0] * len(curve)
        grown = {}
        for root in {owner.get(key, key) for key in steps[i].reads} & set(ends):
            for t in range(ends[root] + 1, j + 1):
                extra[t] += nbytes[root]
            grown[root] = max(ends[root], j)
        for t in range(i + 1, j + 1):
            extra[t] += steps[i].workspace
        if all(c + e <= most for c, e in zip(curve, extra)):
            curve = [c + e for c, e in zip(curve, extra)]
            ends.update(grown)
            taken[i] = j
    return taken


def _greedy(steps, nbytes, external, live_out, after):
    owner = owners(steps)
    live_out = {owner.get(key, key) for key in live_out}
    before = _waits(steps, after)  # the steps each must wait for
    readers = {}  # storage owner -> the steps that read it or a view of it
    for j, step in enumerate(steps):
        for key in step.reads:
            root = owner.get(key, key)
            if root in nbytes and root not in external:
                readers.setdefault(root, set()).add(j)
    waiting = [len(b) for b in before]
    unblocks = [[] for _ in steps]
    for j, b in enumerate(before):
        for i in b:
            unblocks[i].append(j)
    pending = {root: set(rs) for root, rs in readers.items()}
    reads_of = [{owner.get(key, key) for key in s.reads if owner.get(key, key) in pending} for s in steps]
    allocates = [sum(nbytes.get(key, 0) for key in s.defines if s.view_of is None and key not in external
                     and key not in dict(s.within))
                 for s in steps]

    def gain(j):
        freed = sum(nbytes[root] for root in reads_of[j] if pending[root] == {j} and root not in live_out)
        return freed - allocates[j]

    version = [0] * len(steps)
    heap = [(-gain(j), j, 0) for j in range(len(steps)) if not waiting[j]]
    heapq.heapify(heap)
    order, done = [], set()
    while heap:
        _, j, seen = heapq.heappop(heap)
        if seen != version[j] or j in done:
            continue
        order.append(j)
        done.add(j)
        for root in reads_of[j]:
            pending[root].discard(j)
            if len(pending[root]) == 1:  # its last reader now frees it: worth more
                (last,) = pending[root]
                if not waiting[last]:
                    version[last] += 1
                    heapq.heappush(heap, (-gain(last), last, version[last]))
        for k in unblocks[j]:
            waiting[k] -= 1
            if not waiting[k]:
                heapq.heappush(heap, (-gain(k), k, version[k]))
    if len(order) != len(steps):
        raise PlanError("the ordering constraints of the steps form a cycle")
    return order
