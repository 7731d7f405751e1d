"""``into_reductions``: a kernel of a few scalars computed from a reduction's result joins that reduction's epilogue.

A float8 layer's scales are reductions to one value (a history's largest magnitude, a gradient's), and each of
its products is scaled by a scalar computed from two of them (``1 / (sx sw)``, ``sx / sg``): an elementwise kernel
of its own for one value, a launch of several microseconds for nothing, and a float8 GPT step has about 150 of
them. Fusion cannot take them into the reduction's kernel: it grows a region down from its last term through what
that term reads, and such a scale is read by the reduction's other readers (the casts) before it is made.

So after fusion, an elementwise kernel whose results are all scalars, reading a result of a fused reduction to
scalars, becomes more outputs of that reduction's epilogue, computed by the lane that finishes the reduction; its
other operands become more of that kernel's. A reduction to scalars reading one joins it the same way where one
pass folds both (the same op over the same axes of values of one shape, none made from the other's results: a
float8 layer's input and weight scales from their amax histories). Each of those comes before the reduction in
post-order (nothing computed from the reduction is among them), so the merged kernel reads nothing made after it
and makes no cycle.
Every value is computed by the same expressions as before.

    roots = into_reductions(roots, trace)   # after ``fusion.fuse``, for a backend that declares ``horizontal``
"""

from ..exprgraph.graph import post_order
from ..exprgraph.ops import FUSED_OP, LEAF, PARAM, REDUCTION
from ..exprgraph.term import make
from .engine import Rewrite, bottom_up
from .fusion import ELEMENTWISE_KERNEL, REDUCTION_KERNEL, kernel_shape, rebased, shifted_read

ROUNDS = 3  # a scalar kernel reading one that joined a reduction in a round joins it in the next


def kernel_key(t):
    """Which kernel fused term ``t`` is a result of: its operands and its body."""
    return t.args, t.attr("outputs")


def _scalars_of(t, kind):
    """Whether fused term ``t`` is a result of a kernel of ``kind`` whose every result is one value."""
    return (t.op is FUSED_OP and t.attr("kernel") == kind and not t.attr("again")
            and all(o.size == 1 for o in t.attr("outputs")))


def fused_kernels(roots):
    """Each fused kernel's results (by output index) by its ``kernel_key``, and every term's post-order position."""
    order = post_order(roots)
    kernels = {}
    for t in order:
        if t.op is FUSED_OP:
            kernels.setdefault(kernel_key(t), []).append(t)
    return ({key: sorted(results, key=lambda t: t.attr("index")) for key, results in kernels.items()},
            {t: i for i, t in enumerate(order)})


def _target(t, kernels, position):
    """The key of the reduction kernel that elementwise kernel ``t`` (a result of it) may join: of the reductions
    to scalars it reads, the latest, where every other operand comes before that reduction's first result in
    post-order; else None."""
    reductions = {kernel_key(a) for a in t.args if _scalars_of(a, REDUCTION_KERNEL)}
    if not reductions:
        return None
    first = {key: min(position[r] for r in kernels[key]) for key in reductions}
    target = max(reductions, key=first.__getitem__)
    others = [a for a in t.args if a.op is not FUSED_OP or kernel_key(a) != target]
    return target if all(position[a] < first[target] or a.op.kind == LEAF for a in others) else None


def _reduced(body):
    return [t for t in post_order(body) if t.op.kind == REDUCTION]


def _alike(a, b):
    """Whether the reductions of bodies ``a`` and ``b`` reduce the same axes of values of one shape into one type
    (one pass of one kernel folds them all)."""
    reds = _reduced(a) + _reduced(b)
    return all(r.args[0].shape == reds[0].args[0].shape and r.attr("axes") == reds[0].attr("axes")
               and r.dtype == reds[0].dtype and r.op is reds[0].op for r in reds)


def _folds_target(t, target):
    """Whether a reduction of fused term ``t``'s kernel reduces a value computed from a result of kernel ``target``
    (then it cannot be folded in the same pass as ``target``'s own reductions, which make that result)."""
    read = {p.attr("index") for red in _reduced(t.attr("outputs")) for p in post_order([red.args[0]])
            if p.op is PARAM}
    return any(t.args[k].op is FUSED_OP and kernel_key(t.args[k]) == target for k in read)


def _joins(t, kernels, position, joining):
    """The key of the reduction kernel that the kernel of scalars fused term ``t`` is a result of joins (``_target``),
    or None: a kernel of reductions joins only one whose reductions it folds in the same pass (``_alike``), of
    nothing that one makes; and none joins a kernel that is joining its own. A kernel with a ``pad`` joins none: a
    pad reads its operand at other indices, so that operand stays one the kernel reads, not a value it computes."""
    if not (_scalars_of(t, ELEMENTWISE_KERNEL) or _scalars_of(t, REDUCTION_KERNEL)):
        return None
    if any(shifted_read(b) for b in post_order(t.attr("outputs"))):
        return None
    target = _target(t, kernels, position)
    if target is None or any(kernel_key(r) == target for r in joining.get(kernel_key(t), ())):
        return None
    if t.attr("kernel") == REDUCTION_KERNEL and (not _alike(t.attr("outputs"), target[1]) or _folds_target(t, target)):
        return None
    return target


