"""``fuse``: maximal regions of elementwise work become one fused term each, one kernel to a backend.

A region grows down from a root (an elementwise op or a reduction) through the
terms it reads, taking:

- an elementwise op or ``broadcast_to`` whose every user is already in the region: it becomes
  internal, and is never stored;
- an elementwise op of the root's shape that is also used outside the region, when every such
  use comes later in the schedule than the root: it becomes an extra output, produced by the same
  kernel (an Adam update writes the parameter and both moments in one pass this way);
- one reduction (``sum``, ``mean``, ``max``, ``logsumexp``) of the root's shape used only inside
  the region: the region becomes a fused reduction, the ops below it its prologue (which must be
  internal) and the ops above it its epilogue;
- or, for a root of row shape ``(..., n)``, any number of reductions of that shape over its last
  axis that keep it (``mean(x, axis=-1, keepdims=True)``), and elementwise ops of the reduced shape
  ``(..., 1)``: the region becomes a row kernel, which reduces each row as often as it needs and
  then computes its outputs of either shape (a layer norm forward, its input's gradient, a
  softmax). Any member may then be an output, as an extra one is. A root of one value a row
  (``(..., 1)``) grows a row kernel too where it reduces rows twice or more (a cross-entropy's
  logsumexp less its label's logit), its rows those its first reduction reduces;
- a term that only spreads narrower values over its shape (``spread``: each row's label compared
  with every place), what only such terms read where it reads nothing wider, a small value
  computed from leaves that only wider elementwise terms read (a gain cast to bfloat16), and a
  term computed from one narrower value of its shape (``widened``: a bfloat16 activation's float32
  form times a scale, gelu's float32 intermediates) join every region that reads them, computed in
  each, never stored; a region's outside uses of what such a term reads count the other regions
  computing it, so that value is stored exactly when one of them needs it;
- in a region with no reduction, a ``pad`` (or crop) of a value computed outside it: a read of that
  value at shifted indices, the padding value outside them. ``concatenate`` is a sum of pads, and
  the gradient of a slice (of ``split(qkv, 3)``) is one too: the region reads each part once and
  writes the whole, with no zeros stored between.

With ``sibling_columns`` (a backend whose column reductions take several sums a pass), two regions reducing
the columns of values of one shape over the same rows, reading a value in common and neither reading
the other, become one (a layer norm's gain and bias gradients, both sums over its output's
gradient): one kernel reads what they share once.

The schedule condition is what keeps regions acyclic: a term that comes after the root cannot
feed the region. A region of one term stays as it was, unless the backend declares ``one_op`` kernels:
a backend that generates every kernel (the GPU's) gets a fused term of one op for it too, so it builds
kernels from fused bodies only. What a backend takes it declares in ``KernelShapes``, and each fused
term says which kernel it is (``kernel_shape``), so no backend works out again what fusion decided.
Constants of one value are inlined into the body; every other operand becomes a parameter ``in0,
in1, ...`` of the body.

    fused, trace = fuse([loss, *updates])   # same values, fewer terms
"""

import heapq
import itertools
from dataclasses import dataclass

from ..exprgraph.graph import post_order
from ..exprgraph.ops import (
    BROADCAST_TO, CONST, ELEMENTWISE, FUSED_OP, LOG_SOFTMAX, LOGSUMEXP, MAX, MEAN, PAD, PARAM, REDUCTION, RESHAPE,
    SOFTMAX, SUM, TRANSPOSE, parameter,
)
from ..exprgraph.term import HashedTuple, make
from .engine import Rewrite, Trace, bottom_up

# The kernels a fused term is, as fusion decides and every backend reads (``Op`` attribute ``kernel``): elementwise
# work, a fused reduction (a prologue, one reduction, an epilogue; or sibling column reductions), a row kernel, or
# elementwise work that also writes results transposed (a backend's own rewrite adds such results, to row kernels
# too: the GPU's float8 products read their operands only with the contracted axis innermost, ``transposed_outputs``),
# and such work that also sums the columns of what it reads (the GPU's float8 gradient cast with its bias gradient)
ELEMENTWISE_KERNEL, REDUCTION_KERNEL, ROW_KERNEL, TRANSPOSED_KERNEL = "elementwise", "reduction", "row", "transposed"
TRANSPOSED_SUMS_KERNEL = "transposed sums"


