"""The leaves of every expression, ``var`` and ``const``, and the ``Constant`` that a ``const``
holds as its value.
"""

import numpy as np

from ..location import user_call_chain
from ..term import shape_violation
from .base import LEAF, Op, as_shape, dtype_attr


class Constant:
    """A constant's value: a read-only array, compared and hashed by dtype, shape and bytes.

    ``weak`` marks a Python scalar whose dtype is still open (NEP 50): ``x * 2.0`` keeps
    ``x``'s float32. Constructors materialise weak constants at the dtype they combine to.
    A constant whose elements are all equal (a *splat*, such as the zeros a rewrite leaves) is
    stored as one element broadcast to its shape, so it costs no memory however large it is.
    """

    __slots__ = ("array", "weak", "scalar", "_key")

    def __init__(self, array, weak=False):
        array = np.asarray(array)
        self.weak = weak
        self.scalar = _splat_element(array)
        if self.scalar is not None and array.size > 1:
            self.array = np.broadcast_to(self.scalar, array.shape)  # read-only, one element
            content = self.scalar.tobytes()
        else:
            self.array = np.array(array, order="C", copy=True)
            self.array.flags.writeable = False
            content = self.array.tobytes()
        self._key = (array.dtype.str, array.shape, content, weak)

    def __eq__(self, other):
        return isinstance(other, Constant) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        if self.array.ndim and self.scalar is not None:
            return f"full({self.scalar[()]})"  # every element this value; the term's type gives the shape
        if self.array.ndim:  # on one line: a listing has one line a term
            return " ".join(np.array2string(self.array, separator=", ", threshold=6).split())
        return str(self.array[()])  # NumPy's shortest form for the dtype: 1.7320508 for float32


def _splat_element(array):
    """The one element every element of ``array`` equals, bit for bit, as a 0-d array; else None."""
    if array.size == 0:
        return None
    first = np.array(array[(0,) * array.ndim])
    if array.size > 1 and any(array.strides):  # a broadcast of one element has all strides 0
        rows = np.ascontiguousarray(array).view(np.uint8).reshape(array.size, array.dtype.itemsize)
        if not (rows == rows[0]).all():
            return None
    first.flags.writeable = False
    return first


class Declaration:
    """What makes the variable of one ``ct.var`` call its own: compared by identity, so two calls are
    two variables even with one name, shape and dtype (as two ``torch.nn.Parameter``s are), and a helper
    that declares its weight and is called twice cannot tie two layers by accident. A variable used in
    two places is the one term passed to both. ``where`` is the call's line and its caller's, for errors;
    ``maker``, the part of cortado that declared it for the user where one did (``cortado.nn`` a parameter,
    ``cortado.optim`` an optimizer's state), for the error of two variables of one name."""

    __slots__ = ("where", "maker")

    def __init__(self, where):
        self.where = where
        self.maker = None

    def __repr__(self):
        return f"declared at {self.where}"


def _var_normalize(args, name, shape, dtype):
    if not isinstance(name, str) or not name:
        raise shape_violation(f"a variable's name must be a non-empty string, not {name!r}")
    return (name, as_shape(shape), dtype_attr(dtype, f"variable {name!r}"), Declaration(user_call_chain()))


VAR = Op("var", 0, ("name", "shape", "dtype", "declaration"),
         lambda args, name, shape, dtype, declaration: shape,
         lambda args, name, shape, dtype, declaration: dtype,
         LEAF, _var_normalize)  # evaluated from the feeds and state, never from its operands
CONST = Op("const", 0, ("value",),
           lambda args, value: value.array.shape,
           lambda args, value: value.array.dtype,
           LEAF, lambda args, value: (value,))

FAMILY = (VAR, CONST)
