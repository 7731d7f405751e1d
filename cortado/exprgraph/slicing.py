"""NumPy's basic indexing (``x[1:, ::-2, None, ..., 0]``), ``concatenate`` and ``split``, written with ops
that already exist, so that each has reference semantics, CPU and GPU kernels and derivatives for free:

- a slice crops its axis with ``pad`` (negative widths) to the elements it spans, ``flip`` reverses the
  axes it walks backwards, and ``windows`` of size 1 with the step as stride takes every step-th element;
  one ``reshape`` then drops the axes of int indices and the window axes and adds the axes of ``None``.
  An index that takes everything builds nothing: ``x[:]`` and ``x[...]`` are ``x``;
- ``concatenate`` pads each operand with zeros to the full length of the axis, at its offset, and adds
  the pads; ``split`` is slices.

So gradients are those ops' own: a slice's gradient is its adjoint padded with zeros where the slice took nothing
(``pad`` with the opposite widths, ``overlap_add`` of the windows, ``flip``), concatenate's is a slice of it.
"""

import functools
import itertools
import operator
from dataclasses import dataclass

import numpy as np

from . import constructors as ct
from .dtypes import is_float, is_float8, type_string
from .ops.base import int_tuple, promoted
from .ops.reductions import one_axis
from .term import RuleViolation, Term, dtype_violation, rejection, shape_violation

__all__ = ["index", "concatenate", "split"]

GATHERING = "to gather by index terms use ct.take(x, indices, axis) or ct.take_along_axis(x, indices, axis)"


@dataclass(frozen=True)
class _Taken:
    """What an index takes of one axis: ``length`` elements from ``start``, ``step`` apart (1 where at most one is
    taken); ``kept`` is False for an int, whose axis the result drops."""

    start: int
    length: int
    step: int
    kept: bool

    @property
    def span(self):
        """The elements from the first taken to the last, in the axis' order, as ``(low, high)``."""
        if self.length == 0:
            return self.start, self.start
        last = self.start + (self.length - 1) * self.step
        return min(self.start, last), max(self.start, last) + 1


# -- basic indexing --------------------------------------------------------------------------


def index(x, key):
    """``x[key]`` with NumPy's basic indexing: ints (negative ones from the end), slices with any start, stop and
    step, ``None`` (a new axis of size 1), one ``...`` and tuples of these. Anything else is refused, naming the
    ops that gather by index."""
    try:
        taken, shape = _taken(x.shape, key)
    except RuleViolation as violation:
        raise rejection(f"{type_string(x.shape, x.dtype)}[{_spelled(key)}]", (), violation) from None
    if 0 in shape:  # nothing is taken: the first elements of each length give the shape, whatever the steps
        taken = [_Taken(0, t.length, 1, t.kept) for t in taken]
    strided = _strided(_flipped(_cropped(x, taken), taken), taken)
    return strided if strided.shape == shape else ct.reshape(strided, shape)


def _taken(shape, key):
    """``key`` as what it takes of each axis of a tensor of ``shape``, and the result's shape."""
    entries = _entries(key)
    consumed = sum(1 for e in entries if e is not None and e is not Ellipsis)
    if consumed > len(shape):
        raise shape_violation(f"too many indices: the tensor has {len(shape)} dimension(s), but {consumed} were indexed")
    ellipses = [i for i, e in enumerate(entries) if e is Ellipsis]
    if len(ellipses) > 1:
        raise shape_violation("an index can only have a single ellipsis ('...')")
    at = ellipses[0] if ellipses else len(entries)
    entries = entries[:at] + (slice(None),) * (len(shape) - consumed) + entries[at + 1:]
    taken, result, axis = [], [], 0
    for entry in entries:
        if entry is None:
            result.append(1)
            continue
        taken.append(_taken_of_axis(entry, shape[axis], axis))
        if taken[-1].kept:
            result.append(taken[-1].length)
        axis += 1
    return taken, tuple(result)