@dataclass(frozen=True)
class KernelShapes:
    """The kernels a backend's fused regions may be, as it declares them and fusion makes them: with ``one_op``, a
    region of one op alone too (a backend that builds every kernel from a fused body); with ``sibling_columns``, one
    reduction kernel summing the columns of two values of one shape in one pass; with ``rows``, row kernels; with
    ``horizontal``, small kernels at either end of the step as one kernel each, side by side (``rules.horizontal``)."""

    one_op: bool = False
    sibling_columns: bool = False
    rows: bool = True
    horizontal: bool = False


AXIS_REDUCTIONS = frozenset({SUM, MEAN, MAX, LOGSUMEXP})
ROW_REDUCTIONS = frozenset({SOFTMAX, LOG_SOFTMAX})  # reductions that keep the shape: roots only
ROW_KERNEL_REDUCTIONS = frozenset({SUM, MEAN, MAX})  # what a row kernel reduces each row with


def _elementwise(term):
    return term.op.kind == ELEMENTWISE or term.op is BROADCAST_TO


def inlined(term):
    """A constant of one value, which a body carries itself instead of reading it."""
    return term.op is CONST and (term.ndim == 0 or term.attr("value").scalar is not None)


def spread(term):
    """Whether elementwise ``term`` only spreads narrower values over its shape (each row's label compared with every
    place of the row): cheaper to compute again in each kernel that reads it than to store once and read back."""
    return term.op.kind == ELEMENTWISE and term.ndim > 0 and all(inlined(a) or a.size < term.size for a in term.args)


def shifted_read(term):
    """Whether ``term`` is a ``pad`` a region may take: of a value it reads as an operand (not an inlined constant)."""
    return term.op is PAD and term.args[0].op is not CONST


def widened(order, users, roots):
    """The elementwise terms of ``order`` (a post-order; ``users``: each term's readers) best computed again in each
    region that reads them (``_Fuser._spreading``): those computed from one value of their shape narrower than
    themselves, and from values at most ``1 / NARROW`` their size (scalars, a row's statistics, a bias), as a
    bfloat16 activation's float32 forms and gelu's intermediates are; and the narrower ones of that value read only
    by such terms (gelu's comparison of its argument with 0). Storing one writes and reads back more bytes than
    reading that value again. A result as narrow as that value (gelu's, rounded to bfloat16) is stored: computing it
    again in each reader (gelu's exponential and divisions) would cost more than reading it back."""
    source = {}  # each elementwise term computed from one value of its shape -> that value
    for t in order:
        if t.op.kind != ELEMENTWISE or t.ndim == 0 or t in roots:
            continue
        wide = {source.get(a, a) for a in t.args if not inlined(a) and a.size == t.size}
        narrow = all(inlined(a) or a.size == t.size or a.size * NARROW <= t.size for a in t.args)
        if len(wide) == 1 and narrow:
            (value,) = wide
            if value.shape == t.shape:
                source[t] = value
    found = {t for t, value in source.items() if value.dtype.itemsize < t.dtype.itemsize}
    for t in reversed(order):  # a term's readers before it
        if t in source and source[t].dtype.itemsize > t.dtype.itemsize and users[t] and all(u in found for u in users[t]):
            found.add(t)
    return found


NARROW = 8  # a value read beside a ``widened`` term's source is at most this fraction of its size


def row_reduction(term, shape):
    """Whether ``term`` reduces the last axis of a value of row ``shape``, keeping it: a row kernel's reduction."""
    return (term.op in ROW_KERNEL_REDUCTIONS and term.args[0].shape == shape and len(shape) >= 1
            and shape[-1] > 1 and term.attr("axes") == (len(shape) - 1,) and term.shape == shape[:-1] + (1,))


