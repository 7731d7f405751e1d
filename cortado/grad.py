"""Reverse-mode differentiation: ``ct.grad``, ``ct.vjp`` and ``ct.hvp``.

The outputs are first stabilised (``cortado.rules.stability``, to a fixpoint, as ``compile``
stabilises a model), so the gradient of ``log(sum(exp(x)))`` is that of ``logsumexp(x)``, a
softmax, finite where the fragile form's is nan. The driver then walks the graph from the
outputs back to the variables once. At each term it asks the derivative rules
(``cortado.rules.derivatives``, data) for each input's VJP (its part of the term's adjoint),
undoes broadcasting by summing a VJP over the axes its input was stretched along, casts it to
its input's dtype, and adds up the VJPs an input receives. Only floating terms that depend on a
variable asked for carry adjoints, so nothing is built for the rest of the graph. The gradients
are simplified, with the model's own terms kept as the user wrote them (stabilised), so
gradients and model share those terms (evaluated together, or compiled, which stabilises the
model the same way, nothing is computed twice) and the gradients carry no ``* 1`` or ``+ 0``.

This module is the driver only; the derivative rules, ``stability`` and ``simplify`` belong to
the rules stage. The driver applies them, so it sits above both the IR and the rules: the IR
(``cortado.exprgraph``) never imports the rules.
"""

import weakref
from collections.abc import Mapping

import numpy as np

from .errors import DTypeError, GradError, ShapeError
from .exprgraph.dtypes import is_float, is_float8, kind_of, type_string
from .exprgraph.graph import as_outputs, folded, schedule
from .exprgraph.operands import strong_const
from .exprgraph.ops import VAR
from .exprgraph.term import Term
from .rules import derivatives
from .rules.api import gradient_simplifier
from .rules.derivatives import Derivatives
from .rules.reverse import backpropagate
from .rules.stability import stabiliser

# every gradient ``vjp`` has returned and that is still alive: ``compile(..., data_parallel=True)`` averages these
# over the ranks where an update reads them (``cortado.distributed.rewrite``)
_returned = weakref.WeakSet()


# each such gradient -> the variables it was returned as the gradient of (one term may be several's: zeros, say)
_of = weakref.WeakKeyDictionary()


def is_gradient(term):
    """Whether ``term`` is a gradient that ``grad``, ``vjp`` or ``hvp`` returned (terms are shared: one built the same
    way is the same term)."""
    return term in _returned


def gradient_of(term):
    """The variables ``term`` was returned as the gradient of (empty for a term no ``grad`` returned): what an
    optimizer pairing gradients with parameters checks them by. Empty for a variable or a constant too: terms are
    shared, so zeros are any variable's gradient, and the gradient of ``sum(v * x)`` in ``v`` is ``x`` itself."""
    if term.op.name in ("var", "const"):
        return frozenset()
    return frozenset(_of.get(term, ()))


def gradients_made_from(term, memo):
    """The variables whose ``grad`` gradients ``term`` is made from: its own (``gradient_of``), or those of the
    gradients it computes with (a gradient scaled, clipped or averaged), the walk stopping at each gradient it meets.
    ``memo`` (a dict) is shared by the calls on one graph, so each term is looked at once."""
    return folded(term, memo, lambda t: frozenset().union(*(memo[a] for a in t.args)),
                  lambda t: gradient_of(t) or None)


def grad(y, wrt, *, rules=None, trace=None):
    """The gradient of the scalar ``y`` with respect to ``wrt``: a variable, a list of them, or a dict of them (a
    model's ``parameters()``).

    Returns an expression (a list of them for a list, a dict with the same keys for a dict) of each variable's shape
    and dtype; a
    variable ``y`` does not depend on gets zeros. ``rules`` replaces the derivative rules
    (``cortado.rules.derivatives``, extended with ``+``, say), and ``trace`` (a
    ``cortado.rules.Trace``) collects the stability rewrites of ``y``, the derivative rules
    applied and the simplifications made.
    """
    if not isinstance(y, Term):
        raise GradError(f"grad takes one scalar output (a cortado term), not {type(y).__name__} {y!r}; "
                        f"for several outputs use ct.vjp")
    if y.shape != ():
        raise ShapeError(
            f"grad needs a scalar output, but {y!r} (built at {y.where_built}) has shape {y.shape}; "
            f"take ct.grad(ct.sum(y), wrt), or ct.vjp(y, wrt, cotangent) with a cotangent of that shape"
        )
    return vjp(y, wrt, 1, rules=rules, trace=trace)


def vjp(outputs, wrt, cotangents, *, rules=None, trace=None):
    """The vector-Jacobian product: ``sum_i <cotangents[i], d outputs[i] / d wrt>`` for each of ``wrt``.

    ``outputs`` is a term or a list; ``cotangents`` gives one per output (one value for one
    term), each of its output's shape and dtype: a term (for a symbolic cotangent, as in a
    Hessian-vector product), an array, or a number for every element. ``rules`` and ``trace``
    are as for ``grad``.
    """
    if rules is None:
        rules = derivatives
    elif not isinstance(rules, Derivatives):
        raise GradError(f"rules must be a set of derivative rules, such as ct.rules.derivatives + "
                        f"Derivative(...), not {type(rules).__name__} {rules!r}")
    keys = list(wrt) if isinstance(wrt, Mapping) else None
    variables = variables_of(list(wrt.values()) if keys is not None else wrt)
    outputs_given = isinstance(outputs, Term)
    outputs = list(as_outputs(outputs))
    cotangents = _cotangents(outputs, [cotangents] if outputs_given else cotangents)
    outputs = stabiliser.run(outputs, trace)
    model = schedule(outputs)
    adjoints = backpropagate(model, outputs, cotangents, variables, rules, trace)
    gradients = [adjoints[v] if v in adjoints else _zeros(v) for v in variables]
    gradients = gradient_simplifier.run(gradients, trace, model)  # stop_gradient kept: gradients are differentiable
    _returned.update(gradients)
    for v, g in zip(variables, gradients):
        _of.setdefault(g, set()).add(v)
    if keys is not None:
        return dict(zip(keys, gradients))
    return gradients[0] if isinstance(wrt, Term) else gradients