def _entries(key):
    """The key's entries, each an int, a slice, ``None`` or ``...``; any other kind of index is refused."""
    entries = key if isinstance(key, tuple) else (key,)
    return tuple(_entry(e) for e in entries)


def _entry(entry):
    if entry is None or entry is Ellipsis or isinstance(entry, slice):
        return entry
    if isinstance(entry, (bool, np.bool_)):
        raise shape_violation(f"a bool index (NumPy's boolean mask) is not supported; select with ct.where, or {GATHERING}")
    if isinstance(entry, np.ndarray) and entry.ndim == 0 and entry.dtype.kind in "iu":
        return int(entry)
    if isinstance(entry, (Term, np.ndarray, list, tuple)):
        raise shape_violation(f"indexing by an array, list or term (NumPy's advanced indexing) is not supported; "
                              f"{GATHERING}")
    try:
        return operator.index(entry)
    except TypeError:
        raise shape_violation(f"only ints, slices (':'), None and '...' are valid indices, not {entry!r}; "
                              f"{GATHERING}") from None


def _taken_of_axis(entry, size, axis):
    if isinstance(entry, slice):
        try:
            start, stop, step = entry.indices(size)
        except (TypeError, ValueError) as error:  # a slice of floats, or step 0: Python's own words
            raise shape_violation(f"{error} (axis {axis})") from None
        length = len(range(start, stop, step))
        return _Taken(start, length, step if length > 1 else 1, True)
    if not -size <= entry < size:
        raise shape_violation(f"index {entry} is out of bounds for axis {axis} with size {size}")
    return _Taken(entry % size, 1, 1, False)


def _spelled(key):
    """The key as the user wrote it, for messages: ``1:5:2, None, ...``."""
    def spelled(entry):
        if isinstance(entry, slice):
            parts = ["" if p is None else str(p) for p in (entry.start, entry.stop, entry.step)]
            return ":".join(parts if entry.step is not None else parts[:2])
        if entry is Ellipsis:
            return "..."
        if isinstance(entry, Term):
            return type_string(entry.shape, entry.dtype)
        return str(entry) if isinstance(entry, (int, np.integer)) else repr(entry)

    return ", ".join(spelled(e) for e in (key if isinstance(key, tuple) else (key,)))


def _cropped(x, taken):
    """``x`` cropped (``pad`` with negative widths) to the span of each axis' taken elements."""
    widths = tuple((-low, high - size) for size, (low, high) in zip(x.shape, (t.span for t in taken)))
    return x if not any(low or high for low, high in widths) else ct.pad(x, widths)


def _flipped(x, taken):
    """``x`` reversed along the axes that are walked backwards."""
    axes = tuple(axis for axis, t in enumerate(taken) if t.step < 0)
    return ct.flip(x, axis=axes) if axes else x


def _strided(x, taken):
    """Every step-th element of each axis of ``x``: windows of size 1, the steps apart, over the trailing axes from
    the first with a step (shape ``lead + counts + ones``, for the final reshape to drop the ones)."""
    steps = [abs(t.step) for t in taken]
    first = next((axis for axis, step in enumerate(steps) if step > 1), None)
    if first is None:
        return x
    return ct.windows(x, (1,) * (x.ndim - first), strides=steps[first:])


# -- concatenate and split -------------------------------------------------------------------


def concatenate(arrays, axis=0):
    """NumPy's ``concatenate``: the operands (terms or arrays) joined along ``axis`` (None: flattened first), in
    their common dtype. Written as each operand padded with zeros to the full length at its offset, the pads added."""
    if not isinstance(arrays, (list, tuple)):
        raise rejection("concatenate", (), shape_violation(
            f"takes a list or tuple of tensors, not {_described(arrays)}"))
    terms = [ct.as_term(a) for a in arrays]
    try:
        if axis is None:
            terms, axis = [ct.reshape(t, (t.size,)) for t in terms], 0
        axis = _joined_axis(terms, axis)
        dtype = promoted([t.dtype for t in terms])
        if is_float8(dtype) and len(terms) > 1:  # (its pads are added: float8 takes no arithmetic)
            raise dtype_violation(f"{dtype.name} tensors are joined in a dtype that holds them exactly: cast them to "
                                  f"bfloat16, concatenate, and cast back")
    except RuleViolation as violation:
        raise rejection("concatenate", terms, violation) from None
    offsets = itertools.accumulate((t.shape[axis] for t in terms), initial=0)
    total = sum(t.shape[axis] for t in terms)
    placed = [_placed(t, dtype, axis, offset, total) for t, offset in zip(terms, offsets) if t.shape[axis]]
    return functools.reduce(ct.add, placed) if placed else _as_dtype(terms[0], dtype)