def row_shape(body):
    """The row shape ``(..., n)`` of a row kernel's body: every reduction reduces the last axis of a value of that
    shape, keeping it, and there are several or an output of the row shape; else None."""
    reductions = [t for t in post_order(body) if t.op.kind == REDUCTION]
    if not reductions:
        return None
    shape = reductions[0].args[0].shape
    if not all(row_reduction(t, shape) for t in reductions):
        return None
    return shape if len(reductions) > 1 or any(written_rows(t).shape == shape for t in body) else None


def transposed_outputs(body):
    """The outputs of an elementwise or row kernel's ``body`` written transposed: ``transpose(x)`` of a matrix ``x``
    that is a body term of the kernel's shape (its row shape) with its leading axes merged (``reshape``), or of that
    shape itself."""
    return [o for o in body if o.op is TRANSPOSE]


def untransposed(output):
    """The body term a transposed output transposes, before its leading axes are merged into rows; any other output
    itself."""
    if output.op is not TRANSPOSE:
        return output
    matrix = output.args[0]
    return matrix.args[0] if matrix.op is RESHAPE else matrix


def padded_rows(output):
    """The body term a row kernel's ``output`` writes with constants after each of its rows (a ``pad`` of the last
    axis, at its end only: a weight gradient's input with its columns of ones, ``lowering/bias_gradient_ones.py``);
    None for any other output."""
    if output.op is not PAD or output.args[0].op is PARAM:  # (a pad of an operand reads it at shifted indices)
        return None
    widths = output.attr("pad_width")
    if any(w != (0, 0) for w in widths[:-1]) or widths[-1][0] != 0 or widths[-1][1] <= 0:
        return None
    return output.args[0]


def written_rows(output):
    """The body term whose rows an output writes: the term it pads (``padded_rows``) or transposes
    (``untransposed``), else itself."""
    padded = padded_rows(output)
    return untransposed(output) if padded is None else padded


def kernel_shape(body):
    """Which kernel computes the fused ``body`` (a tuple of output terms): a row kernel, a fused reduction or an
    elementwise kernel. Decided here, once, for fusion's regions and for the regions others make of them (a region
    made again after the peak, one of fewer outputs), and read by the backends from the fused term. A row kernel
    may write results transposed too; elementwise work that does is a kernel of its own."""
    if row_shape(body) is not None:
        return ROW_KERNEL
    if transposed_outputs(body):
        return TRANSPOSED_KERNEL
    return REDUCTION_KERNEL if any(t.op.kind == REDUCTION for t in post_order(body)) else ELEMENTWISE_KERNEL


class _Region:
    """The terms of one region as it grows from ``root``; ``rows``: whether it may become a row kernel."""

    def __init__(self, root, rows=False):
        self.root = root
        self.rows = rows
        # a row kernel's rows: the root's shape, or, from a root of one value a row, the first reduction's operand's
        self.row_shape = root.shape if rows and root.shape[-1] > 1 else None
        self.row_reductions = 0
        self.members = {root}
        self.prologue = set()  # members at or below the reduction
        self.reduction = None
        if root.op in AXIS_REDUCTIONS or root.op in ROW_REDUCTIONS:
            self.reduction = root
            self.prologue.add(root)
        self.extras = []
        self.pads = 0
        self.copied = set()  # members computed here that other regions may compute too (``spread``)
        self.siblings = False  # two column reductions merged (``_Fuser.siblings``)

    def merged(self, earlier):
        """This column reduction and sibling ``earlier`` as one region, rooted at this one's root; ``earlier``'s root
        and extras become extras."""
        merged = _Region(self.root)
        merged.members = earlier.members | self.members
        merged.prologue = earlier.prologue | self.prologue
        merged.reduction = self.reduction
        merged.extras = self.extras + [earlier.root] + earlier.extras
        merged.copied = earlier.copied | self.copied
        merged.siblings = True
        return merged

    def operands(self):
        """What the region reads from outside it."""
        return {a for m in self.members for a in m.args if a not in self.members and not inlined(a)}

    def column_key(self):
        """What a sibling must share with this region to merge with it (the reduced values' shape, the axes, the
        reduction's shape and type, the outputs' shape), or None where this is no column reduction."""
        red = self.reduction
        if red is None or self.rows or self.row_reductions or self.pads or red.op not in ROW_KERNEL_REDUCTIONS:
            return None
        if red.args[0].ndim - 1 in red.attr("axes") or red.size <= 1 or red.shape != self.root.shape:
            return None
        if any(t.shape != self.root.shape for t in self.extras):
            return None
        return red.args[0].shape, red.attr("axes"), red.shape, red.dtype