def hvp(y, wrt, vectors, *, rules=None, trace=None):
    """The Hessian of the scalar ``y`` times ``vectors`` (one per variable of ``wrt``), by
    differentiating the gradient in the direction of the vectors (reverse over reverse)."""
    if not isinstance(wrt, Term):
        wrt, vectors = _sequence(wrt, "wrt"), _sequence(vectors, "vectors")
        if len(vectors) != len(wrt):
            raise GradError(f"hvp needs one vector per variable of wrt: {len(wrt)} variable(s), "
                            f"{len(vectors)} vector(s)")
    gradients = grad(y, wrt, rules=rules, trace=trace)
    return vjp(gradients, wrt, vectors, rules=rules, trace=trace)


def _zeros(variable):
    return strong_const(np.broadcast_to(np.zeros((), variable.dtype), variable.shape))


def _sequence(value, what):
    """``value`` as a list, if it is an ordered collection (the order of a set is arbitrary)."""
    if isinstance(value, (set, frozenset, dict, str, bytes)) or not hasattr(value, "__iter__"):
        shown = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (set, frozenset, dict)) else \
            f"{type(value).__name__} {value!r}"
        raise GradError(f"{what} must be a list or tuple, not {shown}")
    return list(value)


def variables_of(wrt):
    """``wrt`` (a variable, or a list of them) as a list of floating variables, or the error that
    says what is wrong."""
    if not isinstance(wrt, Term) and not hasattr(wrt, "__iter__"):
        raise GradError(f"wrt must be a variable or a list of variables, not {type(wrt).__name__} {wrt!r}")
    items = [wrt] if isinstance(wrt, Term) else _sequence(wrt, "wrt")
    for i, v in enumerate(items):
        where = "wrt" if isinstance(wrt, Term) else f"wrt[{i}]"
        if not isinstance(v, Term) or v.op is not VAR:
            built = f" (built at {v.where_built})" if isinstance(v, Term) else ""
            raise GradError(f"{where} is {v!r}{built}, which is not a variable; gradients are taken with "
                            f"respect to variables (ct.var): make it one and substitute its expression in")
        if not is_float(v.dtype):
            raise DTypeError(f"{where} is {v!r}, of the integer or boolean dtype {v.dtype.name}; "
                             f"only floating variables have gradients")
        if is_float8(v.dtype):
            raise DTypeError(f"{where} is {v!r}, of dtype {v.dtype.name}, which holds values for products only; "
                             f"take the gradient with respect to the variable it is cast from")
    return items


def _cotangents(outputs, given):
    """One cotangent term per output, of its shape and dtype; integer outputs refused."""
    for out in outputs:
        if not is_float(out.dtype):
            raise DTypeError(f"cannot differentiate {out!r} (built at {out.where_built}): its dtype "
                             f"{out.dtype.name} is not floating, so it has no derivative")
        if is_float8(out.dtype):
            raise DTypeError(f"cannot differentiate {out!r} (built at {out.where_built}), of dtype "
                             f"{out.dtype.name}: cast it to float32 first")
    given = _sequence(given, "cotangents (one per output)")
    if len(given) != len(outputs):
        raise GradError(f"{len(outputs)} output(s) need as many cotangents, but {len(given)} were given")
    return [_cotangent(out, c) for out, c in zip(outputs, given)]


def _cotangent(out, value):
    """``value`` as a term of ``out``'s shape and dtype: a term as it is, numbers converted exactly
    enough (no overflow to inf), a single number for every element."""
    expected = type_string(out.shape, out.dtype)
    if isinstance(value, Term):
        if (value.shape, value.dtype) != (out.shape, out.dtype):
            raise GradError(f"the cotangent {value!r} of {out!r} must be a {expected}, "
                            f"not a {type_string(value.shape, value.dtype)}")
        return value
    try:
        array = np.asarray(value)
    except (OverflowError, ValueError, TypeError) as error:
        raise GradError(f"the cotangent for {out!r} is no array of numbers: {error}") from None
    if kind_of(array.dtype) not in "fiu":
        what = "values NumPy holds only as Python objects" if array.dtype.kind == "O" else array.dtype.name
        raise GradError(f"the cotangent for {out!r} must hold real numbers, not {what}")
    if array.shape not in ((), out.shape):
        raise GradError(f"the cotangent for {out!r} has shape {array.shape}; it must be a {expected} "
                        f"(or one number for every element)")
    with np.errstate(over="ignore"):
        converted = array.astype(out.dtype)
    if not np.array_equal(np.isfinite(converted), np.isfinite(array)):
        raise GradError(f"the cotangent for {out!r} holds values too large for {out.dtype.name}")
    return strong_const(np.broadcast_to(converted, out.shape))
