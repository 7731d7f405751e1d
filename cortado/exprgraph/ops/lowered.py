"""The ops that fusion builds, never users: ``fused``, a region of elementwise work gathered into one
kernel, and ``param``, the stand-in for the region's operands in its body. (A backend's own lowered
ops, such as the GPU's ``gemm``, live with the backend's lowering.)
"""

from ..term import make, shape_violation
from .base import FUSED, LEAF, Op


# -- fused regions -----------------------------------------------------------------------------


# ``param(index=k)`` stands in a fused body for the region's ``k``-th operand (printed ``in{k}``)
PARAM = Op("param", 0, ("index", "shape", "dtype"), lambda args, index, shape, dtype: shape,
           lambda args, index, shape, dtype: dtype, LEAF)


def parameter(index, like):
    """The ``index``-th parameter of a fused body, typed as ``like`` (anything with a shape and a dtype)."""
    return make(PARAM, (), (index, like.shape, like.dtype))


def _fused_shape(args, outputs, index, again, kernel):
    """The body's output ``index``. The parameters' types are fusion's to get right: checking them
    here would walk the whole body once per output, quadratic in a region of many outputs."""
    if not 0 <= index < len(outputs):
        raise shape_violation(f"output {index} of a fused body of {len(outputs)} outputs")
    return outputs[index].shape


# ``fused(*inputs, outputs=body, index=k, again=False, kernel=...)`` is output ``k`` of a fused region: ``body`` is a
# tuple of terms over the parameters ``param(index=0), param(index=1), ...`` (one per input). The terms of one region
# share ``inputs`` and ``body`` and differ in ``index``; a backend runs them as one kernel, of the shape ``kernel``
# that fusion decided (``rules.fusion.kernel_shape``: "elementwise", "reduction" or "row"). ``again`` marks a
# region's copy that recomputes its values later (``memplan.recompute``): a term of its own, even where it reads what
# the region read.
FUSED_OP = Op("fused", None, ("outputs", "index", "again", "kernel"), _fused_shape,
              lambda args, outputs, index, again, kernel: outputs[index].dtype, FUSED,
              results=lambda outputs, index, again, kernel: len(outputs), result_attr="index")
