"""``gelus_into_float8_products``: a float8 layer's gelu cast to float8 for the next layer is written by the product
that makes the gelu's argument.

Between two float8 linear layers a training step computes ``h``, a float8 product with its bias in bfloat16;
``g = gelu(h)``; ``cast(g * s, float8_e4m3fn)`` for the next product (``s`` the next layer's delayed scale, a value
of the step) and ``max(abs(g))`` for that layer's amax history; gelu's gradient reads ``h``. Apart, that is the
product writing ``h`` and a kernel reading it back to write the float8 values (on an H200 at the GPT's first MLP
layer, 8192 x 3072 x 768: 44 + 47 us). cuBLASLt's GELU_AUX_BIAS epilogue with a float8 output does it in the
product (73 us): the float8 values at the scale ``s`` (result 0), ``h`` kept in bfloat16 (result 1, only where
something else reads ``h``), and the largest magnitude of the gelu (result 2).

Where the values are rounded changes, never what they are: the gelu is taken on the float32 sums and rounded once
to float8, where the expression rounds ``h`` and ``g`` to bfloat16 first (so a value may land one float8 step
apart); the largest magnitude is taken on the float32 gelu and rounded to bfloat16 afterwards, which is the largest
of the rounded values (rounding to nearest keeps the order of values, and of their magnitudes). A gelu read by
anything else, or a cast of it that is not all the readers of its scaled value, stays as it is; so does one whose
float8 rows a weight gradient reads transposed where its row kernel can write them so (``row_kernels``: rows of up
to 768 float8 values, both orders), which the call would leave for the product to copy (measured faster only at
the GPT's rows of 3072).

    roots = gelus_into_float8_products(roots, trace)   # in the float8 target's ``finish``
"""

import numpy as np

from ....exprgraph import constructors as ct
from ....exprgraph.dtypes import BFLOAT16
from ....exprgraph.graph import post_order, users
from ....exprgraph.ops import ABS, CAST, GELU, MAX, MULTIPLY, RESHAPE, TRANSPOSE
from ....rules.engine import Rewrite, bottom_up
from ..row_kernels import writes_rows_transposed
from .float8_op import FLOAT8_GEMM, FLOAT8_OUTPUTS, float8_gemm, one_value, parts, results


def _product_of(t, epilogues):
    """``(gemm, reshape or None)`` where ``t`` is a bfloat16 float8 product with one of ``epilogues`` (its rows maybe
    split into a batch); else None."""
    reshaped = t if (t.op is RESHAPE and t.ndim >= 2 and t.args[0].ndim == 2
                     and t.shape[-1] == t.args[0].shape[-1]) else None
    g = reshaped.args[0] if reshaped is not None else t
    if (g.op is not FLOAT8_GEMM or g.attr("output") or g.dtype != BFLOAT16 or g.attr("epilogue") not in epilogues
            or g.attr("added")):
        return None
    return g, reshaped


def _gelu_of_a_product(t, readers, roots):
    """``(gemm, reshape or None, kept)`` where ``t`` is the gelu of a bfloat16 float8 product, taken apart (``kept``:
    whether its argument is read elsewhere too) or in the product's epilogue; else None."""
    if t.op is GELU:
        found = _product_of(t.args[0], ("none", "bias"))
        return None if found is None else (*found, _argument_read_elsewhere(t, *found, readers, roots))
    found = _product_of(t, ("gelu", "bias_gelu"))
    return None if found is None else (*found, False)


def _only_reader(t, readers, roots):
    """The one term that reads ``t``, None if ``t`` is a root or read by none or several."""
    found = {r for r, _ in readers[t]}
    return found.pop() if len(found) == 1 and t not in roots else None


def _largest_magnitude(magnitudes, readers, roots):
    """The term that is the max of every element of ``magnitudes`` (at once, or as the max of its rows' maxima), if
    that is all that reads them; else None."""
    t = _only_reader(magnitudes, readers, roots)
    if t is None or t.op is not MAX:
        return None
    if t.size == 1:
        return t
    if t.attr("axes") == (t.ndim - 1,) and t.attr("keepdims"):
        whole = _only_reader(t, readers, roots)
        return whole if whole is not None and whole.op is MAX and whole.size == 1 else None
    return None


def _read_transposed(values, readers):
    """Whether a transpose reads one of ``values``, or a reshape of one (a weight gradient's operand)."""
    frontier = list(values)
    while frontier:
        for r, _ in readers[frontier.pop()]:
            if r.op is TRANSPOSE:
                return True
            if r.op is RESHAPE:
                frontier.append(r)
    return False


