"""The reference interpreter: every op evaluated with NumPy, term by term. It is the oracle.

It favours being obviously right over being fast: each op is one NumPy call (or a short,
numerically stable formula), intermediates are freed once their last user has run, and floating
results can be computed in float64 throughout (``precision="float64"``).
"""

import numpy as np

from ..errors import BackendError, DTypeError, IndexRangeError
from ..exprgraph import feeds as feed_checks, gathering
from ..exprgraph.dtypes import is_float
from ..exprgraph.graph import Graph, schedule
from ..exprgraph.ops import CAST, CONST, FUSED_OP, PARAM, VAR
from ..exprgraph.semantics import implementation
from ..exprgraph.term import Term

PRECISIONS = (None, "float64")


def _result_dtype(term, widen):
    if widen and is_float(term.dtype):
        return np.dtype(np.float64)
    return term.dtype


def _apply(term, args, widen):
    """One op with NumPy; in float64 mode a floating result is computed from float64 operands."""
    if term.op is FUSED_OP:
        return _fused(term, args, widen)
    attrs = term.attrs
    if widen and is_float(term.dtype):
        args = [a if is_float(a.dtype) or k in term.op.positions else a.astype(np.float64) for k, a in enumerate(args)]
        if term.op is CAST:
            attrs = attrs._replace(dtype=np.dtype(np.float64))  # in exact arithmetic a float cast is the identity
    try:
        return implementation(term.op)(args, *attrs)
    except (ArithmeticError, ValueError) as error:  # e.g. integers fed negative integer powers
        raise BackendError(f"{term!r}, built at {term.where_built}, failed on these values: {error}") from None
    except IndexRangeError as error:  # only gathers raise it
        raise gathering.out_of_range(term, error) from None


def _value(term, values, variable, widen):
    """``term``'s value, its arguments' values in ``values``; ``variable(term)`` for a variable (or a fused
    body's parameter)."""
    if term.op in (VAR, PARAM):
        value = variable(term)
    elif term.op is CONST:
        value = term.attr("value").array
    else:
        value = np.asarray(_apply(term, [values[a] for a in term.args], widen))
        _check_agrees(term, value, widen)
    return np.asarray(value).astype(_result_dtype(term, widen), copy=False)


def _check_agrees(term, value, widen):
    """Refuse ``value``, what ``term``'s op computed, where its shape is not the term's, or its dtype is of another
    kind or (an integer or bool) not the term's own: the op's record and its ``evaluate`` disagree, and the cast to the
    term's dtype would hide it (an int8 running sum computed in int64 wraps when cast back). A floating value may be
    of any width: an op computes in float32 where it says so, and its result is rounded once to the term's dtype."""
    if value.shape != term.shape:
        raise RuntimeError(f"internal error: {term.op.name}'s evaluate gave a value of shape {value.shape} for "
                           f"{term!r}, whose shape rule says {term.shape}: the op's record and its evaluation disagree")
    declared = _result_dtype(term, widen)
    if not (is_float(value.dtype) if is_float(declared) else value.dtype == declared):
        raise RuntimeError(f"internal error: {term.op.name}'s evaluate gave a value of {value.dtype} for {term!r}, "
                           f"whose dtype rule says {declared}: the op's record and its evaluation disagree")


def _fused(term, args, widen):
    """Output ``index`` of a fused region: its body evaluated with the operands as parameters."""
    outputs, index = term.attr("outputs"), term.attr("index")
    values = {}
    for t in schedule(outputs[index]):
        values[t] = _value(t, values, lambda p: args[p.attr("index")], widen)
    return values[outputs[index]]


def evaluate(outputs, feeds, precision=None):
    """The values of ``outputs`` given ``feeds`` (``{name or var: array}``), as NumPy arrays.

    ``precision=None`` computes in the dtypes the graph declares; ``precision="float64"``
    computes every floating value in float64 (inputs, constants and intermediates alike), for
    use as a high-precision reference; a floating variable may then be fed float64 values.
    Returns one array for one term, else a list.
    """
    if precision not in PRECISIONS:
        raise DTypeError(f"evaluate: precision must be one of {PRECISIONS}, not {precision!r}")
    widen = precision == "float64"
    graph = Graph(outputs)
    bound = feed_checks.bind(graph.variables_by_name(), feeds, any_float=widen)
    remaining = {term: len(readers) for term, readers in graph.users.items()}
    for out in graph.outputs:
        remaining[out] += 1  # outputs stay alive until returned
    values = {}
    with np.errstate(all="ignore"):
        for term in graph.schedule:
            values[term] = _value(term, values, bound.__getitem__, widen)
            for arg in term.args:
                remaining[arg] -= 1
                if remaining[arg] == 0:
                    del values[arg]
    results = [np.array(values[out]) for out in graph.outputs]
    return results[0] if isinstance(outputs, Term) else results
