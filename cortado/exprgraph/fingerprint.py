"""A term's fingerprint: a digest of what it computes (its ops, attributes, constants' values, and its variables'
names, shapes and dtypes) that is the same in every process and every build of the same expression, where Python's
own hash of a term is not (it mixes in the process's string hashing). A value that must not change when a model is
built again, such as the random stream ``nn.Dropout`` draws from for its input, is taken from it.
"""

import hashlib
import weakref

import numpy as np

from .graph import folded
from .ops import VAR
from .ops.leaves import Constant

_known = weakref.WeakKeyDictionary()  # term -> its digest: each term is read once, however many ask


def fingerprint(term):
    """The 32-byte digest of ``term``: its arguments' first, the walk stopping at terms already known, so a model's
    dropouts read each term of the graph once between them."""
    return folded(term, _known, _digest)


def _digest(term):
    parts = [term.op.name.encode()]
    for name, value in term.attr_dict.items():
        if term.op is VAR and name == "declaration":  # where it was written, not what it is
            continue
        parts += [name.encode(), _attribute(value)]
    parts += [_known[a] for a in term.args]
    return hashlib.sha256(b"\0".join(parts)).digest()


def _attribute(value):
    if isinstance(value, Constant):
        array = value.array
        return b"|".join([array.dtype.str.encode(), repr(array.shape).encode(), str(value.weak).encode(),
                          np.ascontiguousarray(array).tobytes()])
    if isinstance(value, np.dtype):
        return value.str.encode()
    if isinstance(value, (bool, int, float, str, tuple, type(None), np.generic)):
        return repr(value).encode()
    return type(value).__name__.encode()  # no repr that could hold an address
