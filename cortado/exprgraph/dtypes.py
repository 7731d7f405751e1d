"""The dtypes cortado accepts, and how they are named and checked.

dtypes are NumPy dtypes; this module only narrows them to the ones every backend supports and
turns a bad one into a ``DTypeError`` instead of whatever NumPy would say.

``bfloat16`` is ml_dtypes' (an optional dependency: the CPU path needs NumPy alone). NumPy files
it under kind ``"V"`` and ``np.finfo`` refuses it, so code that asks whether a dtype is floating,
for its kind letter or for its limits asks here (``is_float``, ``kind_of``, ``finfo``), not NumPy.
"""

import numpy as np

from ..errors import DTypeError


try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

BFLOAT16 = None if ml_dtypes is None else np.dtype(ml_dtypes.bfloat16)  # None without ml_dtypes

SUPPORTED = tuple(
    np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
) + ((BFLOAT16,) if BFLOAT16 is not None else ())


def is_bfloat16(dtype):
    return BFLOAT16 is not None and dtype == BFLOAT16  # (np.dtype == None is True: test None first)


def kind_of(dtype):
    """NumPy's kind letter (``"b"``, ``"i"``, ``"u"``, ``"f"``), with bfloat16 the float it is."""
    return "f" if is_bfloat16(dtype) else dtype.kind


def is_float(dtype):
    """Whether ``dtype`` is floating: float16, float32, float64 or bfloat16."""
    return kind_of(dtype) == "f"


def is_narrow_float(dtype):
    """Whether ``dtype`` is float16 or bfloat16: too few digits to add many values in (ones summed
    in float16 stop at 2048, in bfloat16 at 256), so sums and products of them accumulate in
    float32 and round once (``Op.computes_in_float32``)."""
    return is_float(dtype) and dtype.itemsize == 2


def finfo(dtype):
    """The limits of a floating dtype (``np.finfo`` does not know bfloat16; ml_dtypes' does)."""
    return ml_dtypes.finfo(dtype) if is_bfloat16(dtype) else np.finfo(dtype)


def as_dtype(spec):
    """The supported NumPy dtype named by ``spec`` (a string, a NumPy type or a dtype)."""
    if BFLOAT16 is None and isinstance(spec, str) and spec == "bfloat16":
        raise DTypeError("the dtype bfloat16 needs the ml_dtypes package, which is not installed: pip install ml_dtypes")
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
