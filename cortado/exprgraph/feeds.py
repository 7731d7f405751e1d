"""Checking the values given for a graph's variables, before anything runs.

Every backend binds feeds through here, so a missing, extra, misshapen or mistyped feed gets the
same clear error everywhere, naming the variable and where it was declared.
"""

import numpy as np

from ..errors import DTypeError, FeedError, ShapeError
from .dtypes import type_string
from .term import Term


def _declared(var):
    return f"variable {var.name!r} : {type_string(var.shape, var.dtype)} (declared at {var.where_built})"


def _by_name(feeds):
    named = {}
    for key, value in feeds.items():
        if isinstance(key, Term):
            if key.op.name != "var":
                raise FeedError(f"feeds are keyed by variable or name; {key!r} is not a variable")
            key = key.name
        elif not isinstance(key, str):
            raise FeedError(f"feeds are keyed by variable or name, not {type(key).__name__} {key!r}")
        if key in named:
            raise FeedError(f"variable {key!r} is fed twice")
        named[key] = value
    return named


def _conform(var, value):
    """``value`` as an array of the variable's shape and dtype, or a clear error."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        if value.dtype != var.dtype:
            raise DTypeError(
                f"the feed for {_declared(var)} has dtype {value.dtype}; "
                f"convert it with .astype({var.dtype.name!r})"
            )
        array = value
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as error:
            raise DTypeError(f"the feed for {_declared(var)} is not array-like: {error}") from None
        if not np.can_cast(array.dtype, var.dtype, "same_kind"):
            raise DTypeError(f"the feed for {_declared(var)} holds {array.dtype} values")
        array = array.astype(var.dtype)
    if tuple(array.shape) != var.shape:
        raise ShapeError(f"the feed for {_declared(var)} has shape {tuple(array.shape)}")
    return array


def bind(variables_by_name, feeds):
    """``{var: array}`` for every variable, checked against ``feeds`` (name or var -> value)."""
    named = _by_name(dict(feeds))
    missing = sorted(set(variables_by_name) - set(named))
    if missing:
        listed = "; ".join(_declared(variables_by_name[name]) for name in missing)
        raise FeedError(f"no feed for {listed}")
    extra = sorted(set(named) - set(variables_by_name))
    if extra:
        known = ", ".join(sorted(variables_by_name)) or "none"
        raise FeedError(f"feeds {extra} name no variable of the graph (its variables: {known})")
    return {var: _conform(var, named[name]) for name, var in variables_by_name.items()}
