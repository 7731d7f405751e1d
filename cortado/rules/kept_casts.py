"""``kept_casts``: a training step's casts of its state to bfloat16 or float16, kept as state that the step updates.

A mixed-precision step keeps its weights in float32 and computes with them cast to bfloat16 (``nn``'s
``compute_in``): every weight's cast runs at the step's start, before anything else can (the GPT large step on an
H200: 340 MB read and 170 MB written, 119 us). But the cast of a weight the step updates is, in the next step, the
cast of that update, which the optimizer's kernel computes anyway at the end of this one. So the cast becomes a
state variable of its own, ``w@bfloat16``, that the step reads where it read ``cast(w)`` and updates to
``cast(update of w)``: the optimizer's kernel writes two bytes a weight more, and the step's start reads nothing.

Exact: the state holds the cast of the ``w`` the step starts from, rounded as the step would round it. A state value
written from outside (``program.state["w"] = ...``, a checkpoint loaded) writes its cast too (``Program.state``);
``program.state`` does not list the casts.

    outputs, state, updates, kept = kept_casts(outputs, state, updates, trace, inputs)  # {cast's variable: (w, dtype)}
"""

import numpy as np

from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import converted, is_narrow_float
from ..exprgraph.graph import post_order
from ..exprgraph.ops import CAST, VAR
from .engine import Rewrite, bottom_up


def kept_casts(outputs, state, updates, trace, inputs=()):
    """``(outputs, state, updates, kept)``: the step with every bfloat16 or float16 cast of an updated float32 state
    variable read from a state variable of its own, updated to the cast of the update (see the module); its name
    none of the variables read, held or fed (``inputs``) has."""
    roots = tuple(outputs) + tuple(updates.values())
    casts = [t for t in post_order(roots) if _kept(t, updates)]
    if not casts:
        return tuple(outputs), dict(state), dict(updates), {}
    taken = {v.name for v in (*post_order(roots), *inputs) if v.op is VAR} | {v.name for v in state}
    replaced, kept = {}, {}
    for t in casts:
        w = t.args[0]
        name = f"{w.name}@{t.dtype.name}"
        while name in taken:
            name += "'"
        taken.add(name)
        replaced[t] = ct.var(name, w.shape, t.dtype)
        kept[replaced[t]] = (w, t.dtype)
        trace.append(Rewrite("keep-cast-as-state", t, replaced[t]))
    memo = {}
    new = [bottom_up(r, memo, lambda original, rebuilt: replaced.get(original, rebuilt)) for r in roots]
    outputs, updated = new[:len(outputs)], dict(zip(updates, new[len(outputs):]))
    for var, (w, dtype) in kept.items():
        updated[var] = ct.cast(updated[w], dtype)
    state = {**state, **{var: converted(state[w], dtype) for var, (w, dtype) in kept.items()}}
    return tuple(outputs), state, updated, kept


def _kept(t, updates):
    """Whether ``t`` is a cast to bfloat16 or float16 of a float32 state variable that the step updates (float32 only:
    the GPU rounds a float64 through float32, the host's conversion of its first value directly)."""
    if t.op is not CAST or not is_narrow_float(t.dtype):
        return False
    w = t.args[0]
    return w.op is VAR and w in updates and w.dtype == np.float32
