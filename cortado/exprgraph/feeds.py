"""Checking the values given for a graph's variables, before anything runs.

Every backend binds feeds through here, so a missing, extra, misshapen or mistyped feed gets the
same clear error everywhere, naming the variable and where it was declared.
"""

import numpy as np

from ..errors import DTypeError, FeedError, ShapeError
from .dtypes import finfo, is_float, kind_of, type_string
from .ops import VAR
from .term import Term


def _declared(var):
    return f"variable {var.name!r} : {type_string(var.shape, var.dtype)} (declared at {var.where_built})"


def _by_name(feeds, variables_by_name):
    named = {}
    for key, value in feeds.items():
        if isinstance(key, Term):
            if key.op is not VAR:
                raise FeedError(f"feeds are keyed by variable or name; {key!r} is not a variable")
            own = variables_by_name.get(key.name)
            if own is not None and own is not key:
                raise FeedError(f"a feed is keyed by {_declared(key)}, which is not the graph's {_declared(own)}; "
                                f"key the feed by the graph's variable, or by its name")
            key = key.name
        elif not isinstance(key, str):
            raise FeedError(f"feeds are keyed by variable or name, not {type(key).__name__} {key!r}")
        if key in named:
            raise FeedError(f"variable {key!r} is fed twice")
        named[key] = value
    return named


# Python values (lists, scalars) may feed a variable of their kind or a wider one: bools feed
# anything, ints feed ints and floats, floats feed floats only (never truncated into ints).
_KIND_RANK = {"b": 0, "i": 1, "u": 1, "f": 2}


def _from_python(var, value, what):
    try:
        inferred = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise DTypeError(f"{what} {_declared(var)} is not array-like: {error}") from None
    kind = kind_of(inferred.dtype)
    if kind not in _KIND_RANK or _KIND_RANK[kind] > _KIND_RANK[kind_of(var.dtype)]:
        raise DTypeError(f"{what} {_declared(var)} holds {inferred.dtype} values")
    try:
        with np.errstate(over="ignore"):
            array = np.asarray(value, dtype=var.dtype)
    except OverflowError as error:
        raise DTypeError(f"{what} {_declared(var)} holds a value out of range: {error}") from None
    if is_float(var.dtype):  # a number beyond the dtype's largest would be infinite
        lost = np.isfinite(inferred) & ~np.isfinite(array.astype(np.float64))
        if np.any(lost):
            where = tuple(int(i) for i in np.argwhere(lost)[0])
            raise DTypeError(f"{what} {_declared(var)} holds {inferred[where].item()!r} at {where}, beyond "
                             f"{var.dtype.name}'s largest, {float(finfo(var.dtype).max):g}")
    return array


def _conform(var, value, any_float, what, compiled=False):
    """``value`` as an array of the variable's shape and dtype, or a clear error that calls it ``what`` (the feed
    for, the value written to); ``compiled``: fed to a compiled program, whose shapes are fixed."""
    if isinstance(value, Term):
        raise DTypeError(f"{what} {_declared(var)} is a cortado term; feeds are values (arrays)")
    if type(value).__module__.split(".")[0] == "torch":
        raise DTypeError(f"{what} {_declared(var)} is a torch tensor; feed a NumPy array (tensor.numpy()) or, on the "
                         f"GPU, a CuPy array (cupy.from_dlpack(tensor))")
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        widened = any_float and is_float(value.dtype) and is_float(var.dtype)
        if value.dtype != var.dtype and not widened:
            raise DTypeError(
                f"{what} {_declared(var)} has dtype {value.dtype}; "
                f"convert it with .astype({var.dtype.name!r})"
            )
        array = value
    else:
        array = _from_python(var, value, what)
    if tuple(array.shape) != var.shape:
        hint = _batch_hint(var, array) if compiled else ""
        raise ShapeError(f"{what} {_declared(var)} has shape {tuple(array.shape)}{hint}")
    return array


def _batch_hint(var, array):
    """What to do where a program's feed is its variable's shape but for a shorter leading axis (an epoch's last,
    smaller batch): a compiled program takes the shapes it was built for."""
    if array.ndim != len(var.shape) or array.ndim == 0 or tuple(array.shape[1:]) != var.shape[1:] \
            or array.shape[0] >= var.shape[0]:
        return ""
    return ("; a program runs on the shapes it was compiled for: drop a last, smaller batch, or compile a step for "
            "that shape and move the state across with ct.load_state_dict (docs/training.md, one batch shape)")


def bind(variables_by_name, feeds, any_float=False, state=(), what="the feed for", compiled=False):
    """``{var: array}`` for every variable, checked against ``feeds`` (name or var -> value).

    ``any_float=True`` lets a floating variable take a feed of any floating dtype, as it is
    kept: for a computation that widens every float anyway. ``state``: the names a program keeps as
    state, which a feed naming one is told how to set. ``what``: how an error calls a value (a state
    variable's first value or a value written to it is no feed). ``compiled``: the feeds of a compiled program's
    call, whose error for an epoch's last, smaller batch says what to do.
    """
    if isinstance(feeds, dict) and all(type(key) is str for key in feeds):  # by name: the usual call, kept cheap
        named = feeds
    else:
        try:
            named = _by_name(dict(feeds), variables_by_name)
        except (TypeError, ValueError):
            raise FeedError(f"feeds must be a mapping from names or variables to values, not {feeds!r}") from None
    if named.keys() != variables_by_name.keys():
        missing = sorted(set(variables_by_name) - set(named))
        extra = sorted(set(named) - set(variables_by_name))
        if missing:
            listed = "; ".join(_declared(variables_by_name[name]) for name in missing)
            unknown = [name for name in extra if name not in state]
            also = f" (and {unknown} name no variable of the graph: a misspelling?)" if unknown else ""
            raise FeedError(f"no feed for {listed}{also}")
        known = ", ".join(sorted(variables_by_name)) or "none"
        kept = [name for name in extra if name in state]
        if kept:
            raise FeedError(f"feeds {kept} name the program's state, which a call does not feed (its inputs: {known}): "
                            f"set it with program.state[{kept[0]!r}] = value")
        if compiled:
            raise FeedError(f"feeds {extra} name no input of the program (its inputs: {known}"
                            + (f"; its state: {', '.join(sorted(state))}" if state else "") + ")")
        why = "" if variables_by_name else (": it is a constant, which depends on no variable (a gradient of a sum, "
                                            "say, is ones whatever its variable holds); evaluate it with no feeds")
        raise FeedError(f"feeds {extra} name no variable of the graph (its variables: {known}){why}")
    return {var: _conform(var, named[name], any_float, what, compiled) for name, var in variables_by_name.items()}
