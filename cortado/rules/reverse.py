"""The reverse walk that ``ct.grad`` and ``ct.vjp`` run, and that derivative rules may run themselves: an op whose
own gradient is one op (``attention_grad``) gets its second derivative by walking its meaning spelled out in plain
ops (``rules.attention_shares``), which is why the walk lives with the rules, under the driver (``cortado.grad``).
"""

from ..errors import ShapeError
from ..exprgraph import constructors as ct
from ..exprgraph.dtypes import is_float


def backpropagate(order, outputs, cotangents, variables, rules, trace=None):
    """``{variable: its adjoint}`` for the ``variables`` that the outputs depend on.

    ``order`` is the outputs' schedule; ``rules.share(term, position, adjoint, trace)`` gives an
    input's share of a term's adjoint.
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
                share = rules.share(term, position, adjoint, trace)
                if share is not None:
                    pending.setdefault(arg, []).append(_fitted(share, arg, term))
    return adjoints


def _fitted(share, arg, term):
    """``share`` summed over the axes along which ``arg`` was broadcast, in ``arg``'s dtype."""
    if share.shape != arg.shape:
        lead = share.ndim - arg.ndim
        if lead < 0 or any(arg.shape[i - lead] not in (1, share.shape[i]) for i in range(lead, share.ndim)):
            raise ShapeError(f"the derivative rule of {term.op.name} gave a share of shape {share.shape} "
                             f"for the input {arg!r} of {term!r}; it cannot be summed to {arg.shape}")
        axes = tuple(i for i in range(share.ndim) if share.shape[i] != 1 and (i < lead or arg.shape[i - lead] == 1))
        if axes:  # kept where the input has them, so a row's sum broadcasts back without a reshape (a row kernel)
            share = ct.sum(share, axis=axes, keepdims=not lead)
        if share.shape != arg.shape:
            share = ct.reshape(share, arg.shape)
    if share.dtype != arg.dtype:
        share = ct.cast(share, arg.dtype)
    return share
