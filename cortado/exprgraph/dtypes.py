"""The dtypes cortado accepts, and how they are named and checked.

dtypes are NumPy dtypes; this module only narrows them to the ones every backend supports and
turns a bad one into a ``DTypeError`` instead of whatever NumPy would say.
"""

import numpy as np

from ..errors import DTypeError

SUPPORTED = tuple(
    np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
)


def as_dtype(spec):
    """The supported NumPy dtype named by ``spec`` (a string, a NumPy type or a dtype)."""
    try:
        dtype = None if spec is None or isinstance(spec, bool) else np.dtype(spec)
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype not in SUPPORTED:  # (np.dtype == None is True: test None first)
        names = ", ".join(d.name for d in SUPPORTED)
        raise DTypeError(f"unknown or unsupported dtype {spec!r}; cortado supports {names}")
    return dtype


def type_string(shape, dtype):
    """``float32[64,784]``: how every message and printout names a tensor type."""
    return f"{dtype.name}[{','.join(map(str, shape))}]"
