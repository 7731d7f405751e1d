"""The ``float8_gemm`` op: cuBLASLt's scaled float8 product, the GPU backend's own op, with its attributes, shape and
dtype rules and reference semantics. ``lowering/float8.py``'s rules and ``lowering/float8_gelu.py`` build it,
``calls.float8_gemm`` runs it.

``float8_gemm(a, b[, scale][, bias][, c][, d_scale])`` is ``epilogue(scale * a @ b^T + bias + c)`` of float8
matrices ``a`` (m, k) and ``b`` (n, k), summed in float32 and rounded once to its dtype: float32, bfloat16, or
float8_e4m3fn after multiplying by ``d_scale`` (saturating). ``c``, an added matrix of the product's shape and
dtype (a residual), is cuBLASLt's C read at beta 1, for a bfloat16 product without gelu. Its results
(``output``): the product; a ``*_aux`` epilogue's gelu argument (the product before gelu, in bfloat16, which gelu's
gradient reads); a float8 product's largest magnitude before ``d_scale`` (float32).
"""

import numpy as np

from ....exprgraph.dtypes import BFLOAT16, FLOAT8, converted, is_float8
from ....exprgraph import constructors as ct
from ....exprgraph.ops import BROADCAST_TO, CONST, GELU, LOWERED, Op
from ....exprgraph.semantics import implementation
from ....exprgraph.term import dtype_violation, make, shape_violation

FLOAT8_GEMM_EPILOGUES = ("none", "bias", "gelu", "bias_gelu", "gelu_aux", "bias_gelu_aux")
ROUNDED_ENOUGH = (BFLOAT16,)  # the outputs whose rounding covers the tensor cores' partial sums (see above)
FLOAT8_OUTPUTS = FLOAT8[:1]  # a product written as float8 itself (at a scale the step computes): e4m3
OUTPUT_DTYPES = (np.dtype(np.float32),) + ROUNDED_ENOUGH + FLOAT8_OUTPUTS  # float32: before a cast folds in, or ``finish``
AUX_DTYPE = BFLOAT16  # the gelu's argument that a ``*_aux`` epilogue keeps (for gelu's gradient)


def results(dtype, epilogue):
    """What a float8_gemm's results are, in the order of its ``output`` attribute: the product, then the gelu's
    argument (a ``*_aux`` epilogue's, rounded to ``AUX_DTYPE``), then, for a float8 product, the largest magnitude
    of its values before they are scaled and rounded (float32)."""
    return ("product",) + (("gelu_argument",) if epilogue.endswith("_aux") else ()) + (
        ("amax",) if np.dtype(dtype) in FLOAT8_OUTPUTS else ())


def float8_operands(args, dtype, epilogue, scaled, added):
    """``(a, b, scale, bias, c, d_scale)`` of a float8_gemm's arguments, None for those it has not: ``c`` is added
    to the product, ``d_scale`` multiplies the values of a float8 product before they are rounded to it."""
    a, b, *rest = args
    scale = rest.pop(0) if scaled else None
    bias = rest.pop(0) if "bias" in epilogue else None
    c = rest.pop(0) if added else None
    d_scale = rest.pop(0) if np.dtype(dtype) in FLOAT8_OUTPUTS else None
    return a, b, scale, bias, c, d_scale


def _shape(args, dtype, epilogue, scaled, added, output):
    if epilogue not in FLOAT8_GEMM_EPILOGUES:
        raise shape_violation(f"unknown epilogue {epilogue!r}; the epilogues are {FLOAT8_GEMM_EPILOGUES}")
    if output not in range(len(results(dtype, epilogue))):
        raise shape_violation(f"a float8_gemm of {dtype} with the {epilogue} epilogue has no result {output}")
    float8_output = dtype in FLOAT8_OUTPUTS
    if len(args) != 2 + scaled + ("bias" in epilogue) + added + float8_output:
        raise shape_violation("float8_gemm takes a, b, then the scale where it is scaled, then the bias where its "
                              "epilogue adds one, then c where one is added, then the output's scale where it writes "
                              "float8")
    a, b, scale, bias, c, d_scale = float8_operands(args, dtype, epilogue, scaled, added)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise shape_violation(f"float8_gemm multiplies a (m, k) matrix by the transpose of a (n, k) one, not "
                              f"{a.shape} and {b.shape}")
    if any(s is not None and s.shape != () for s in (scale, d_scale)):
        raise shape_violation("a float8_gemm's scales are one value each")
    if bias is not None and bias.shape != (b.shape[0],):
        raise shape_violation(f"the bias has shape {bias.shape}; it must be ({b.shape[0]},)")
    if c is not None and c.shape != (a.shape[0], b.shape[0]):
        raise shape_violation(f"the added term has shape {c.shape}; it must be the product's, "
                              f"{(a.shape[0], b.shape[0])}")
    return () if results(dtype, epilogue)[output] == "amax" else (a.shape[0], b.shape[0])


