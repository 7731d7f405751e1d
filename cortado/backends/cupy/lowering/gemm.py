"""The GEMM target: the rules that build ``gemm`` terms (the op, cuBLASLt's form of a product, is
``gemm_op.py``'s; ``calls.cublaslt`` runs it). ``rules`` turn ``matmul`` into cuBLASLt's form
and then fold what surrounds it into the one call: a transpose of an operand into the operation
flags, a scalar factor into ``alpha``, an added term of the product's shape into ``beta`` and
``c``, an added row into the bias epilogue, a ``relu`` or ``gelu`` of it all into that epilogue,
and a product times ``gelu_grad(z)`` (gelu's backward) into the dgelu epilogue, which reads ``z``.
A product used more than once is not folded into its users (each would compute it again).
``finish`` then makes the gemm whose gelu and whose own value are both read (a training step's
``gelu(z)``, with ``z`` kept for gelu's backward) write both, makes gelu's backward a plain product again
where a late gelu of that ``z`` reads it too (over bfloat16 and float16: one kernel then computes both),
and takes bias gradients from the gemms that can compute them on the side; ``alternatives`` proposes
planning again without those of these that a gemm holds at the memory peak.
"""

import math

from ....exprgraph import constructors as ct
from ....exprgraph.dtypes import is_narrow_float
from ....exprgraph.graph import post_order, users
from ....exprgraph.ops import BROADCAST_TO, CONST, GELU, GELU_GRAD, RESHAPE, SUM, TRANSPOSE
from ....memplan import live_bytes
from ....rules.engine import Rewrite, Rule, RuleSet, bottom_up
from .gemm_op import GELU_EPILOGUE_DTYPES, GEMM, GEMM_DTYPES, gemm, gemm_parts


def _batch_strideable(shape, batch):
    """Whether an operand's batch dimensions are all of ``batch`` or all broadcast: one batch stride."""
    own = shape[:-2]
    return own == batch or all(d == 1 for d in own)


def _matmul_to_gemm(b):
    x, y = b["_a"], b["_b"]
    if x.dtype != y.dtype or x.dtype not in GEMM_DTYPES or 0 in x.shape + y.shape:
        return None
    if x.ndim == 1 or y.ndim == 1:  # a vector is a one-row or one-column matrix
        rows = ct.reshape(x, (1, x.shape[0])) if x.ndim == 1 else x
        cols = ct.reshape(y, (y.shape[0], 1)) if y.ndim == 1 else y
        if rows.ndim > 2 or cols.ndim > 2:
            return None
        return ct.reshape(gemm(rows, cols), b.term.shape)
    if y.ndim == 2 and x.ndim > 2 and x.op not in (TRANSPOSE, BROADCAST_TO):
        # the batch folded into the rows: one matrix product, whose row epilogues (a bias, dgelu) apply (a permuted
        # or broadcast batch stays a strided batch, which cuBLASLt reads in place and a reshape would copy)
        rows = ct.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))
        return ct.reshape(gemm(rows, y), b.term.shape)
    batch = b.term.shape[:-2]
    if not (_batch_strideable(x.shape, batch) and _batch_strideable(y.shape, batch)):
        return None
    return gemm(x, y)


def _swaps_last_two(t):
    if t.op is not TRANSPOSE:
        return False
    axes = t.attr("axes")
    n = len(axes)
    return n >= 2 and axes == tuple(range(n - 2)) + (n - 1, n - 2)


def _fold_transposes(b):
    parts = gemm_parts(b.term)
    changed = False
    for side in ("a", "b"):
        if _swaps_last_two(parts[side]):
            parts[side] = parts[side].args[0]
            parts[f"transpose_{side}"] = not parts[f"transpose_{side}"]
            changed = True
    return gemm(**parts) if changed else None


def _foldable(b, g):
    """A gemm this rule may rewrite: nothing else uses it (and it is a product, not a second result)."""
    return g.op is GEMM and g.attr("output") == 0 and not b.shared(g)