class _Fuser:
    def __init__(self, roots, shapes):
        self.order = post_order(roots)
        self.position = {t: i for i, t in enumerate(self.order)}
        self.users = {t: [] for t in self.order}
        for t in self.order:
            for a in set(t.args):
                self.users[a].append(t)
        self.end = len(self.order)  # the program's own use of its roots comes after every term
        self.roots = set(roots)
        self.alone = shapes.one_op  # a region of one term is one too
        self.siblings = shapes.sibling_columns  # column reductions of one shape reading a value in common merge
        self.rows = shapes.rows  # a region may become a row kernel
        self.region_of = {}
        self.spreading = self._spreading()

    def _spreading(self):
        """The terms computed in each region that reads them, as cheap to compute again as to read back, never
        stored: the ``spread`` terms; the elementwise terms read only by them that read nothing wider than themselves
        (a label's place wrapped and clamped into its row); the elementwise terms of leaves read only by wider
        elementwise terms (a layer norm's gain cast to bfloat16: a kernel of its own costs a launch); and the
        ``widened`` ones."""
        found = set()
        for term in reversed(self.order):  # a term's users before it
            users = self.users[term]
            if term.op.kind != ELEMENTWISE or term.ndim == 0 or term in self.roots or not users:
                continue
            feeds_spread = all(u in found for u in users) and all(inlined(a) or a.size <= term.size for a in term.args)
            of_leaves = all(a.op.kind == "leaf" for a in term.args) and all(_elementwise(u) and u.size > term.size
                                                                              for u in users)
            if spread(term) or feeds_spread or of_leaves:
                found.add(term)
        return found | widened(self.order, self.users, self.roots)

    def _outside_uses(self, term, region):
        """Schedule positions of the uses of ``term`` outside ``region``: where a member reading it is computed in
        every region that reads that member (``_spreading``), those regions' uses too."""
        uses, pending, seen = [], list(self.users[term]), set()
        while pending:
            user = pending.pop()
            if user in seen:
                continue
            seen.add(user)
            if user not in region.members:
                uses.append(self.position[user])
            elif user in self.spreading:
                pending += self.users[user]
        return uses + [self.end] * (term in self.roots)

    def _admit(self, term, region):
        """How ``term`` may join ``region``: "internal", "extra", "reduction", "row reduction" (of a row kernel),
        "copied" (a ``spread`` term, computed in every region that reads it) or None."""
        if term.op.kind == "leaf":
            return None
        if term in self.spreading and not any(shifted_read(u) for u in self.users[term] if u in region.members):
            return "copied"
        if term in self.region_of:
            return None
        if any(shifted_read(u) for u in self.users[term] if u in region.members):
            return None  # a pad reads its operand at other indices: an operand of the region's kernel
        below = any(u in region.prologue for u in self.users[term])
        outside = self._outside_uses(term, region)
        row_shape = region.row_shape
        if region.rows and row_shape is None and term.op in ROW_KERNEL_REDUCTIONS and term.shape == region.root.shape:
            row_shape = term.args[0].shape  # a root of one value a row: the rows are those its first reduction reduces
        per_row = region.rows and row_shape is not None and term.shape == row_shape[:-1] + (1,)
        reduces = region.reduction is not None or region.row_reductions
        if region.rows and row_shape is not None and row_reduction(term, row_shape):
            ok = not region.pads and (not outside or min(outside) > self.position[region.root])
            return "row reduction" if ok else None
        if term.op in AXIS_REDUCTIONS:  # one of a row kernel's is a row reduction, above
            ok = not region.rows and region.reduction is None and not region.pads and not below and not outside \
                and term.shape == region.root.shape
            return "reduction" if ok else None
        if shifted_read(term) and (reduces or term.shape != region.root.shape):
            return None
        if not (_elementwise(term) or shifted_read(term)):
            return None
        if not outside:
            return "internal"
        later = min(outside) > self.position[region.root]
        full = term.shape == region.root.shape or region.row_reductions and term.shape == region.row_shape
        if not below and later and (full or per_row) and term.op is not BROADCAST_TO:
            return "extra"
        return None

    def grow(self, root):
        """The region grown from ``root``: a row kernel's where the root has a row shape, or one value a row, and
        its rows are reduced (two reductions or more for one value a row: one is a fused reduction), else an
        elementwise region or a fused reduction."""
        if root.op.kind == ELEMENTWISE and root.ndim:
            region = self._grown(_Region(root, rows=self.rows))
            if region.row_reductions > (root.shape[-1] == 1):
                return region
        return self._grown(_Region(root))

    def _grown(self, region):
        root = region.root
        pending = []  # candidates, latest first: when one is decided, all its users in the region are known
        seen = set()

        def push_args(member):
            if shifted_read(member):
                region.pads += 1
                return
            for a in member.args:
                if a not in seen and a not in region.members:
                    seen.add(a)
                    heapq.heappush(pending, (-self.position[a], id(a), a))

        push_args(root)
        while pending:
            _, _, term = heapq.heappop(pending)
            how = self._admit(term, region)
            if how is None:
                continue
            if how == "reduction":
                region.reduction = term
            if how == "reduction" or any(u in region.prologue for u in self.users[term]):
                region.prologue.add(term)
            if how == "row reduction":
                region.row_reductions += 1
                region.row_shape = region.row_shape or term.args[0].shape
                if self._outside_uses(term, region):
                    region.extras.append(term)
            if how == "extra":
                region.extras.append(term)
            if how == "copied":
                region.copied.add(term)
            region.members.add(term)
            push_args(term)
        return region

    def regions(self):
        found, copied = [], set()
        for term in reversed(self.order):
            fusible = (term.op.kind == ELEMENTWISE or term.op in AXIS_REDUCTIONS or term.op in ROW_REDUCTIONS
                       or shifted_read(term))
            if term in self.region_of or not fusible:  # a broadcast is no root: alone it is a free view
                continue
            if term in copied and all(term in self.region_of[u].copied if u in self.region_of else u in copied
                                      for u in self.users[term]):
                continue  # computed in each region that reads it: a region of its own would store it for nobody
            region = self.grow(term)
            if len(region.members) > 1 or self.alone:
                for m in region.members - region.copied:
                    self.region_of[m] = region
                copied |= region.copied
                found.append(region)
        return self._merged_siblings(found) if self.siblings else found

    def _merged_siblings(self, found):
        """``found`` with each pair of sibling column reductions (``_siblings``) merged into one region, rooted at
        the later root."""
        kept, waiting = [], {}
        for region in sorted(found, key=lambda r: self.position[r.root]):
            key = region.column_key()
            partner = next((other for other in waiting.get(key, ()) if self._siblings(other, region)), None)
            if partner is None:
                kept.append(region)
                if key is not None:
                    waiting.setdefault(key, []).append(region)
                continue
            waiting[key].remove(partner)
            kept.remove(partner)
            merged = region.merged(partner)
            for m in merged.members - merged.copied:
                self.region_of[m] = merged
            kept.append(merged)
        return kept

    def _siblings(self, first, second):
        """Whether column reductions ``first`` and ``second`` (rooted later) may be one kernel: they read a value in
        common, neither reads what the other computes, and nothing outside reads ``first``'s outputs before
        ``second``'s root, where the merged kernel runs."""
        if not first.operands() & second.operands():
            return False
        own = [(first.members - first.copied, second), (second.members - second.copied, first)]
        if any(a in members for members, other in own for m in other.members for a in m.args):
            return False
        after = self.position[second.root]
        return all(use > after for t in [first.root, *first.extras] for use in self._outside_uses(t, first))


