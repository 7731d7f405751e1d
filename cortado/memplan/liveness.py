"""Live intervals over a schedule of steps, and the in-place sharing they allow.

The planner sees a program as a list of ``Step``s, each writing some values and reading others.
A value is live from the step that writes it to the last step that reads it, or that reads a view
of it: a view (a transpose, say) has no storage of its own and keeps the value it views alive.
Values in ``live_out`` are read after the last step (the program's outputs).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One step of a program, as the planner sees it.

    ``defines``: the values it writes; ``reads``: the values it reads. ``view_of``: when set, the
    step writes nothing and its one defined value is a view of this one. ``inplace``: pairs
    ``(defined, read)`` where the step may write ``defined`` over ``read`` (an elementwise op
    reads each element before it writes it). ``workspace``: scratch bytes needed during the step.
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