def _product(b, t):
    """``(gemm, wrap)``: the gemm ``t`` is, itself or with its rows reshaped (a batch folded into them), that this
    rule may rewrite, and the function giving a rebuilt gemm ``t``'s shape again; ``(None, None)`` if none."""
    if t.op is RESHAPE and t.ndim > 2 and t.args[0].ndim == 2 and t.shape[-1] == t.args[0].shape[-1] \
            and not b.shared(t):
        g = t.args[0]
        return (g, lambda rebuilt: ct.reshape(rebuilt, t.shape)) if _foldable(b, g) else (None, None)
    return (t, lambda rebuilt: rebuilt) if _foldable(b, t) else (None, None)


def _scalar(t):
    """The value of a constant of one value, else None."""
    if t.op is not CONST:
        return None
    scalar = t.attr("value").scalar
    return None if scalar is None else float(scalar)


def _gemm_and_other(b):
    """``(parts, wrap, other, first)`` of a binary term of a gemm (see ``_product``) and another operand."""
    for t, other, first in ((b["_x"], b["_y"], True), (b["_y"], b["_x"], False)):
        g, wrap = _product(b, t)
        if g is not None and t.shape == b.term.shape and g.dtype == b.term.dtype:
            return gemm_parts(g), wrap, other, first
    return None, None, None, None


def _scale(b):
    parts, wrap, other, _ = _gemm_and_other(b)
    factor = None if parts is None else _scalar(other)
    # not 0: a GEMM of alpha 0 reads neither operand (BLAS's rule), where (a @ b) * 0 is NaN for a NaN in them
    if factor is None or parts["epilogue"] not in ("none", "dgelu") or not math.isfinite(factor) \
            or parts["alpha"] * factor == 0:
        return None
    return wrap(gemm(**{**parts, "alpha": parts["alpha"] * factor, "beta": parts["beta"] * factor}))


def _negate(b):
    g, wrap = _product(b, b["_x"])
    if g is None:
        return None
    parts = gemm_parts(g)
    if parts["epilogue"] not in ("none", "dgelu"):  # both linear in the product
        return None
    return wrap(gemm(**{**parts, "alpha": -parts["alpha"], "beta": -parts["beta"]}))


def _added(b, sign):
    """``g + other`` (sign 1) or, with ``g`` on either side, ``g - other`` / ``other - g`` (sign -1)."""
    parts, wrap, other, first = _gemm_and_other(b)
    if parts is None or parts["epilogue"] not in ("none", "bias") or other.dtype != b.term.dtype:
        return None
    if sign < 0 and not first:  # other - g: negate the product, which a bias cannot follow
        if parts["bias"] is not None:
            return None
        parts = {**parts, "alpha": -parts["alpha"], "beta": -parts["beta"]}
    other_sign = sign if first else 1.0
    if other.shape == b.term.shape and parts["c"] is None:
        rows = gemm(**parts).shape
        return wrap(gemm(**{**parts, "beta": other_sign, "c": other if other.shape == rows else ct.reshape(other, rows)}))
    n = b.term.shape[-1]
    if other.shape == (n,) and parts["a"].ndim == parts["b"].ndim == 2 and parts["bias"] is None and other_sign > 0:
        return wrap(gemm(**{**parts, "epilogue": "bias", "bias": other}))
    return None


def _activation(b, name):
    """``name(g)`` (relu or gelu) as the epilogue of ``g``, after its bias if it has one."""
    g, wrap = _product(b, b["_x"])
    if g is None or (name == "gelu" and g.dtype not in GELU_EPILOGUE_DTYPES):
        return None
    parts = gemm_parts(g)
    if parts["epilogue"] not in ("none", "bias"):
        return None
    return wrap(gemm(**{**parts, "epilogue": name if parts["epilogue"] == "none" else f"bias_{name}"}))


def _gelu_backward(b):
    """``g * gelu_grad(z)``: a plain product (no c, no epilogue) times gelu's slope at ``z``, as the
    dgelu epilogue, which reads ``z`` as a matrix of the product's layout (``n`` a multiple of 8)."""
    for t, slope in ((b["_x"], b["_y"]), (b["_y"], b["_x"])):
        g, wrap = _product(b, t)
        if not (g is not None and slope.op is GELU_GRAD and t.shape == b.term.shape and g.ndim == 2
                and g.dtype in GELU_EPILOGUE_DTYPES):
            continue
        parts, z = gemm_parts(g), slope.args[0]
        if parts["epilogue"] == "none" and parts["c"] is None and z.shape == t.shape and z.dtype == g.dtype \
                and g.shape[-1] % 8 == 0:
            return wrap(gemm(**{**parts, "epilogue": "dgelu", "aux": z if z.shape == g.shape else ct.reshape(z, g.shape)}))
    return None