def _body(region, position):
    """``(inputs, outputs)``: the region's operands and its outputs as terms over parameters."""
    members = sorted(region.members, key=position.__getitem__)
    inputs, body = [], {}
    for m in members:
        args = []
        for a in m.args:
            if a in region.members:
                args.append(body[a])
            elif inlined(a):
                args.append(a)
            else:
                if a not in body:
                    body[a] = parameter(len(inputs), a)
                    inputs.append(a)
                args.append(body[a])
        body[m] = m.rebuild(args)
    produced = [region.root] + sorted(region.extras, key=position.__getitem__)
    return inputs, produced, tuple(body[t] for t in produced)


def own_parameters(body):
    """``(body, read)``: ``body`` with the parameters it reads numbered from 0, and their old numbers, in order (a part
    of a fused body, as a body over its own operands)."""
    read = sorted({t.attr("index") for t in post_order(body) if t.op is PARAM})
    memo = {t: parameter(read.index(t.attr("index")), t) for t in post_order(body) if t.op is PARAM}
    return tuple(bottom_up(t, memo, lambda original, rebuilt: rebuilt) for t in body), read


def rebased(kernel, inputs, index_of, known=None):
    """The body of fused term ``kernel`` over the parameters of a kernel reading ``inputs`` (``index_of``: each one's
    place), its own operands appended to both, in order, where they are not there yet; an operand in ``known``
    becomes the body term given there instead (a value the joining kernel computes itself). For the passes that join
    fused kernels (``horizontal``, ``scalar_epilogues``)."""
    known = known or {}
    for operand in kernel.args:
        if operand not in known and operand not in index_of:
            index_of[operand] = len(inputs)
            inputs.append(operand)
    renamed = {}
    for p in post_order(kernel.attr("outputs")):
        if p.op is PARAM:
            operand = kernel.args[p.attr("index")]
            renamed[p] = known[operand] if operand in known else parameter(index_of[operand], operand)
    return [bottom_up(o, renamed, lambda original, rebuilt: rebuilt) for o in kernel.attr("outputs")]


