"""``made_by_readers``: a row kernel's output of its row shape that is elementwise over the kernel's operands and its
other outputs (its row statistics) is computed by the kernels that read it, from those, instead of being stored.

A layer norm's forward kernel writes its normalized rows ``x̂ = (x - mean) * rstd`` (rounded to bfloat16) for the
gain's gradient, ``sum(dy * x̂)``, besides its output, its mean and its reciprocal deviation; the backward pass reads
``x`` (the residual stream) and those statistics anyway. Stored, ``x̂`` costs a write of a whole activation in the
forward pass and is made again after the memory peak (``memplan.recompute``), another write; computed by the gain's
gradient from ``x``, ``mean`` and ``rstd``, it is never stored, and that reader reads ``x`` instead of ``x̂``, as
many bytes.

An output is made by its readers where:

- it is elementwise over the kernel's operands and its other outputs (the row statistics, or centered rows that the
  layer's gradient reads), which the kernel keeps writing, by the same expressions: each reader computes the values
  the kernel did, except where the kernel computed such an output wider than it stores it (a bfloat16 sum of two
  embeddings), which the reader reads as stored: the result may round otherwise, never by more than that rounding;
- every reader is a fused kernel (a library call reads stored values) that reads it unshifted;
- a reader reads no more bytes so: the operands of the output's shape it reads instead (those it does not read
  already) are at most the output's bytes, and the statistics at most one value a row;
- each such operand is read anyway by another kernel that reads what the reader reads (a layer norm's input by its
  backward kernel, which reads the gain gradient's ``dy`` too), so it is live where the reader runs.

The kernel stops writing the output; the readers' bodies compute it where they read it.

    roots = made_by_readers(roots, trace)   # after ``fusion.fuse``, for a backend that declares ``horizontal``
"""

import math

from ..exprgraph.graph import post_order, readers_of
from ..exprgraph.ops import BROADCAST_TO, CONST, ELEMENTWISE, FUSED_OP, PAD, PARAM, parameter
from ..exprgraph.term import make
from .engine import Rewrite, bottom_up
from .fusion import ELEMENTWISE_KERNEL, REDUCTION_KERNEL, ROW_KERNEL, kernel_shape, own_parameters, row_shape
from .fusion import transposed_outputs
from .scalar_epilogues import fused_kernels, kernel_key, substituted

READERS = (ELEMENTWISE_KERNEL, REDUCTION_KERNEL, ROW_KERNEL)  # the kernels that compute an output where they read it


def _nbytes(t):
    return t.size * t.dtype.itemsize


def _sources(output, stored):
    """The parameters and the ``stored`` body outputs that body term ``output`` is elementwise over, or None where a
    reduction (or anything else) lies between."""
    found, stack, seen = [], [output], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in stored and t is not output or t.op is PARAM:
            found.append(t)
        elif t.op is CONST:
            continue
        elif t.op.kind == ELEMENTWISE or t.op is BROADCAST_TO:
            stack.extend(t.args)
        else:
            return None
    return found


def _reads_unshifted(reader, value):
    """Whether fused term ``reader`` reads operand ``value`` only as it lies (no pad of it in its body)."""
    body = reader.attr("outputs")
    places = {k for k, a in enumerate(reader.args) if a == value}
    return not any(t.op is PAD and any(p.op is PARAM and p.attr("index") in places for p in post_order(t.args))
                   for t in post_order(body))


class _Plan:
    """The outputs of one row kernel its readers make, and what each reads instead."""

    def __init__(self, key, results):
        self.key, self.results = key, {r.attr("index"): r for r in results}
        self.args, self.body = key
        self.shape = row_shape(self.body)
        self.dropped = {}  # output index -> (its body term, its readers' kernel keys)

    def result(self, index):
        """The term of output ``index`` of the kernel as it is (made here where nothing read it)."""
        found = self.results.get(index)
        if found is None:
            found = make(FUSED_OP, self.args, (self.body, index, False, ROW_KERNEL))
            self.results[index] = found
        return found

    def leaves(self, sources):
        """The values a reader reads instead of a made output: the kernel's operands and outputs it is made of."""
        index_of = {o: k for k, o in enumerate(self.body)}
        return [self.args[s.attr("index")] if s.op is PARAM else self.result(index_of[s]) for s in sources]


def _readers(result, users, kernels, taken):
    """The keys of the fused kernels reading ``result``, where every reader of it is one that may make it (not one
    whose own outputs another plan already makes, nor one made again); else None."""
    found = []
    for user in users.get(result, ()):
        if user.op is not FUSED_OP or user.attr("kernel") not in READERS or user.attr("again"):
            return None
        key = kernel_key(user)
        if key in taken or not _reads_unshifted(user, result):
            return None
        found.append(key)
    return list(dict.fromkeys(found)) or None