rules = RuleSet([
    Rule("matmul-to-gemm", "matmul(_a, _b)", _matmul_to_gemm),
    Rule("gemm-transpose", "gemm(*_xs, transpose_a=_ta, transpose_b=_tb, alpha=_al, beta=_be, epilogue=_ep)",
         _fold_transposes),
    Rule("gemm-scale", "multiply(_x, _y)", _scale),
    Rule("gemm-negate", "negative(_x)", _negate),
    Rule("gemm-add", "add(_x, _y)", lambda b: _added(b, 1.0)),
    Rule("gemm-subtract", "subtract(_x, _y)", lambda b: _added(b, -1.0)),
    Rule("gemm-relu", "relu(_x)", lambda b: _activation(b, "relu")),
    Rule("gemm-gelu", "gelu(_x)", lambda b: _activation(b, "gelu")),
    Rule("gemm-dgelu", "multiply(_x, _y)", _gelu_backward),
], name="gemm lowering")


# -- bias gradients ---------------------------------------------------------------------------

BGRAD_DTYPES = GELU_EPILOGUE_DTYPES
# Past this many rows cuBLASLt's DGELU_BGRAD is slower than DGELU and a fused column sum after it (H100, bf16,
# 3072 columns over 768: 1024 rows 42 us against 33 for DGELU; 4096 rows 143 against 62; 8192 rows 261 against 106)
DGELU_BGRAD_MOST_ROWS = 1024


def _bias_gradient_sources(order):
    """``{matrix: (gemm, epilogue)}``: the column sums of a matrix that a gemm can compute on the side, with the
    epilogue that makes it do so. cuBLASLt (13, on the H200) sums an operand only where it reads it with the
    contracted axis first, as stored: ``b`` not transposed, ``a`` transposed (a weight gradient's ``x^T @ dy``)."""
    sources = {}
    for g in order:
        if g.op is not GEMM or g.ndim != 2 or g.dtype not in BGRAD_DTYPES:
            continue
        parts = gemm_parts(g)
        if parts["output"] or parts["bias"] is not None:
            continue
        if parts["epilogue"] == "dgelu" and g.shape[0] <= DGELU_BGRAD_MOST_ROWS:
            sources.setdefault(g, (g, "dgelu_bgrad"))
        elif parts["epilogue"] == "none" and parts["a"].ndim == parts["b"].ndim == 2:
            for side, summed in (("b", not parts["transpose_b"]), ("a", parts["transpose_a"])):
                if summed:
                    sources.setdefault(_rows_of(parts[side]), (g, f"bgrad_{side}"))
    return sources


def _rows_of(t):
    """The value whose rows ``t`` is, through any reshapes that only merge or split leading axes (the last kept):
    the sums over all but the last axis of each of them are the same column sums, found under this one key."""
    while t.op is RESHAPE and t.ndim >= 2 and t.args[0].ndim >= 2 and t.args[0].shape[-1] == t.shape[-1]:
        t = t.args[0]
    return t


def _column_sum(s):
    """``(value, axes)`` of sum ``s`` as a sum of a matrix's columns where it is one: over axis 0 of a matrix, the
    rows of a transposed matrix, or all but the last axis of a value (of its matrix where it reshapes one)."""
    summed, axes = s.args[0], s.attr("axes")
    if summed.op is TRANSPOSE and summed.ndim == 2:  # the row sums of x^T are the column sums of x
        summed, axes = summed.args[0], tuple(1 - axis for axis in axes)
    if axes == tuple(range(summed.ndim - 1)):
        return _rows_of(summed), (0,)
    return summed, axes


