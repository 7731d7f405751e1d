"""What ``compile`` asks of a backend and what a ``Program`` asks of the executor it builds.

A backend is one package that makes a ``Backend`` and registers it by name (``backends.register``);
the compiler knows no backend but through these methods, so a new one (or a new lowering target
inside one) touches neither the compiler nor the IR. The defaults say what a backend that needs
nothing special does: no lowering, no options, feeds copied into the arena, outputs copied out.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from ..rules.engine import bottom_up
from ..rules.fusion import KernelShapes


@dataclass(frozen=True)
class PlannedStep:
    """What a backend may read of a step the compiler rewrote, scheduled and planned, to propose other variants of
    its lowering (``Backend.alternatives``): the memory ``plan``, and the ``rewrites`` of each stage of the rules
    (``{stage: Trace}``, as ``explain()`` lists them)."""

    plan: object
    rewrites: Mapping

    def made_by(self, stage, rule):
        """``{term of the planned step: the term that ``rule`` of ``stage`` rewrote}``: what the rule made, followed
        through the stages after it (a composite below it spelled out in primitives, a term fused into a region found
        as the region's fused term)."""
        made = [r for r in self.rewrites.get(stage, ()) if r.rule == rule]
        spelled = {r.before: r.after for r in self.rewrites.get("primitives", ())}  # before: over spelled operands
        fused = {r.before: r.after for r in self.rewrites.get("fusion", ())}  # before: the term fusion was given
        in_primitives, in_regions = {}, {}
        found = {}
        for r in made:  # (interned terms: rebuilt over rewritten operands, they are each stage's own)
            term = bottom_up(r.after, in_primitives, lambda term, rebuilt: spelled.get(rebuilt, rebuilt))
            found[bottom_up(term, in_regions, lambda term, rebuilt: fused.get(term, rebuilt))] = r.before
        return found


class Backend:
    """One target of ``compile``. Subclasses set ``name`` and ``alignment`` and implement ``steps``
    and ``executor``; the rest they override where they need to."""

    name = None
    alignment = 64  # bytes: where each buffer of the arena starts
    options = {}  # the keyword options of ``compile`` it takes, with their defaults
    feeds_in_place = False  # its executor reads feeds where the caller keeps them: the arena holds none
    lowering = None  # a rewriter: ``lowering.run(roots, trace, variant)`` gives the lowered roots
    kernel_shapes = KernelShapes()  # the fused kernels it takes (``rules.fusion``): fusion makes no other
    collectives = False  # its all-reduces reach the other ranks of a job (``cortado.distributed``); else a world of one
    keeps_casts = False  # a step reads its updated weights' narrow casts from state it updates (``rules.kept_casts``)
    gathers_raise = True  # a gather may stop its call at an index outside the axis (``IndexRangeError``); False: it clamps

    def require(self):
        """Raise a BackendError saying what to install where this machine lacks what the backend needs."""

    def steps(self, kernels, options):
        """One ``memplan.Step`` per kernel: what it reads, which values are views, what it may write in
        place, the workspace it needs."""
        raise NotImplementedError

    def direct_outputs(self, kernels, steps, outputs, sinks, options):
        """The outputs its kernels write straight into the program's output buffers, which the arena
        then leaves out."""
        return []

    def beside(self, kernels, steps, sinks, options):
        """The kernels (indices into the ordered ``kernels``) its executor runs beside the others, on a stream of
        their own, each after what comes before it; what each reads stays where it is until a later step waits for
        it (``memplan.beside_joins``). ``sinks``: ``{update value: the state variable it is written over}``. None by
        default."""
        return []

    def after_fusion(self, roots, trace):
        """``roots`` with the backend's own rewrites of its fused kernels made (recording them in ``trace``): what
        only its calls need of the kernels that make their operands. None by default."""
        return roots

    def after_recomputation(self, roots, copies, trace):
        """``(roots, copies)`` with the backend's own rewrites of the planned kernels, once recomputation is settled
        (recording them in ``trace``): ``copies`` (``{copy: its readers}``, which the compiler orders) over the terms
        of the rewritten graph. None by default."""
        return roots, copies

    def alternatives(self, planned):
        """Other ``variant``s of the lowering worth planning besides the one ``planned`` (a ``PlannedStep``); the
        compiler keeps the plan with the smallest arena."""
        return []

    def executor(self, kernels, steps, plan, signature, outputs, updates, sinks, beside, **options):
        """The ``Executor`` running this plan; ``beside``: ``{kernel run beside the others: the step that waits for
        it}`` (``memplan.beside_joins`` of what ``beside`` chose)."""
        raise NotImplementedError


class Executor:
    """A step, built over one arena: run it, read and replace its state.

    ``state`` maps each state variable to its live array; ``direct_outputs`` are the outputs it
    writes straight into their buffers; ``choices`` maps the terms it computes with a library call
    chosen among candidates to that call (whose ``describe()`` says which it is, for ``explain``);
    ``beside``: the indices of the kernels it runs beside the others (``Backend.beside``); ``launched``: the
    indices of the kernels that do work each step (a load, a view, or a value another kernel writes in place does
    none), those ``profile`` times; None where an executor does not say, counted as every kernel.
    """

    state = {}
    direct_outputs = frozenset()
    choices = {}
    beside = frozenset()
    launched = None

    def layout(self, t):
        """How value ``t``'s elements lie in memory where that is not C order (``"channels-last"``), for ``explain``."""
        return ""

    def run(self, feeds):
        """The outputs for ``feeds`` (``{name: array}``, already checked), after which the updates are written."""
        raise NotImplementedError

    def write_state(self, var, value):
        """Replace the value of state variable ``var`` (``value`` already checked)."""
        raise NotImplementedError

    @property
    def device_bytes(self):
        """Every byte the program holds on a device (0 for the host)."""
        return 0

    def profile(self, feeds):
        """``[(kernel label, milliseconds)]`` for one step on ``feeds``, which updates the state as ``run`` does."""
        raise NotImplementedError
