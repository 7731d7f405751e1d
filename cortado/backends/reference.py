"""The reference interpreter: every op evaluated with NumPy, term by term. It is the oracle.

It favours being obviously right over being fast: each op is one NumPy call (or a short,
numerically stable formula), intermediates are freed once their last user has run, and floating
results can be computed in float64 throughout (``precision="float64"``).
"""

import numpy as np

from ..errors import BackendError, DTypeError
from ..exprgraph import feeds as feed_checks
from ..exprgraph.graph import Graph
from ..exprgraph.ops import UFUNC_OPS, ufunc_loop
from ..exprgraph.term import Term

PRECISIONS = (None, "float64")


def _floating(x):
    """``x`` in the floating dtype NumPy's exp would compute it in (ints and bools widen)."""
    return x if x.dtype.kind == "f" else x.astype(ufunc_loop(np.exp, (x.dtype,))[-1])


def _sigmoid(x):
    x = _floating(x)
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _shifted(x, axes):
    """``x - max(x)`` over ``axes`` and the max, with infinite maxima replaced by 0."""
    x = _floating(x)
    peak = np.max(x, axis=axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    return x - peak, peak


def _logsumexp(x, axes, keepdims):
    shifted, peak = _shifted(x, axes)
    result = np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True)) + peak
    return result if keepdims else np.squeeze(result, axis=axes)


def _softmax(x, axes):
    shifted, _ = _shifted(x, axes)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axes, keepdims=True)


def _log_softmax(x, axes):
    shifted, _ = _shifted(x, axes)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))


def _ufunc_implementation(ufunc):
    return lambda xs: ufunc(*xs)


IMPLEMENTATIONS = {name: _ufunc_implementation(ufunc) for name, ufunc in UFUNC_OPS.items()}
IMPLEMENTATIONS.update({
    "sigmoid": lambda xs: _sigmoid(xs[0]),
    "relu": lambda xs: np.maximum(xs[0], 0),
    "where": lambda xs: np.where(*xs),
    "cast": lambda xs, dtype: xs[0].astype(dtype),
    "sum": lambda xs, axes, keepdims: np.sum(xs[0], axis=axes, keepdims=keepdims),
    "mean": lambda xs, axes, keepdims: np.mean(xs[0], axis=axes, keepdims=keepdims),
    "max": lambda xs, axes, keepdims: np.max(xs[0], axis=axes, keepdims=keepdims),
    "logsumexp": lambda xs, axes, keepdims: _logsumexp(xs[0], axes, keepdims),
    "softmax": lambda xs, axes: _softmax(xs[0], axes),
    "log_softmax": lambda xs, axes: _log_softmax(xs[0], axes),
    "matmul": lambda xs: np.matmul(*xs),
    "einsum": lambda xs, subscripts: np.einsum(subscripts, *xs),
    "transpose": lambda xs, axes: np.transpose(xs[0], axes),
    "reshape": lambda xs, shape: np.reshape(xs[0], shape),
    "broadcast_to": lambda xs, shape: np.broadcast_to(xs[0], shape),
})


def _result_dtype(term, widen):
    if widen and term.dtype.kind == "f":
        return np.dtype(np.float64)
    return term.dtype


def _apply(term, args, widen):
    """One op with NumPy; in float64 mode a floating result is computed from float64 operands."""
    attrs = term.attrs
    if widen and term.dtype.kind == "f":
        args = [a if a.dtype.kind == "f" else a.astype(np.float64) for a in args]
        if term.op.name == "cast":
            attrs = (np.dtype(np.float64),)  # in exact arithmetic a float cast is the identity
    try:
        return IMPLEMENTATIONS[term.op.name](args, *attrs)
    except (ArithmeticError, ValueError) as error:  # e.g. integers fed negative integer powers
        raise BackendError(f"{term!r}, built at {term.where_built}, failed on these values: {error}") from None


def evaluate(outputs, feeds, precision=None):
    """The values of ``outputs`` given ``feeds`` (``{name or var: array}``), as NumPy arrays.

    ``precision=None`` computes in the dtypes the graph declares; ``precision="float64"``
    computes every floating value in float64 (inputs, constants and intermediates alike), for
    use as a high-precision reference. Returns one array for one term, else a list.
    """
    if precision not in PRECISIONS:
        raise DTypeError(f"evaluate: precision must be one of {PRECISIONS}, not {precision!r}")
    widen = precision == "float64"
    graph = Graph(outputs)
    bound = feed_checks.bind(graph.variables_by_name(), feeds)
    remaining = {term: len(readers) for term, readers in graph.users.items()}
    for out in graph.outputs:
        remaining[out] += 1  # outputs stay alive until returned
    values = {}
    with np.errstate(all="ignore"):
        for term in graph.schedule:
            if term.op.name == "var":
                value = np.asarray(bound[term])
            elif term.op.name == "const":
                value = term.attrs[0].array
            else:
                value = _apply(term, [values[a] for a in term.args], widen)
            values[term] = np.asarray(value).astype(_result_dtype(term, widen), copy=False)
            for arg in term.args:
                remaining[arg] -= 1
                if remaining[arg] == 0:
                    del values[arg]
    results = [np.array(values[out]) for out in graph.outputs]
    return results[0] if isinstance(outputs, Term) else results