def _gelu_of_a_kept_product(h, readers):
    """``(gemm, its reshape or None)`` where ``h`` is the gelu of a gemm's product (no epilogue, or a bias; its rows
    maybe reshaped) that other terms read too, as a training step's gelu backward does; else None."""
    t = h.args[0]
    reshaped = t if t.op is RESHAPE and t.ndim > 2 and t.args[0].ndim == 2 and t.shape[-1] == t.args[0].shape[-1] else None
    g = reshaped.args[0] if reshaped is not None else t
    if g.op is not GEMM or g.attr("output") or g.ndim != 2 or g.dtype not in GELU_EPILOGUE_DTYPES or g.shape[-1] % 8:
        return None
    parts = gemm_parts(g)
    others = [r for r, _ in readers[g] if r is not reshaped]
    if reshaped is not None:
        others += [r for r, _ in readers[t] if r is not h]
    if parts["epilogue"] not in ("none", "bias") or parts["c"] is not None or not others:
        return None
    return g, reshaped


def _with_gelu_arguments(roots, trace, keep):
    """``roots`` with each gelu of a gemm's product that other terms read too (``_gelu_of_a_kept_product``) and
    that product made by one gemm, which writes both (cuBLASLt's GELU_AUX epilogues: result 0 the gelu, result 1
    the product) instead of a product written, read back and written again as its gelu. A reader of the gelu
    (through reshapes) that must wait for another of its readers (a weight gradient, in the backward pass) reads the
    gelu of result 1 instead, computed where it runs, so that result 0 is not held until then; gelu's backward
    there, a dgelu gemm reading result 1, is a plain product times gelu's slope again (``_beside_gelu``), unless it
    is in ``keep``."""
    order = post_order(roots)
    readers = users(order)
    found = {h: kept for h in order if h.op is GELU and (kept := _gelu_of_a_kept_product(h, readers)) is not None}
    if not found:
        return list(roots)
    late = {}  # a reader that waits for another: the gelus, or reshapes of them, that it reads
    made_again = {}  # a gemm whose gelu a late reader computes again -> that gelu
    for h in found:
        read = _read_through_reshapes(h, readers)
        for r, views in read.items():
            if any(o is not r and o in post_order([r]) for o in read):
                late.setdefault(r, []).extend(views)
                made_again[found[h][0]] = h
    products, made, computed_late = {g: h for h, (g, _) in found.items()}, {}, {}

    def late_form(v):
        """``v`` (a gelu, or a reshape of one) as its late readers read it: the gelu of the gemm's result 1."""
        if v not in computed_late:
            computed_late[v] = v.rebuild((memo[v.args[0]] if v in found else late_form(v.args[0]),))
        return computed_late[v]

    def finish(original, rebuilt):
        if original in products:
            h, own = products[original], gemm_parts(rebuilt)
            parts = {**own, "epilogue": "gelu_aux" if own["bias"] is None else "bias_gelu_aux"}
            made[h] = gemm(**parts)
            if trace is not None:
                trace.append(Rewrite("gemm-gelu-argument", h, made[h]))
            return gemm(**{**parts, "output": 1})
        if original in found:
            return made[original] if found[original][1] is None else ct.reshape(made[original], original.shape)
        if original in late:
            swapped = {memo[v]: late_form(v) for v in late[original]}
            return rebuilt.rebuild(tuple(swapped.get(a, a) for a in rebuilt.args))
        if original.op is GEMM and original.attr("epilogue") == "dgelu" and is_narrow_float(original.dtype) \
                and abs(original.attr("alpha")) == 1.0 and original not in keep:
            h = made_again.get(_beneath_reshapes(gemm_parts(original)["aux"]))
            if h is not None:
                return _beside_gelu(original, rebuilt, bottom_up(h.args[0], memo, finish), trace)
        return rebuilt

    memo = {}
    return [bottom_up(root, memo, finish) for root in roots]