def _described(value):
    return type_string(value.shape, value.dtype) if isinstance(value, Term) else f"{type(value).__name__} {value!r}"


def _joined_axis(terms, axis):
    """``axis`` as a non-negative int, where the operands have one rank of at least 1 and agree off it."""
    if not terms:
        raise shape_violation("needs at least one tensor to concatenate")
    if any(t.ndim == 0 for t in terms):
        raise shape_violation("zero-dimensional tensors cannot be concatenated (reshape them to (1,), or pass axis=None)")
    ranks = {t.ndim for t in terms}
    if len(ranks) > 1:
        raise shape_violation(f"the tensors must have the same number of dimensions, not {sorted(ranks)}")
    axis = one_axis(axis, terms[0].ndim)
    off_axis = {t.shape[:axis] + t.shape[axis + 1:] for t in terms}
    if len(off_axis) > 1:
        shapes = ", ".join(str(t.shape) for t in terms)
        raise shape_violation(f"the shapes {shapes} must agree on every axis but the concatenated axis {axis}")
    return axis


def _as_dtype(t, dtype):
    return t if t.dtype == dtype else ct.cast(t, dtype)


def _placed(t, dtype, axis, offset, total):
    """``t`` in ``dtype``, padded along ``axis`` to ``total`` elements, starting at ``offset``: with zeros, negative
    ones where the dtype has them, so that adding the pads gives each element exactly (``-0.0 + -0.0`` is ``-0.0``,
    ``-0.0 + 0.0`` would be ``0.0``)."""
    widths = [(0, 0)] * t.ndim
    widths[axis] = (offset, total - offset - t.shape[axis])
    t = _as_dtype(t, dtype)
    zero = -0.0 if is_float(dtype) else 0
    return ct.pad(t, tuple(widths), constant_values=zero) if any(widths[axis]) else t


def split(a, indices_or_sections, axis=0):
    """NumPy's ``split``: ``a`` cut along ``axis`` into an int number of equal sections (which must divide the axis),
    or at a list of points (as slices cut: negative points count from the end, points out of order or past the end
    give empty pieces). Each piece is a slice of ``a``."""
    x = ct.as_term(a)
    try:
        axis = one_axis(axis, x.ndim)
        points = _split_points(x.shape[axis], indices_or_sections)
    except RuleViolation as violation:
        raise rejection("split", [x], violation) from None
    before = (slice(None),) * axis
    return [x[before + (slice(start, stop),)] for start, stop in zip(points, points[1:])]


def _split_points(size, indices_or_sections):
    """Where the pieces start and stop: ``0``, the points, ``size`` (NumPy's ``array_split``)."""
    if isinstance(indices_or_sections, Term):
        raise shape_violation("split points must be known when the expression is built: ints, not a term")
    if np.ndim(indices_or_sections) == 0 and np.asarray(indices_or_sections).dtype.kind in "iu":
        sections = int(indices_or_sections)
        if sections < 1:
            raise shape_violation(f"the number of sections must be at least 1, not {sections}")
        if size % sections:
            raise shape_violation(f"{sections} sections do not divide the axis of length {size} into equal parts "
                                  f"(pass split points instead)")
        return [size // sections * k for k in range(sections + 1)]
    return [0, *int_tuple(np.asarray(indices_or_sections).tolist(), "indices_or_sections"), size]
