"""``side_by_side``: small kernels at either end of the step, and a training step's weight casts, become one kernel
each, side by side.

An optimizer's update of a bias or a gain is an elementwise kernel over a few thousand elements, and so is a bias's
cast to bfloat16 at the step's start: each costs a launch and a round trip to memory, several microseconds, for
well under one of work, and a GPT step has about a hundred of each; a float8 step has as many kernels of one value
besides (each layer's scales from its amax histories, and the amaxes that the histories take in). Three kinds of
small fused kernels can run together in any number:

- final ones, elementwise, every result of which is one of the program's own (an update, an output): nothing in
  the step waits for them, so they run as one launch once the last of their operands exists;
- closing ones, which compute one-value results from whole reductions (an amax from a tensor's row maxima) that
  only final kernels read, of operands nothing else reads: they run as one launch before the final one;
- initial ones, elementwise or of one-value results, which read only the program's leaves (state, inputs,
  constants): their operands exist from the start, so they run as one launch before their first reader. Large
  elementwise ones join too where each of their results is read more than once or is small (a weight's cast to
  bfloat16, which the forward pass reads and the backward pass again, so it is held across the step anyway): one
  grid, at the copy rate, for the weights' dozens of launches;
- early ones, elementwise kernels like the initial ones that also read one-value results of kernels that read only
  leaves (a float8 weight's cast, at the scale its amax history gives, with its row maxima for the history: a row
  kernel, which joins no other group): one launch after the initial one.

Each kernel of a group keeps its own body, shape and threads (``Horizontal.parts``), and the blocks of one grid
are dealt out among them. No kernel of a group reads another's results (a final one's are read by nothing, a
closing one's by final ones only, an initial one reads only leaves), so grouping makes no cycle; each part reads
only its own operands, so every value is computed exactly as before.

    roots = side_by_side(roots, trace)   # after ``fusion.fuse``, for a backend that declares ``horizontal``
"""

from dataclasses import dataclass

from ..exprgraph.graph import post_order
from ..exprgraph.ops import FUSED_OP, LAYOUT, LEAF, REDUCTION
from ..exprgraph.term import make
from .engine import Rewrite, bottom_up
from .fusion import ELEMENTWISE_KERNEL, REDUCTION_KERNEL, ROW_KERNEL, inlined, rebased

MOST_ELEMENTS = 1 << 16  # a kernel's results this small are launch-bound (a 768-wide AdamW update: ~3 us of a launch)
MOST_POINTERS = 480  # a kernel's operands and results: its parameters stay within CUDA's 4 KiB of them
MOST_AXES = 2  # vectors and matrices: always stored in C order, so each part walks its elements as stored


@dataclass(frozen=True)
class Horizontal:
    """The kernel a fused term is when it is several kernels side by side (a fused term's ``kernel`` attribute): its
    body's outputs in consecutive ``parts`` of these sizes, each part one elementwise body over its own shape, or one
    body of one-value results from whole reductions, reading only its own operands."""

    parts: tuple

    def spans(self):
        """``[(first output, end)]`` of each part."""
        found, start = [], 0
        for size in self.parts:
            found.append((start, start + size))
            start += size
        return found


def _end(results, users, roots, final=frozenset()):
    """Which group the terms of one fused kernel may join: "final", "closing", "initial", "early" or None. Only an
    elementwise body whose every result has at most ``MOST_AXES`` axes may join one, a final group only where they
    are small, an early one where it reads one-value results the initial kernels make; a row kernel's only an
    early one (a float8 weight's cast: grouped, it writes nothing transposed, so a product reading the weight
    transposed copies it, ``lowering/float8_transposes``); or
    a body of one-value results reducing at most ``MOST_ELEMENTS`` elements, an initial group, or a closing one where
    only the ``final`` kernels' terms read it and nothing else reads its operands (those it keeps alive to the step's
    end: a float8 history's row maxima, or a small tensor it reduces whole)."""
    t = results[0]
    body = t.attr("outputs")
    if t.attr("again") or len(results) != len(body):
        return None
    if t.attr("kernel") == REDUCTION_KERNEL and _one_value(body):
        if all(a.op.kind == LEAF for a in t.args):
            return "initial"
        closing = all(_readers(r, users) <= final for r in results) and all(
            _read_only_by(a, set(results), users) for a in t.args if a.op.kind != LEAF)
        return "closing" if closing else None
    kind = t.attr("kernel")
    if kind not in (ELEMENTWISE_KERNEL, ROW_KERNEL) or any(o.ndim > MOST_AXES or o.size == 0 for o in body):
        return None
    small = all(o.size <= MOST_ELEMENTS for o in body)
    if kind == ELEMENTWISE_KERNEL and small and all(r in roots and not users.get(r) for r in results):
        return "final"
    start = "initial" if all(a.op.kind == LEAF for a in t.args) else \
        "early" if all(a.op.kind == LEAF or _made_from_leaves(a) for a in t.args) else None
    if start is None or (kind == ROW_KERNEL and start != "early"):
        return None
    return start if small or all(len(users.get(r, ())) > 1 or r.size <= MOST_ELEMENTS for r in results) else None


def _made_from_leaves(t):
    """Whether ``t`` is one value that a kernel reading only the program's leaves computes (a scale from an amax
    history): it exists once the initial kernels have run."""
    return t.op is FUSED_OP and t.ndim == 0 and all(a.op.kind == LEAF for a in t.args)


def _readers(t, users):
    """The terms that read ``t``, through the layout ops that only view it (a value reshaped to be concatenated)."""
    found = set()
    for u in users.get(t, ()):
        found |= _readers(u, users) if u.op.kind == LAYOUT else {u}
    return found


def _read_only_by(t, readers, users):
    """Whether nothing but ``readers`` reads ``t``, nor what ``t`` views: a closing kernel reads its operands at the
    step's end, which would keep any other value alive that long (a tensor of the backward pass, where only a
    float8 history's row maxima of it are meant)."""
    if not set(users.get(t, ())) <= readers:
        return False
    return t.op.kind != LAYOUT or t.args[0].op.kind == LEAF or _read_only_by(t.args[0], {t}, users)


def _one_value(body):
    """Whether every result of ``body`` is one value, computed from reductions of at most ``MOST_ELEMENTS`` each."""
    reductions = [t for t in post_order(body) if t.op.kind == REDUCTION]
    return all(o.ndim == 0 for o in body) and all(r.args[0].size <= MOST_ELEMENTS for r in reductions)


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
    """``roots`` with their small initial, early, closing, then final kernels grouped (see the module docstring): the
    early groups read what the initial ones made, the closing groups are found while the final kernels are apart,
    and the final groups read what the others made."""
    for end in ("initial", "early", "closing", "final"):
        roots = _grouped(tuple(roots), end, trace)
    return roots


def _grouped(roots, end, trace):
    """``roots`` with the small kernels of ``end`` grouped."""
    kernels, users = _kernels(roots)
    own = set(roots)
    final = frozenset(r for results in kernels if _end(results, users, own) == "final" for r in results
                      ) if end == "closing" else frozenset()  # what a closing kernel's readers must be
    replaced = {}
    for group in _groups([results for results in kernels if _end(results, users, own, final) == end]):
        replaced.update(_side_by_side(group, trace))
    return _substituted(roots, replaced) if replaced else roots


def _substituted(roots, mapping):
    """``roots`` with each key of ``mapping`` replaced by its value wherever it is read (``engine.substitute``, one
    walk for all of them)."""
    memo = dict(mapping)
    return tuple(bottom_up(r, memo, lambda original, rebuilt: rebuilt) for r in roots)