def _beside_gelu(original, rebuilt, z, trace):
    """dgelu gemm ``rebuilt`` as a plain product times ``gelu_grad(z)``, ``z`` the gelu argument as the late gelu of
    it reads it (of its shape). Over bfloat16 or float16, whose gelu intermediates (float32) each kernel computes for
    itself, the two are then elementwise kernels over one shape reading only the product and ``z``, which one kernel
    computes (``rules.shared_reads``), gelu's sigmoid once for both: the bfloat16 GPT large step on an H200, 12.85 ->
    12.74 ms (``benchmarks/results/h200/experiments/dgelu_beside_gelu/``). Only for a product scaled by 1 or -1: the
    epilogue applies another factor before its one rounding, a plain product before the product is rounded, where it
    can overflow though the program as written does not."""
    product = gemm(**{**gemm_parts(rebuilt), "epilogue": "none", "aux": None})
    viewed = product if product.shape == z.shape else ct.reshape(product, z.shape)
    result = ct.multiply(viewed, ct.gelu_grad(z))
    result = result if result.shape == product.shape else ct.reshape(result, product.shape)
    if trace is not None:
        trace.append(Rewrite("gemm-dgelu-beside-gelu", original, result))
    return result


def _beneath_reshapes(t):
    """The value ``t`` is, or is reshapes of."""
    while t.op is RESHAPE:
        t = t.args[0]
    return t


def _read_through_reshapes(h, readers):
    """``{reader: the terms it reads among h and reshapes of h}``, looking through reshapes to what reads them."""
    read, frontier = {}, [h]
    while frontier:
        v = frontier.pop()
        for r, _ in readers[v]:
            if r.op is RESHAPE:
                frontier.append(r)
            else:
                read.setdefault(r, []).append(v)
    return read


def finish(roots, trace=None, keep=frozenset()):
    """``roots`` with the gelus of products read on their own too written by their gemms (``_with_gelu_arguments``)
    and each ``sum(x, axis=0)`` of a matrix that a gemm can compute on the side (a bias gradient) taken from that
    gemm's second result: cuBLASLt's BGRAD epilogues reduce an operand over the contracted axis as they read it,
    and DGELU_BGRAD the product's columns as it writes them. One sum per gemm; the sums in ``keep`` stay
    reductions, and the dgelu gemms in ``keep`` keep their epilogue (the compiler keeps either where the other
    form would hold more at the memory peak)."""
    roots = _with_gelu_arguments(roots, trace, keep)
    order = post_order(roots)
    sources = _bias_gradient_sources(order)
    epilogue, taken_by = {}, {}
    for s in order:
        if s.op is not SUM or s.ndim != 1 or s.args[0].ndim < 2 or s in keep:
            continue
        summed, axes = _column_sum(s)
        found = sources.get(summed) if axes == (0,) else None
        if found is not None and found[0] not in epilogue:
            epilogue[found[0]], taken_by[s] = found[1], found[0]
    if not epilogue:
        return list(roots)

    def finish(original, rebuilt):
        if original in epilogue:
            return gemm(**{**gemm_parts(rebuilt), "epilogue": epilogue[original]})
        if original in taken_by:
            product = bottom_up(taken_by[original], memo, finish)
            result = gemm(**{**gemm_parts(product), "output": 1})
            if trace is not None:
                trace.append(Rewrite("gemm-bias-gradient", original, result))
            return result
        return rebuilt

    memo = {}
    return [bottom_up(root, memo, finish) for root in roots]


def alternatives(planned):
    """The variants worth planning, each of what the rules below made whose results are live where the arena holds
    the most: the sums that gemms compute on the side (bias gradients; the gemm runs where every other buffer is
    live too, and computed apart, such a sum can run earlier), and the dgelu gemms made plain products beside a
    gelu computed again (``_beside_gelu``: their product is one more buffer). ``planned`` is a
    ``backends.interface.PlannedStep``."""
    made = [m for rule in ("gemm-bias-gradient", "gemm-dgelu-beside-gelu") if (m := planned.made_by("lowering", rule))]
    if not made:
        return []
    plan = planned.plan
    live = live_bytes(plan.buffers, plan.steps)
    peaks = [i for i, total in enumerate(live) if total == max(live)]
    at_peak = [frozenset(made_by[p.key] for p in plan.placements
                         if p.key in made_by and any(p.start <= i <= p.end for i in peaks)) for made_by in made]
    return [variant for variant in at_peak if variant]