def _dtype(args, dtype, epilogue, scaled, added, output):
    a, b, scale, bias, c, d_scale = float8_operands(args, dtype, epilogue, scaled, added)
    if not (is_float8(a.dtype) and is_float8(b.dtype)) or a.dtype == b.dtype == FLOAT8[1]:
        raise dtype_violation("float8_gemm multiplies float8 matrices, not two of float8_e5m2 (cuBLASLt does not)")
    if any(s is not None and s.dtype != np.float32 for s in (scale, d_scale)):
        raise dtype_violation("the scales of a float8_gemm are float32")
    if bias is not None and bias.dtype != _bias_dtype(dtype):
        raise dtype_violation(f"the bias of a float8_gemm writing {dtype} is {_bias_dtype(dtype)}")
    if c is not None and c.dtype != dtype:
        raise dtype_violation(f"the added term of a float8_gemm writing {dtype} is {dtype}, not {c.dtype}")
    return {"product": dtype, "gelu_argument": AUX_DTYPE, "amax": np.dtype(np.float32)}[results(dtype, epilogue)[output]]


def _bias_dtype(dtype):
    """The bias's dtype: the output's, bfloat16 for a float8 output (cuBLASLt's)."""
    return BFLOAT16 if dtype in FLOAT8_OUTPUTS else dtype


def _normalize(args, dtype=np.float32, epilogue="none", scaled=False, added=False, output=0):
    dtype = np.dtype(dtype)
    if dtype not in OUTPUT_DTYPES:
        raise dtype_violation(f"a float8_gemm writes float32, bfloat16 or float8_e4m3fn, not {dtype}")
    if ("bias" in epilogue or "aux" in epilogue) and dtype == np.float32:
        raise dtype_violation("cuBLASLt adds a bias to a float8 product, or keeps its gelu's argument, only where "
                              "it writes bfloat16 or float8")
    if added and (dtype not in ROUNDED_ENOUGH or "gelu" in epilogue):
        raise dtype_violation("a float8_gemm adds a term only to a product it writes in bfloat16, without gelu")
    return dtype, epilogue, bool(scaled), bool(added), int(output)


def _evaluate(xs, dtype, epilogue, scaled, added, output):
    """The float32 sums of exact products, scaled, the bias and the added term added and gelu taken in float32; the
    caller rounds, but a float8 product is rounded here, after its scale, saturating (``dtypes.converted``)."""
    a, b, scale, bias, c, d_scale = float8_operands(xs, dtype, epilogue, scaled, added)
    out = np.matmul(a.astype(np.float32), b.astype(np.float32).T)
    if scale is not None:
        out = out * scale.astype(np.float32)
    if bias is not None:
        out = out + bias.astype(np.float32)
    if c is not None:
        out = out + c.astype(np.float32)
    kind = results(dtype, epilogue)[output]
    if kind == "gelu_argument":
        return out
    if "gelu" in epilogue:
        out = implementation(GELU)([out])
    if kind == "amax":
        return np.max(np.abs(out))
    return converted(out * d_scale.astype(np.float32), dtype) if d_scale is not None else out


FLOAT8_GEMM = Op("float8_gemm", None, ("dtype", "epilogue", "scaled", "added", "output"), _shape, _dtype, LOWERED,
                 _normalize, results=lambda dtype, epilogue, scaled, added, output: len(results(dtype, epilogue)),
                 result_attr="output", evaluate=_evaluate)


def float8_gemm(a, b, dtype=np.float32, epilogue="none", scale=None, bias=None, d_scale=None, output=0, c=None):
    """The term ``epilogue(scale * a @ b^T + bias + c)`` of float8 matrices ``a`` (m, k) and ``b`` (n, k), in
    float32, rounded once to ``dtype`` (a float8 ``dtype`` after multiplying by ``d_scale``); or with ``output``
    another of its results (``results``)."""
    args = (a, b) + tuple(x for x in (scale, bias, c, d_scale) if x is not None)
    return make(FLOAT8_GEMM, args, FLOAT8_GEMM.normalize(args, dtype, epilogue, scale is not None, c is not None,
                                                         output))


def operands_of(g):
    """``float8_operands`` of float8_gemm term ``g``."""
    return float8_operands(g.args, g.attr("dtype"), g.attr("epilogue"), g.attr("scaled"), g.attr("added"))


def parts(g):
    """A float8_gemm's attributes and operands as keywords of ``float8_gemm``."""
    a, b, scale, bias, c, d_scale = operands_of(g)
    return {"a": a, "b": b, "dtype": g.attr("dtype"), "epilogue": g.attr("epilogue"), "scale": scale, "bias": bias,
            "c": c, "d_scale": d_scale, "output": g.attr("output")}


def one_value(t):
    """The float32 value of one value that ``t`` is (a 0-d term, broadcast or not, or a constant), as a 0-d term;
    else None: a scale the call can take through a pointer."""
    if t.dtype != np.float32:
        return None
    if t.op is CONST and t.attr("value").scalar is not None:
        return ct.const(np.float32(t.attr("value").scalar))
    while t.op is BROADCAST_TO:
        t = t.args[0]
    return t if t.shape == () else None