def _argument_read_elsewhere(gelu, gemm, reshape, readers, roots):
    """Whether a term other than ``gelu`` (or a root) reads its argument: the product, or the product reshaped."""
    shown = reshape if reshape is not None else gemm
    return (shown in roots or gemm in roots or any(r is not gelu for r, _ in readers[shown])
            or (reshape is not None and any(r is not reshape for r, _ in readers[gemm])))


def _folded(h, readers, roots):
    """What the gelu ``h`` of a bfloat16 float8 product folds into that product with, if its only reader is a cast to
    float32 that is scaled by one value and cast to float8 (``casts``, all the scaled value's readers) and
    optionally whose magnitudes' max is taken (``amax``): ``{"gemm", "scale", "casts", "amax", "kept"}`` (``kept``:
    whether the gelu's argument is read elsewhere too); else None."""
    product = _gelu_of_a_product(h, readers, roots)
    widened = _only_reader(h, readers, roots)
    if product is None or widened is None or widened.op is not CAST or widened.dtype != np.float32 or widened in roots:
        return None
    scaled, amax = None, None
    for r in {r for r, _ in readers[widened]}:
        if r.op is MULTIPLY and r.shape == widened.shape and scaled is None:
            scaled = r
        elif r.op is ABS and amax is None and (amax := _largest_magnitude(r, readers, roots)) is not None:
            continue
        else:
            return None
    if scaled is None or scaled in roots:
        return None
    scale = one_value(scaled.args[1] if scaled.args[0] is widened else scaled.args[0])
    casts = {r for r, _ in readers[scaled]}
    if (scale is None or any(c.op is not CAST or c.dtype not in FLOAT8_OUTPUTS for c in casts)
            or len({c.dtype for c in casts}) != 1):
        return None
    gemm, _, kept = product
    if gemm in post_order([scale]):  # a scale made from this very product (current scaling) waits for it
        return None
    if _read_transposed(casts, readers) and writes_rows_transposed(*gemm.shape, [c.dtype for c in casts] * 2):
        return None  # its row kernel writes it transposed for the weight gradient too, which would copy it
    return {"gemm": gemm, "scale": scale, "casts": casts, "amax": amax, "kept": kept}


def gelus_into_float8_products(roots, trace=None):
    """``roots`` with each gelu of a float8 product that is only cast to float8 (and its amax taken) written by
    that product (see the module docstring)."""
    order = post_order(roots)
    readers = users(order)
    final = set(roots)
    found = [f for h in order if h.op in (GELU, FLOAT8_GEMM, RESHAPE) and (f := _folded(h, readers, final)) is not None]
    if not found:
        return list(roots)
    replaced = {}  # original term -> (what it folds into, which result it becomes)
    for f in found:
        replaced.update({c: (f, "product") for c in f["casts"]})
        if f["amax"] is not None:
            replaced[f["amax"]] = (f, "amax")
        if f["kept"]:
            replaced[f["gemm"]] = (f, "gelu_argument")
    memo, made = {}, {}

    def product_for(f):
        """The float8_gemm ``f`` folds into, its operands rebuilt (``bottom_up`` on demand, as the scale need not
        have been reached yet)."""
        g = f["gemm"]
        if g not in made:
            own = {k: bottom_up(v, memo, finish) if k in ("a", "b", "scale", "bias") and v is not None else v
                   for k, v in parts(g).items()}
            epilogue = ("bias_gelu" if own["bias"] is not None else "gelu") + ("_aux" if f["kept"] else "")
            made[g] = float8_gemm(**{**own, "dtype": next(iter(f["casts"])).dtype, "epilogue": epilogue,
                                     "d_scale": bottom_up(f["scale"], memo, finish)})
        return made[g]

    def finish(original, new):
        if original not in replaced:
            return new
        f, kind = replaced[original]
        product = product_for(f)
        out = float8_gemm(**{**parts(product), "output": results(product.dtype, product.attr("epilogue")).index(kind)})
        out = out if out.shape == original.shape else ct.reshape(out, original.shape)
        if kind == "amax":  # the max of the bfloat16 gelu's magnitudes: the float32 one rounded to bfloat16
            out = ct.cast(ct.cast(out, BFLOAT16), original.dtype)
        if trace is not None and kind != "gelu_argument":
            trace.append(Rewrite(f"float8-gemm-gelu-{'cast' if kind == 'product' else 'amax'}", original, out))
        return out

    return [bottom_up(root, memo, finish) for root in roots]
