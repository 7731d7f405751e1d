"""What ``take``, ``take_along_axis`` and ``add_at`` compute, with NumPy, for the reference interpreter, constant
folding and the CPU backend alike: NumPy's ``take`` and ``take_along_axis``, whose indices may count from the end (``-1`` is the
last element), and an index outside ``[-n, n)`` refused with an error that names the op, the index and the axis
(NumPy's ``take_along_axis`` would wrap some silently, and its ``IndexError`` names neither).

An index out of range found when a program runs is reported as the gather the user wrote (``written_gather``),
even when the gather that found it is one that rewriting built: a gradient picks places along the user's axis
with the user's indices, and its own ``take`` from ``0 .. n - 1`` along axis 0 is nothing the user wrote."""

import math
import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import IndexRangeError
from .location import format_location, user_location
from .term import describe_operands


def _outside(index, axis, size, low=None):
    where = f"axis {axis} of size {size}" if axis is not None else f"the flattened operand of size {size}"
    return f"index {index} is out of range for {where} (indices must lie in [{-size if low is None else low}, {size}))"


def checked(indices, size, op, axis):
    """``indices`` with negative ones counted from the end of an axis of ``size``; an error if any falls outside
    (its message starts with ``op``, where that is not None)."""
    indices = np.asarray(indices)
    if indices.dtype.kind == "u":
        outside = indices >= size
    else:
        indices = indices.astype(np.int64)  # an int8's -1 + 1000 must not wrap
        outside = (indices < -size) | (indices >= size)
    if outside.any():
        index = indices[outside].flat[0]
        raise IndexRangeError(f"{op + ': ' if op else ''}{_outside(index, axis, size)}", index, size)
    return indices if indices.dtype.kind == "u" else np.where(indices < 0, indices + size, indices)


@dataclass(frozen=True)
class _Written:
    """A gather as the user wrote it: the call's text, its axis (None: of the operand flattened), its size, its line."""

    call: str
    axis: object
    size: int
    location: tuple
    signed: bool = False  # the user's indices are signed ones read as unsigned (``nn.module.gathered_from_zero``)


_by_gather = weakref.WeakKeyDictionary()  # gather term the user built -> _Written
_by_indices = weakref.WeakKeyDictionary()  # index term -> {_Written}, every gather written with it (kept while the
# indices live: a gradient's gather reads them after the user's own gather term is gone)
_by_variable = weakref.WeakKeyDictionary()  # variable -> {gather term: _Written}, every gather whose indices read it


def written_gather(call, gather, axis, size, signed=False):
    """Remember ``call`` (its text), the user's gather ``gather`` along ``axis`` of ``size``, and the user's line, for
    ``out_of_range``; ``signed``: whether the gather reads the user's signed indices as unsigned."""
    written = _Written(call, axis, size, user_location(), signed)
    _by_gather.setdefault(gather, written)
    _by_indices.setdefault(gather.args[1], set()).add(written)
    for variable in _variables(gather.args[1]):
        _by_variable.setdefault(variable, weakref.WeakKeyDictionary()).setdefault(gather, written)


def _variables(indices):
    """The variables ``indices`` are computed from."""
    from .graph import post_order  # here, not above: the op table imports this module
    from .ops import VAR

    return frozenset(t for t in post_order([indices]) if t.op is VAR)


def _written_for(term, size):
    """The user's gather that ``term`` is, or else the one gather of an axis of ``size`` written with ``term``'s
    indices (or the indices they were reshaped from): a gradient's gather picks along the user's axis with the
    user's indices; or else the one of an axis of ``size`` whose indices are computed from the same variables (a
    backend rebuilt the indices, a kernel of its own computing them). None where there is none, or several that
    could be meant."""
    from .ops import BROADCAST_TO, RESHAPE, TRANSPOSE  # here, not above: the op table imports this module

    if term in _by_gather:
        return _by_gather[term]
    same_values = (RESHAPE, BROADCAST_TO, TRANSPOSE)  # ops whose result holds its operand's indices as they were
    indices = term.args[1]
    while True:
        found = {w for w in _by_indices.get(indices, ()) if w.size == size}
        if found or indices.op not in same_values:
            break
        indices = indices.args[0]
    if not found:
        variables = _variables(term.args[1])
        found = {w for v in variables for g, w in _by_variable.get(v, {}).items()
                 if w.size == size and _variables(g.args[1]) == variables}
    return found.pop() if len(found) == 1 else None


def out_of_range(term, error):
    """``error``, an index out of range found running the gather ``term``, as the gather the user wrote says it:
    the call, the index, the valid range and the user's line."""
    written, named = _written_for(term, error.size), True
    if written is None:  # built by cortado alone, or ambiguous: the gather itself is all there is to name
        axis, named = term.attr("axis"), False
        written = _Written(f"{term.op.name}({describe_operands(term.args)}, axis={axis})", axis, error.size,
                           term.location)
    index, low, shown = error.index, None, str(error.index)
    dtype = np.asarray(index).dtype
    if dtype.kind == "u":  # never negative; one past 2**(bits-1) may be a signed one read as unsigned
        low, signed = 0, np.asarray(index).astype(f"int{8 * dtype.itemsize}").item()
        if written.signed:  # the user's signed index, as the user gave it: -1, not 4294967295
            index = shown = signed
        elif signed < 0 and not named:
            shown = f"{index} ({signed} as a signed int{8 * dtype.itemsize})"
    return _error(written.call, index, shown, written.axis, error.size, low, written.location)


