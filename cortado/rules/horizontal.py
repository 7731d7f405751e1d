"""``side_by_side``: small elementwise kernels at either end of the step, and a training step's weight casts, become
one kernel each, side by side.

An optimizer's update of a bias or a gain is an elementwise kernel over a few thousand elements, and so is a bias's
cast to bfloat16 at the step's start: each costs a launch and a round trip to memory, several microseconds, for
well under one of work, and a GPT step has about a hundred of each. Two kinds of small fused elementwise kernels
can run together in any number:

- final ones, every result of which is one of the program's own (an update, an output): nothing in the step waits
  for them, so they run as one launch once the last of their operands exists;
- initial ones, which read only the program's leaves (state, inputs, constants): their operands exist from the
  start, so they run as one launch before their first reader. Large ones join too where each of their results is
  read more than once (a weight's cast to bfloat16, which the forward pass reads and the backward pass again, so
  it is held across the step anyway): one grid, at the copy rate, for the weights' dozens of launches.

Each kernel of a group keeps its own body, shape and threads (``Horizontal.parts``), and the blocks of one grid
are dealt out among them. No kernel of a group reads another's results (a final one's are read by nothing, an
initial one reads only leaves), so grouping makes no cycle; each part reads only its own operands, so every value
is computed exactly as before.

    roots = side_by_side(roots, trace)   # after ``fusion.fuse``, for a backend that declares ``horizontal``
"""

from dataclasses import dataclass

from ..exprgraph.graph import post_order
from ..exprgraph.ops import FUSED_OP, LEAF
from ..exprgraph.term import make
from .engine import Rewrite, bottom_up
from .fusion import ELEMENTWISE_KERNEL, inlined, rebased

MOST_ELEMENTS = 1 << 16  # a kernel's results this small are launch-bound (a 768-wide AdamW update: ~3 us of a launch)
MOST_POINTERS = 480  # a kernel's operands and results: its parameters stay within CUDA's 4 KiB of them
MOST_AXES = 2  # vectors and matrices: always stored in C order, so each part walks its elements as stored


@dataclass(frozen=True)
class Horizontal:
    """The kernel a fused term is when it is several elementwise kernels side by side (a fused term's ``kernel``
    attribute): its body's outputs in consecutive ``parts`` of these sizes, each part one elementwise body over its
    own shape, reading only its own operands."""

    parts: tuple

    def spans(self):
        """``[(first output, end)]`` of each part."""
        found, start = [], 0
        for size in self.parts:
            found.append((start, start + size))
            start += size
        return found


def _end(results, users, roots):
    """Which group the terms of one fused kernel may join: "final", "initial" or None. Only an elementwise body whose
    every result has at most ``MOST_AXES`` axes may join one, a final group only where they are small."""
    t = results[0]
    if t.attr("kernel") != ELEMENTWISE_KERNEL or t.attr("again"):
        return None
    body = t.attr("outputs")
    if len(results) != len(body) or any(o.ndim > MOST_AXES or o.size == 0 for o in body):
        return None
    small = all(o.size <= MOST_ELEMENTS for o in body)
    if small and all(r in roots and not users.get(r) for r in results):
        return "final"
    if not all(a.op.kind == LEAF for a in t.args):
        return None
    return "initial" if small or all(len(users.get(r, ())) > 1 for r in results) else None


def _kernels(roots):
    """Each fused kernel of the graph as the tuple of its result terms, in schedule order, and every term's users."""
    users, kernels = {}, {}
    for t in post_order(roots):
        for a in set(t.args):
            users.setdefault(a, []).append(t)
        if t.op is FUSED_OP:
            kernels.setdefault((t.args, t.attr("outputs")), []).append(t)
    return [tuple(sorted(terms, key=lambda t: t.attr("index"))) for terms in kernels.values()], users


def _groups(candidates):
    """The candidates in groups of two or more whose operands and results stay within ``MOST_POINTERS``."""
    groups, current, operands, results = [], [], set(), 0
    for results_of in candidates:
        own = {a for a in results_of[0].args if not inlined(a)}
        if current and len(operands | own) + results + len(results_of) > MOST_POINTERS:
            groups.append(current)
            current, operands, results = [], set(), 0
        current.append(results_of)
        operands |= own
        results += len(results_of)
    groups.append(current)
    return [g for g in groups if len(g) > 1]


def _side_by_side(group, trace):
    """``{old result: new result}``: the kernels of ``group`` as one fused term of a ``Horizontal`` kernel."""
    inputs, index_of, body, parts = [], {}, [], []
    for results in group:
        body += rebased(results[0], inputs, index_of)
        parts.append(len(results))
    kernel, body = Horizontal(tuple(parts)), tuple(body)
    replaced = {}
    for index, old in enumerate(r for results in group for r in results):
        replaced[old] = make(FUSED_OP, inputs, (body, index, False, kernel))
        trace.append(Rewrite("fuse-side-by-side", old, replaced[old]))
    return replaced


def side_by_side(roots, trace):
    """``roots`` with their small initial, then their small final elementwise kernels grouped (see the module
    docstring): the final groups read what the initial ones made."""
    for end in ("initial", "final"):
        roots = _grouped(tuple(roots), end, trace)
    return roots


def _grouped(roots, end, trace):
    """``roots`` with the small kernels of ``end`` grouped."""
    kernels, users = _kernels(roots)
    final = set(roots)
    replaced = {}
    for group in _groups([results for results in kernels if _end(results, users, final) == end]):
        replaced.update(_side_by_side(group, trace))
    return _substituted(roots, replaced) if replaced else roots


def _substituted(roots, mapping):
    """``roots`` with each key of ``mapping`` replaced by its value wherever it is read (``engine.substitute``, one
    walk for all of them)."""
    memo = dict(mapping)
    return tuple(bottom_up(r, memo, lambda original, rebuilt: rebuilt) for r in roots)
