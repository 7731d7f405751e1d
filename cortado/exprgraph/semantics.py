"""What each op computes: the meaning of the IR, as its record's ``evaluate`` (written with NumPy).

The reference interpreter evaluates terms with ``implementation``, and constant folding (rules)
folds with it too, so a folded constant is exactly what evaluating the term would give. It takes
the list of operand arrays and the op's attributes; its result is cast to the term's dtype by the caller, which
refuses a result of another shape, of another kind of dtype, or of another integer dtype (``reference``).

Some ops take float16 and bfloat16 in float32 and round their result once (``Op.computes_in_float32``,
which every backend follows). NumPy adds float16 in float16 along any axis but a contiguous last one
(3000 times 0.1 sums to 256), and a softmax's sum over 100,000 ones overflows it; ml_dtypes'
bfloat16 adds in bfloat16 everywhere and its einsum fails. So sums, means, the softmax family,
products of both and attention (a softmax between two products) are computed in float32, as
PyTorch, JAX and cuBLAS do; so are ``gelu`` and ``gelu_grad``, as NumPy computes float16's exp.
gelu's constants and the softmax family's shift are every backend's, so they are defined in ``numerics``.
"""

import functools

import numpy as np


def _in_float32(evaluate, narrow):
    """``evaluate`` taking its operands of the dtypes ``narrow`` accepts as float32 (the caller rounds)."""
    return lambda xs, *attrs: evaluate([x.astype(np.float32) if narrow(x.dtype) else x for x in xs], *attrs)


@functools.cache
def implementation(op):
    """The reference semantics of ``op`` (its record's ``evaluate``), taking narrow floats in float32 where the op
    computes in float32 (``Op.computes_in_float32``)."""
    if op.evaluate is None:
        raise NotImplementedError(f"{op.name} has no reference semantics")
    if op.computes_in_float32 is None:
        return op.evaluate
    return _in_float32(op.evaluate, op.computes_in_float32)