def _cheap(output, leaves, reader, rows):
    """Whether fused kernel ``reader`` (a key) reads at most ``output``'s bytes of values wider than one a row
    instead of it."""
    return sum(_nbytes(v) for v in leaves if v not in reader[0] and v.size > rows) <= _nbytes(output)


def _live_beside(leaves, reader, skipped, users, rows):
    """Whether each value wider than one a row among ``leaves`` that kernel ``reader`` (a key) does not read yet is
    read by another kernel reading some other operand of ``reader`` wider than one a row (not one of ``skipped``)."""
    shared = {a for a in reader[0] if a.size > rows} - skipped
    for leaf in leaves:
        if leaf in reader[0] or leaf.size <= rows:
            continue
        if not any(set(u.args) & (shared - {leaf}) for u in users.get(leaf, ())
                   if u.op is not FUSED_OP or kernel_key(u) != reader):
            return False
    return True


def _plan(key, results, users, kernels, taken, roots):
    """The ``_Plan`` of row kernel ``key``: which of its outputs its readers make (none: None)."""
    plan = _Plan(key, results)
    if plan.shape is None or results[0].attr("again"):
        return None
    rows = math.prod(plan.shape[:-1])
    leaves_of_others = set()  # outputs that outputs made by readers are made from: stored
    turned = set(transposed_outputs(plan.body))
    for index, output in enumerate(plan.body):
        result = plan.results.get(index)
        if (result is None or result in roots or output.shape != plan.shape or output in turned
                or output in plan.body[:index] or output in leaves_of_others):
            continue
        sources = _sources(output, set(plan.body) - {plan.body[k] for k in plan.dropped})
        readers = _readers(result, users, kernels, taken) if sources is not None else None
        if readers is None or key in readers:
            continue
        leaves = plan.leaves(sources)
        skipped = {result} | set(plan.results.values())
        if all(_cheap(output, leaves, r, rows) and _live_beside(leaves, r, skipped, users, rows) for r in readers):
            plan.dropped[index] = (output, readers)
            leaves_of_others |= {s for s in sources if s.op is not PARAM}
    return plan if plan.dropped else None


def _remade_writer(plan):
    """``{old result: new result}`` of the row kernel without the outputs its readers make."""
    kept = [i for i in range(len(plan.body)) if i not in plan.dropped]
    body, read = own_parameters(tuple(plan.body[i] for i in kept))
    args, kind = tuple(plan.args[i] for i in read), kernel_shape(body)
    return {plan.result(i): make(FUSED_OP, args, (body, k, False, kind)) for k, i in enumerate(kept)}


def _remade_reader(plan, key, results):
    """``{old result: new result}`` of reader kernel ``key`` computing the outputs of ``plan`` it reads from what they
    are made of."""
    inputs = list(key[0])
    index_of = {a: k for k, a in enumerate(inputs)}
    body_index = {o: k for k, o in enumerate(plan.body)}

    def param(value):
        if value not in index_of:
            index_of[value] = len(inputs)
            inputs.append(value)
        return parameter(index_of[value], value)

    made = {}
    for index, (output, _) in plan.dropped.items():
        result = plan.results[index]
        if result not in index_of:
            continue
        memo = {}
        for t in post_order([output]):
            if t.op is PARAM:
                memo[t] = param(plan.args[t.attr("index")])
            elif t in body_index and t is not output and body_index[t] not in plan.dropped:
                memo[t] = param(plan.result(body_index[t]))
        made[result] = bottom_up(output, memo, lambda original, rebuilt: rebuilt)
    memo = {p: made[inputs[p.attr("index")]] for p in post_order(key[1])
            if p.op is PARAM and inputs[p.attr("index")] in made}
    body, read = own_parameters(tuple(bottom_up(o, memo, lambda original, rebuilt: rebuilt) for o in key[1]))
    args, kind = tuple(inputs[k] for k in read), results[0].attr("kernel")
    return {r: make(FUSED_OP, args, (body, r.attr("index"), False, kind)) for r in results}


def made_by_readers(roots, trace):
    """``roots`` with each row kernel's outputs that their readers may make (the module's docstring says where)
    computed by those readers instead of stored."""
    roots = tuple(roots)
    kernels, position = fused_kernels(roots)
    users = readers_of(position)
    replaced, taken = {}, set()
    for key, results in kernels.items():
        if results[0].attr("kernel") != ROW_KERNEL or key in taken:
            continue
        plan = _plan(key, results, users, kernels, taken, set(roots))
        if plan is None:
            continue
        readers = {r for _, keys in plan.dropped.values() for r in keys}
        taken |= readers | {key}
        replaced.update(_remade_writer(plan))
        for reader in readers:
            replaced.update(_remade_reader(plan, reader, kernels[reader]))
        for index, (output, _) in plan.dropped.items():
            trace.append(Rewrite("row-value-made-by-reader", plan.results[index], output))
    return substituted(roots, replaced) if replaced else roots
