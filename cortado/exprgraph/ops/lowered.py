"""The ops that passes build, never users: ``gemm``, what a backend's lowering turns a matmul into
(with its helpers, all in this file, so it can move to the backend that owns it), and ``fused``,
a region of elementwise work that fusion gathers into one kernel.
"""

from ..dtypes import is_float
from ..term import dtype_violation, make, shape_violation
from .base import FUSED, LEAF, LOWERED, Op, broadcast_shapes


# -- gemm --------------------------------------------------------------------------------------


# ``gemm(a, b[, c][, bias][, aux])``: what ``matmul`` lowers to for a BLAS library, cuBLASLt's form
# ``epilogue(alpha * op(a) @ op(b) + beta * c + bias)``. ``op`` swaps the last two axes where
# ``transpose_a`` / ``transpose_b`` say; ``c`` is there when ``beta`` is not 0, ``bias`` (a row
# added to every row of the product) when the epilogue names it. The epilogue ``dgelu`` is gelu's
# backward: ``alpha * op(a) @ op(b) * gelu_grad(aux)``, ``aux`` the gelu argument of the forward
# pass (of the product's shape). Some epilogues have a second result, the term with ``output=1``
# (``output=0`` is the product): ``bgrad_a`` the sums of ``op(a)`` over the contracted axis (a
# bias gradient of length m), ``bgrad_b`` those of ``op(b)`` (length n), ``dgelu_bgrad`` the
# column sums of its dgelu product (length n). Only lowering rules build gemms.
GEMM_EPILOGUES = ("none", "bias", "relu", "bias_relu", "gelu", "bias_gelu", "dgelu", "dgelu_bgrad", "bgrad_a", "bgrad_b")
TWO_RESULTS = ("dgelu_bgrad", "bgrad_a", "bgrad_b")  # the epilogues with a second result


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
    if output:
        return (m,) if epilogue == "bgrad_a" else (n,)
    return out


def _gemm_normalize(args, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0, epilogue="none", output=0):
    return (bool(transpose_a), bool(transpose_b), float(alpha) + 0.0, float(beta) + 0.0, epilogue, int(output))  # no -0.0


def _gemm_dtype(args, *attrs):
    dtypes = {a.dtype for a in args}
    if len(dtypes) != 1 or not is_float(next(iter(dtypes))):
        raise dtype_violation("gemm needs operands of one floating dtype")
    return args[0].dtype


GEMM = Op("gemm", None, ("transpose_a", "transpose_b", "alpha", "beta", "epilogue", "output"), _gemm_shape,
          _gemm_dtype, LOWERED, _gemm_normalize,
          results=lambda transpose_a, transpose_b, alpha, beta, epilogue, output: 2 if epilogue in TWO_RESULTS else 1,
          result_attr="output")


# -- fused regions -----------------------------------------------------------------------------


# ``param(index=k)`` stands in a fused body for the region's ``k``-th operand (printed ``in{k}``)
PARAM = Op("param", 0, ("index", "shape", "dtype"), lambda args, index, shape, dtype: shape,
           lambda args, index, shape, dtype: dtype, LEAF)


def parameter(index, like):
    """The ``index``-th parameter of a fused body, typed as ``like`` (anything with a shape and a dtype)."""
    return make(PARAM, (), (index, like.shape, like.dtype))


def _fused_shape(args, outputs, index):
    """The body's output ``index``. The parameters' types are fusion's to get right: checking them
    here would walk the whole body once per output, quadratic in a region of many outputs."""
    if not 0 <= index < len(outputs):
        raise shape_violation(f"output {index} of a fused body of {len(outputs)} outputs")
    return outputs[index].shape


# ``fused(*inputs, outputs=body, index=k)`` is output ``k`` of a fused region: ``body`` is a tuple
# of terms over the parameters ``param(index=0), param(index=1), ...`` (one per input). The terms of one region share
# ``inputs`` and ``body`` and differ in ``index``; a backend runs them as one kernel.
FUSED_OP = Op("fused", None, ("outputs", "index"), _fused_shape,
              lambda args, outputs, index: outputs[index].dtype, FUSED,
              results=lambda outputs, index: len(outputs), result_attr="index")
