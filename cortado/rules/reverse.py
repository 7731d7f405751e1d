"""The reverse walk that ``ct.grad`` and ``ct.vjp`` run, and that derivative rules may run themselves: an op whose
own gradient is one op (``attention_grad``) gets its second derivative by walking its meaning spelled out in plain
ops (``rules.attention_vjps``), which is why the walk lives with the rules, under the driver (``cortado.grad``).
"""

import numpy as np

from ..errors import DTypeError, ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float, is_float8
from ..exprgraph.ops import ELEMENTWISE


def backpropagate(order, outputs, cotangents, variables, rules, trace=None):
    """``{variable: its adjoint}`` for the ``variables`` that the outputs depend on.

    ``order`` is the outputs' schedule; ``rules.vjp(term, position, adjoint, trace)`` gives the
    VJP of a term's adjoint with respect to one of its inputs.
    """
    wanted = set(variables)
    active = set()  # floating terms that depend on a wanted variable
    for term in order:
        if term in wanted or (is_float(term.dtype) and any(a in active for a in term.args)):
            active.add(term)
    pending = {}
    for out, cotangent in zip(outputs, cotangents):
        if out in active:
            pending.setdefault(out, []).append(cotangent)
    adjoints = {}
    for term in reversed(order):
        parts = pending.pop(term, None)
        if parts is None:
            continue
        adjoint = sum(parts[1:], start=parts[0])
        if term in wanted:
            adjoints[term] = adjoint
        for position, arg in enumerate(term.args):
            if arg in active:
                vjp = rules.vjp(term, position, adjoint, trace)
                if vjp is not None:
                    pending.setdefault(arg, []).append(_fitted(vjp, arg, term))
    return adjoints


def _fitted(vjp, arg, term):
    """``vjp`` summed over the axes along which ``arg`` was broadcast, in ``arg``'s dtype; a float8 value's in
    float32 (a cotangent rounded to float8 without a scale would lose most of its values: it passes through a
    cast to float8 as through the identity, and is quantized only where the model says so)."""
    if not is_float(vjp.dtype):
        raise DTypeError(f"the derivative rule of {term.op.name} gave a VJP of {vjp.dtype} for the input {arg!r} of "
                         f"{term!r}; a VJP is floating")
    if vjp.shape != arg.shape:
        lead = vjp.ndim - arg.ndim
        axes = tuple(i for i in range(vjp.ndim) if vjp.shape[i] != 1 and (i < lead or arg.shape[i - lead] == 1))
        if not _sums_to(vjp.shape, arg.shape):
            raise ShapeError(f"the derivative rule of {term.op.name} gave a VJP of shape {vjp.shape} "
                             f"for the input {arg!r} of {term!r}; it cannot be summed to {arg.shape}")
        if term.op.kind == ELEMENTWISE and not _along_the_term(vjp.shape, term.shape, axes):
            raise ShapeError(f"the derivative rule of {term.op.name} gave a VJP of shape {vjp.shape} "
                             f"for the input {arg!r} of {term!r}: an elementwise op's VJP has the input's shape, or "
                             f"the term's {term.shape} along the axes where the input was broadcast")
        if axes:  # kept where the input has them, so a row's sum broadcasts back without a reshape (a row kernel)
            vjp = ct.sum(vjp, axis=axes, keepdims=not lead)
        if vjp.shape != arg.shape:
            vjp = ct.reshape(vjp, arg.shape)
    dtype = np.dtype(np.float32) if is_float8(arg.dtype) else arg.dtype
    if vjp.dtype != dtype:
        vjp = ct.cast(vjp, dtype)
    return vjp


def _sums_to(shape, target):
    """Whether a value of ``shape`` sums, over its leading axes and those where ``target`` has 1, to ``target``."""
    lead = len(shape) - len(target)
    return lead >= 0 and all(target[i - lead] in (1, shape[i]) for i in range(lead, len(shape)))


def _along_the_term(shape, term_shape, summed):
    """Whether each of the ``summed`` axes of a value of ``shape`` is one of the term's, of its size (aligned at the
    right): an elementwise op's input is broadcast only along its result's axes (a contraction's may be along one it
    contracts: ``einsum("ij,j->i")`` of a (1,) operand)."""
    past = len(shape) - len(term_shape)
    return all(i >= past and term_shape[i - past] == shape[i] for i in summed)