def _merged(key, results, joining, trace):
    """``{old result: new result}``: reduction kernel ``key`` (its ``results``) and the elementwise kernels of
    ``joining`` (each the list of its results) as one fused reduction kernel, their bodies after its own; an output
    the body already computes (a scale that two joined kernels both pass on) is that output, not a second one."""
    inputs, body = list(key[0]), list(key[1])
    index_of = {a: i for i, a in enumerate(inputs)}
    own = {r: body[r.attr("index")] for r in results}  # the reduction's values, as its epilogue has them
    position = {output: k for k, output in reversed(list(enumerate(body)))}  # each output's first index
    placed = []  # per joined kernel, the body index of each of its outputs
    for joined in joining:
        outputs = rebased(joined[0], inputs, index_of, own)
        for output in outputs:
            if output not in position:
                position[output] = len(body)
                body.append(output)
        placed.append([position[output] for output in outputs])
    body = tuple(body)

    def result(index):
        return make(FUSED_OP, inputs, (body, index, False, REDUCTION_KERNEL))

    replaced = {r: result(r.attr("index")) for r in results}
    for joined, indices in zip(joining, placed):
        for t in joined:
            replaced[t] = result(indices[t.attr("index")])
            trace.append(Rewrite("scalar-into-reduction", t, replaced[t]))
    return replaced


class Joining:
    """Pairs of kernels to be joined, accepted one at a time, each only where the kernel it makes would wait for
    none of its own results, counting the pairs accepted before it as one kernel each: two joins each fine alone
    may make two kernels wait for each other."""

    def __init__(self):
        self.reads = {}  # a result of a kernel accepted into a pair -> the operands of the whole pair

    def accept(self, first, second):
        """Whether kernels ``first`` and ``second`` (each ``(results, operands)``) may be one; if so, they are."""
        results = set(first[0]) | set(second[0])
        operands = tuple(dict.fromkeys(first[1] + second[1]))
        seen, stack = set(), list(operands)
        while stack:
            t = stack.pop()
            if t in results:
                return False
            if t not in seen:
                seen.add(t)
                stack.extend(t.args)
                stack.extend(self.reads.get(t, ()))
        self.reads.update({t: operands for t in results})
        return True


def appended(key, results, guest, guest_results, kind):
    """``{old term: new term}``: kernel ``key`` (its ``results``) computing fused term ``guest``'s body too, after its
    own, as a kernel of ``kind``; ``guest_results``: the terms of ``guest``'s kernel, in order."""
    inputs, index_of = list(key[0]), {a: i for i, a in enumerate(key[0])}
    body = tuple(key[1]) + tuple(rebased(guest, inputs, index_of))
    kind = kernel_shape(body) if kind is None else kind
    replaced = {t: make(FUSED_OP, inputs, (body, t.attr("index"), False, kind)) for t in results}
    replaced.update({t: make(FUSED_OP, inputs, (body, len(key[1]) + k, False, kind))
                     for k, t in enumerate(guest_results)})
    return replaced


def substituted(roots, replaced):
    """``roots`` with each key of ``replaced`` replaced by its value, whose own operands are replaced in turn."""
    return substitution(roots, replaced)[0]


def substitution(roots, replaced):
    """``(roots, made)``: ``substituted``'s roots, and every term below them mapped to what it became (itself where
    nothing it reads was replaced), for what refers to terms of the old graph (``memplan.recompute``'s copies)."""
    memo = {}

    def finish(original, rebuilt):
        new = replaced.get(original)
        if new is None:
            return rebuilt
        args = tuple(bottom_up(a, memo, finish) for a in new.args)
        return new if all(a is b for a, b in zip(args, new.args)) else new.rebuild(args)

    return tuple(bottom_up(r, memo, finish) for r in roots), memo


def into_reductions(roots, trace):
    """``roots`` with each kernel of scalars that may join the reduction it reads (see the module docstring and
    ``_joins``) merged into it."""
    roots = tuple(roots)
    for _ in range(ROUNDS):
        kernels, position = fused_kernels(roots)
        joining = {}
        for results in kernels.values():
            target = _joins(results[0], kernels, position, joining)
            if target is not None:
                joining.setdefault(target, []).append(results)
        if not joining:
            break
        replaced = {}
        for key, joined in joining.items():
            replaced.update(_merged(key, kernels[key], joined, trace))
        roots = substituted(roots, replaced)
    return _unread_dropped(roots)


def _unread_dropped(roots):
    """``roots`` with the outputs that nothing reads dropped from each kernel of scalars (a value a joined kernel read
    from the reduction's, which the merged body computes itself)."""
    kernels, _ = fused_kernels(roots)
    replaced = {}
    for (inputs, body), results in kernels.items():
        if len(results) < len(body) and _scalars_of(results[0], REDUCTION_KERNEL):
            kept = tuple(body[r.attr("index")] for r in results)
            replaced.update({r: make(FUSED_OP, inputs, (kept, k, r.attr("again"), r.attr("kernel")))
                             for k, r in enumerate(results)})
    return substituted(roots, replaced) if replaced else roots
