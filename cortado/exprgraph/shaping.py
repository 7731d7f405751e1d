"""NumPy's helpers that move, add and drop axes (``expand_dims``, ``squeeze``, ``swapaxes``, ``moveaxis``,
``stack``) and make filled tensors (``zeros``, ``ones``, ``full``, their ``_like`` forms, ``arange``), written with
``reshape``, ``transpose``, ``concatenate`` and constants, so that each has their semantics, kernels and
derivatives. A filled tensor is one scalar broadcast, never a dense constant. Errors name the call as written
(``ct._as_written``), not the ops it builds."""

import numpy as np

from . import constructors as ct
from .dtypes import as_dtype
from .ops.reductions import normalize_axes, one_axis
from .slicing import concatenate
from .term import RuleViolation, dtype_violation, rejection, shape_violation

__all__ = ["expand_dims", "squeeze", "swapaxes", "moveaxis", "stack", "zeros", "ones", "full", "zeros_like",
           "ones_like", "full_like", "arange"]


def _axes(function, terms, axis, ndim):
    """``axis`` (an int or a tuple of them, negative from the end) as sorted non-negative ints below ``ndim``, each
    once; else the error names ``function``."""
    try:
        if axis is None:
            raise shape_violation("axis is an int or a tuple of ints, not None")
        return normalize_axes(axis, ndim)
    except RuleViolation as violation:
        raise rejection(function, terms, violation) from None


def expand_dims(a, axis):
    """``a`` with an axis of size 1 at ``axis`` (an int or a tuple, counted in the result's axes)."""
    x = ct.as_term(a)
    count = len(axis) if isinstance(axis, (tuple, list)) else 1
    axes = _axes("expand_dims", [x], axis, x.ndim + count)
    shape = list(x.shape)
    for position in axes:
        shape.insert(position, 1)
    return ct.reshape(x, tuple(shape))


def squeeze(a, axis=None):
    """``a`` without its axes of size 1 (None), or without those of ``axis``, each of which must be of size 1."""
    x = ct.as_term(a)
    axes = tuple(i for i, n in enumerate(x.shape) if n == 1) if axis is None else _axes("squeeze", [x], axis, x.ndim)
    wide = [i for i in axes if x.shape[i] != 1]
    if wide:
        raise rejection("squeeze", [x], shape_violation(
            f"axis {wide[0]} has size {x.shape[wide[0]]}: only axes of size 1 are squeezed out"))
    return ct.reshape(x, tuple(n for i, n in enumerate(x.shape) if i not in axes))


def swapaxes(a, axis1, axis2):
    """``a`` with axes ``axis1`` and ``axis2`` exchanged (PyTorch's ``transpose(dim0, dim1)``)."""
    x = ct.as_term(a)
    try:
        first, second = one_axis(axis1, x.ndim), one_axis(axis2, x.ndim)
    except RuleViolation as violation:
        raise rejection("swapaxes", [x], violation) from None
    order = list(range(x.ndim))
    order[first], order[second] = second, first
    return ct.transpose(x, tuple(order))


def moveaxis(a, source, destination):
    """``a`` with the axes ``source`` moved to the places ``destination`` (ints or tuples of one length), the
    other axes kept in their order."""
    x = ct.as_term(a)
    sources, destinations = _listed(source), _listed(destination)
    if len(sources) != len(destinations):
        raise rejection("moveaxis", [x], shape_violation(
            f"source {source!r} and destination {destination!r} name different numbers of axes"))
    try:
        sources = [one_axis(s, x.ndim) for s in sources]
        destinations = [one_axis(d, x.ndim) for d in destinations]
    except RuleViolation as violation:
        raise rejection("moveaxis", [x], violation) from None
    for named in (sources, destinations):
        if len(set(named)) != len(named):
            raise rejection("moveaxis", [x], shape_violation(f"repeated axis in {named}"))
    order = [i for i in range(x.ndim) if i not in sources]
    for place, axis in sorted(zip(destinations, sources)):
        order.insert(place, axis)
    return ct.transpose(x, tuple(order))


def _listed(axes):
    """One axis or a sequence of them, as a list."""
    return list(axes) if isinstance(axes, (tuple, list)) else [axes]


@ct._as_written
def stack(arrays, axis=0):
    """NumPy's ``stack``: the operands, of one shape, joined along a new axis ``axis``."""
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise rejection("stack", (), shape_violation("takes a non-empty list or tuple of tensors"))
    terms = [ct.as_term(a) for a in arrays]
    shapes = {t.shape for t in terms}
    if len(shapes) > 1:
        raise rejection("stack", terms, shape_violation(
            f"the tensors must have one shape, not {', '.join(str(s) for s in sorted(shapes))}"))
    return concatenate([expand_dims(t, axis) for t in terms], axis=axis)


@ct._as_written
def full(shape, fill_value, dtype=None):
    """A tensor of ``shape`` holding ``fill_value`` (in ``dtype``, which must hold it; None: NumPy's dtype of the
    value)."""
    value = ct.const(np.asarray(fill_value)) if dtype is None else ct.const(fill_value, dtype)
    return ct.broadcast_to(value, tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))


@ct._as_written
def zeros(shape, dtype="float32"):
    """Zeros of ``shape`` and ``dtype`` (float32 unless given, as ``ct.var``)."""
    return full(shape, 0, dtype)


@ct._as_written
def ones(shape, dtype="float32"):
    """Ones of ``shape`` and ``dtype`` (float32 unless given, as ``ct.var``)."""
    return full(shape, 1, dtype)


@ct._as_written
def full_like(a, fill_value, dtype=None):
    """A tensor of ``a``'s shape holding ``fill_value``, in ``a``'s dtype unless ``dtype`` is given."""
    x = ct.as_term(a)
    return full(x.shape, fill_value, x.dtype if dtype is None else dtype)


@ct._as_written
def zeros_like(a, dtype=None):
    """Zeros of ``a``'s shape, in ``a``'s dtype unless ``dtype`` is given."""
    return full_like(a, 0, dtype)


@ct._as_written
def ones_like(a, dtype=None):
    """Ones of ``a``'s shape, in ``a``'s dtype unless ``dtype`` is given."""
    return full_like(a, 1, dtype)


def arange(start, stop=None, step=1, dtype=None):
    """NumPy's ``arange``: the values from ``start`` (0 where ``stop`` is not given) up to ``stop`` (exclusive) by
    ``step``, a constant. Numbers only; a step of 0, and integers ``dtype`` cannot hold (NumPy would wrap them), are
    refused."""
    start, stop = (0, start) if stop is None else (start, stop)
    given = (start, stop, step)
    if not all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in given):
        raise rejection("arange", [], shape_violation(f"start, stop and step are numbers, not {given!r}"))
    if not all(np.isfinite(v) for v in given) or step == 0:
        raise rejection("arange", [], shape_violation(f"start, stop and step are finite and step is not 0, not "
                                                      f"{given!r}"))
    values = np.arange(start, stop, step)
    if dtype is None:
        return ct.const(values)
    dtype = as_dtype(dtype)
    held = values.astype(dtype)
    if dtype.kind in "iu" and len(values) and not np.array_equal(held, values):
        raise rejection("arange", [], dtype_violation(f"{dtype.name} cannot hold the values from {values[0]} to "
                                                      f"{values[-1]}"))
    return ct.const(held)