def check_from_zero(call, values, axis, size):
    """Constant labels or token ids ``values`` checked where the user built ``call``: each in ``[0, size)``."""
    outside = (values < 0) | (values >= size)
    if outside.any():
        index = values[outside].flat[0]
        raise _error(call, index, index, axis, size, 0, user_location())


def _error(call, index, shown, axis, size, low, location):
    """The IndexRangeError of ``index`` (written ``shown``) out of range in the user's ``call`` at ``location``."""
    return IndexRangeError(f"{call}: {_outside(shown, axis, size, low)}\n  built at {format_location(location)}",
                           index, size)


def take(a, indices, axis):
    return np.take(a, checked(indices, a.shape[axis], "take", axis), axis=axis)


ADD_AT_CHUNK = 1024  # add_at sums the rows of each chunk of this many indices, then the chunks' sums


def add_at(values, indices, axis, size):
    """Zeros of ``size`` along ``axis`` with ``values``' rows added at ``indices`` (NumPy's ``np.add.at``)."""
    out = np.empty(values.shape[:axis] + (size,) + values.shape[axis + np.ndim(indices):], values.dtype)
    add_at_into(out, values, indices, axis)
    return out


def add_at_into(out, values, indices, axis):
    """``add_at`` into ``out``, its sums taken in the one order every backend takes them: for each chunk of
    ``ADD_AT_CHUNK`` indices, each place's rows in the order of the indices, then, for each place, the sums of the
    chunks that hold it, in order (a GPU sums a chunk's runs side by side, with no atomics). So the sums are the
    same bits wherever they are taken; with one chunk they are ``np.add.at``'s."""
    flat = checked(indices, out.shape[axis], "add_at", axis).reshape(-1).astype(np.int64)  # (uint64 * int: float)
    lead, size, trail = math.prod(out.shape[:axis]), out.shape[axis], math.prod(out.shape[axis + 1:])
    rows = values.reshape(lead, flat.size, trail)
    # contiguous, so that ``_added``'s flattening is a view: ``out`` itself, or a buffer copied into it at the end
    sums = out.reshape(lead, size, trail) if out.flags.c_contiguous else np.empty((lead, size, trail), out.dtype)
    sums[...] = 0
    if flat.size <= ADD_AT_CHUNK:
        _added(sums, flat, rows)
    else:
        for first in range(0, flat.size, ADD_AT_CHUNK):
            held, places = np.unique(flat[first:first + ADD_AT_CHUNK], return_inverse=True)
            chunk_sums = np.zeros((lead, held.size, trail), sums.dtype)  # the chunk's places only, in order
            _added(chunk_sums, places, rows[:, first:first + ADD_AT_CHUNK])
            sums[:, held] += chunk_sums
    if not np.shares_memory(sums, out):
        out[...] = sums.reshape(out.shape)


def _added(sums, places, rows):
    """``rows`` (lead x index x trail) added into ``sums`` (lead x place x trail) at ``places``, each place's in the
    order of the indices: one 1-d ``np.add.at`` over every element's own place in the flattened sums (six times
    faster than ``np.add.at`` of rows, and the same additions in the same order)."""
    lead, size, trail = sums.shape
    at = (np.arange(lead)[:, None, None] * size + places[None, :, None]) * trail + np.arange(trail)
    np.add.at(sums.reshape(-1), at.reshape(-1), rows.reshape(-1))


def take_along_axis(a, indices, axis):
    """NumPy's ``take_along_axis``, ``a`` and ``indices`` broadcast against each other off ``axis``."""
    indices = checked(indices, a.shape[axis], "take_along_axis", axis)
    lead = np.broadcast_shapes(_without(a.shape, axis), _without(indices.shape, axis))
    a = np.broadcast_to(a, _with(lead, axis, a.shape[axis]))
    indices = np.broadcast_to(indices, _with(lead, axis, indices.shape[axis]))
    return np.take_along_axis(a, indices, axis=axis)


def take_into(out, a, indices, axis):
    np.take(a, checked(indices, a.shape[axis], "take", axis), axis=axis, out=out)


def take_along_axis_into(out, a, indices, axis):
    if _one_a_row(out, a, indices, axis):
        _picked_a_row(out, a, indices)
    else:
        out[...] = take_along_axis(a, indices, axis)


def _one_a_row(out, a, indices, axis):
    """Whether the gather picks one place of each row of C-ordered ``a`` along its last axis (a cross-entropy's
    label logit), into a C-ordered ``out``: one ``take`` of the flattened rows does it."""
    return (axis == a.ndim - 1 and indices.shape == a.shape[:-1] + (1,) and a.flags.c_contiguous
            and out.flags.c_contiguous and indices.dtype.kind in "iu" and a.size > 0)


def _picked_a_row(out, a, indices):
    """``take_along_axis`` of one index a row of ``a``: each row's index, checked as ``checked`` checks it and counted
    from the end where negative, offset by its row's first place, taken from ``a`` flattened: five calls where
    ``take_along_axis`` made a dozen (20 us for 64 rows, now 10)."""
    n = a.shape[-1]
    flat = indices.reshape(-1)
    if flat.min() < -n or flat.max() >= n:
        checked(flat, n, "take_along_axis", a.ndim - 1)  # raises, naming the index
    places = np.remainder(flat, n, dtype=np.int64)  # -1 is the last place
    places += np.arange(0, a.size, n)
    np.take(a.reshape(-1), places, out=out.reshape(-1))


def _without(shape, axis):
    return shape[:axis] + (1,) + shape[axis + 1:]


def _with(shape, axis, size):
    return shape[:axis] + (size,) + shape[axis + 1:]
