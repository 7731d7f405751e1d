"""The ``gemm`` op: cuBLASLt's form of a product, the GPU backend's own op (not the general table's), with its
attributes, shape and dtype rules and reference semantics. ``lowering/gemm.py``'s rules build it, ``calls.cublaslt``
runs it, and the memory plan and the runner read its operands and results through ``gemm_operands``.
"""

import numpy as np

from ....exprgraph.dtypes import BFLOAT16, is_float, is_narrow_float
from ....exprgraph.ops import GELU, GELU_GRAD, LOWERED, Op
from ....exprgraph.ops.base import broadcast_shapes
from ....exprgraph.semantics import implementation
from ....exprgraph.term import dtype_violation, make, shape_violation

# ``gemm(a, b[, c][, bias][, aux])``: what ``matmul`` lowers to for a BLAS library, cuBLASLt's form
# ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)``. ``op`` swaps the last two axes where
# ``transpose_a`` / ``transpose_b`` say; ``c`` is there when ``beta`` is not 0, ``bias`` (a row
# added to every row of the product) when the epilogue names it. The epilogue ``dgelu`` is gelu's
# backward: ``alpha * op(a) @ op(b) * gelu_grad(aux)``, ``aux`` the gelu argument of the forward
# pass (of the product's shape). Some epilogues have a second result, the term with ``output=1``
# (``output=0`` is the product): ``bgrad_a`` the sums of ``op(a)`` over the contracted axis (a
# bias gradient of length m), ``bgrad_b`` those of ``op(b)`` (length n), ``dgelu_bgrad`` the
# column sums of its dgelu product (length n), ``gelu_aux`` and ``bias_gelu_aux`` (gelu's result)
# the gelu's argument (the product's shape). Only lowering rules build gemms.
GEMM_EPILOGUES = ("none", "bias", "relu", "bias_relu", "gelu", "bias_gelu", "gelu_aux", "bias_gelu_aux", "dgelu",
                  "dgelu_bgrad", "bgrad_a", "bgrad_b")
BIAS_GRADIENT_RESULTS = ("dgelu_bgrad", "bgrad_a", "bgrad_b")  # the epilogues whose second result is a bias gradient
GELU_ARGUMENT_RESULTS = ("gelu_aux", "bias_gelu_aux")  # those whose second result is their gelu's argument
TWO_RESULTS = BIAS_GRADIENT_RESULTS + GELU_ARGUMENT_RESULTS


def gemm_operands(args, beta, epilogue):
    """``(a, b, c, bias, aux)`` of a gemm's arguments, None for those it has not."""
    a, b, *rest = args
    c = rest.pop(0) if beta else None
    bias = rest.pop(0) if "bias" in epilogue else None
    aux = rest.pop(0) if epilogue.startswith("dgelu") else None
    return a, b, c, bias, aux


def _gemm_shape(args, transpose_a, transpose_b, alpha, beta, epilogue, output):
    if epilogue not in GEMM_EPILOGUES:
        raise shape_violation(f"unknown epilogue {epilogue!r}; the epilogues are {GEMM_EPILOGUES}")
    if output not in ((0, 1) if epilogue in TWO_RESULTS else (0,)):
        raise shape_violation(f"the {epilogue} epilogue has no result {output}")
    if len(args) != 2 + bool(beta) + ("bias" in epilogue) + epilogue.startswith("dgelu"):
        raise shape_violation("gemm takes a, b, then c when beta is not 0, then bias when the epilogue adds one, "
                              "then the gelu argument when the epilogue is dgelu")
    if beta and epilogue.startswith("dgelu"):
        raise shape_violation("the dgelu epilogue scales the product alone: it takes no c")
    a, b, c, bias, aux = gemm_operands(args, beta, epilogue)
    if a.ndim < 2 or b.ndim < 2:
        raise shape_violation("gemm needs operands of rank 2 or more")
    if epilogue in TWO_RESULTS and (a.ndim, b.ndim) != (2, 2):
        raise shape_violation(f"the {epilogue} epilogue takes matrices, not batches of them")
    m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
    if k != k2:
        raise shape_violation(f"the contracted dimensions differ: {k} and {k2}")
    out = broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
    if c is not None and c.shape != out:
        raise shape_violation(f"c has shape {c.shape}, the product {out}")
    if bias is not None and bias.shape != (n,):
        raise shape_violation(f"the bias has shape {bias.shape}; it must be ({n},)")
    if aux is not None and aux.shape != out:
        raise shape_violation(f"the gelu argument has shape {aux.shape}, the product {out}")
    if output and epilogue in BIAS_GRADIENT_RESULTS:
        return (m,) if epilogue == "bgrad_a" else (n,)
    return out