def fuse(roots, trace=None, shapes=KernelShapes()):
    """``(new_roots, trace)``: ``roots`` with every fusible region replaced by fused terms, of the kernel ``shapes``
    the backend takes."""
    roots = tuple(roots)
    trace = Trace() if trace is None else trace
    fuser = _Fuser(roots, shapes)
    replaced = {}
    fuser.regions()
    for term in fuser.order:
        region = fuser.region_of.get(term)
        if region is not None:
            if term is region.root:
                _replace_region(region, fuser.position, replaced, trace)
            continue
        if term.args:
            args = tuple(replaced.get(a, a) for a in term.args)
            if any(new is not old for new, old in zip(args, term.args)):
                replaced[term] = term.rebuild(args)
    return tuple(replaced.get(r, r) for r in roots), trace


def _replace_region(region, position, replaced, trace):
    inputs, produced, outputs = _body(region, position)
    inputs, outputs = HashedTuple(replaced.get(a, a) for a in inputs), HashedTuple(outputs)  # every result holds them
    rule = "fuse-rows" if region.row_reductions else "fuse-sibling-reductions" if region.siblings \
        else "fuse-reduction" if region.reduction is not None else "fuse-elementwise"
    if len(region.members) == 1:
        rule = "one-op-kernel"
    kernel = kernel_shape(outputs)  # once a region: it walks the whole body
    for index, term in zip(itertools.count(), produced):
        fused = make(FUSED_OP, inputs, (outputs, index, False, kernel))
        replaced[term] = fused
        trace.append(Rewrite(rule, term, fused))