def _gemm_normalize(args, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", output=0):
    return (bool(transpose_a), bool(transpose_b), float(alpha) + 0.0, float(beta) + 0.0, epilogue, int(output))  # no -0.0


def _gemm_dtype(args, *attrs):
    dtypes = {a.dtype for a in args}
    if len(dtypes) != 1 or not is_float(next(iter(dtypes))):
        raise dtype_violation("gemm needs operands of one floating dtype")
    return args[0].dtype


def _reference(xs, transpose_a, transpose_b, alpha, beta, epilogue, output):
    """What a gemm computes, with NumPy (the reference interpreter's; float16 and bfloat16 come in float32)."""
    a, b, c, bias, aux = gemm_operands(xs, beta, epilogue)
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    if output and epilogue in BIAS_GRADIENT_RESULTS:  # sums over the contracted axis, or of the product's columns
        summed = {"bgrad_a": (a, -1), "bgrad_b": (b, -2)}.get(epilogue)
        x, axis = summed or (_reference(xs, transpose_a, transpose_b, alpha, beta, epilogue, 0), -2)
        return np.sum(x, axis=axis, dtype=np.promote_types(x.dtype, np.float32)).astype(x.dtype)
    dtype = a.dtype.type
    out = np.matmul(a, b) * dtype(alpha)
    if c is not None:
        out = out + dtype(beta) * c
    if bias is not None:
        out = out + bias
    if output:  # the gelu's argument
        return out
    if "gelu" in epilogue:  # in float32 for float16 and bfloat16, as the gelu ops (and cuBLASLt's epilogues) take them
        if epilogue.startswith("dgelu"):
            return out * implementation(GELU_GRAD)([aux.astype(out.dtype)])
        return implementation(GELU)([out])
    return np.maximum(out, dtype(0)) if "relu" in epilogue else out


def _evaluate(xs, *attrs):
    return _reference([x.astype(np.float32) if is_narrow_float(x.dtype) else x for x in xs], *attrs)


GEMM = Op("gemm", None, ("transpose_a", "transpose_b", "alpha", "beta", "epilogue", "output"), _gemm_shape,
          _gemm_dtype, LOWERED, _gemm_normalize,
          results=lambda transpose_a, transpose_b, alpha, beta, epilogue, output: 2 if epilogue in TWO_RESULTS else 1,
          result_attr="output", evaluate=_evaluate)

GEMM_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)) + ((BFLOAT16,) if BFLOAT16 else ())
# cuBLASLt's gelu epilogues were up to 5e-7 (relative) off in float64 on the H200: float64 keeps its own kernel
GELU_EPILOGUE_DTYPES = tuple(d for d in GEMM_DTYPES if d != np.float64)


def gemm(a, b, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", c=None, bias=None, aux=None,
         output=0):
    """The term ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)`` (``aux``: the dgelu epilogue's gelu argument),
    or with ``output=1`` its epilogue's second result (see ``TWO_RESULTS``)."""
    args = (a, b) + ((c,) if beta else ()) + ((bias,) if bias is not None else ()) + ((aux,) if aux is not None else ())
    return make(GEMM, args, GEMM.normalize(args, transpose_a, transpose_b, alpha, beta, epilogue, output))


def gemm_parts(g):
    """A gemm's attributes and operands as keywords of ``gemm``."""
    attrs = dict(zip(g.op.attr_names, g.attrs))
    a, b, c, bias, aux = gemm_operands(g.args, attrs["beta"], attrs["epilogue"])
    attrs.update(a=a, b=b, c=c, bias=bias, aux=aux)
    return attrs
