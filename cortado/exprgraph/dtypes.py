"""The dtypes cortado accepts, and how they are named and checked.

dtypes are NumPy dtypes; this module only narrows them to the ones every backend supports and
turns a bad one into a ``DTypeError`` instead of whatever NumPy would say.

``bfloat16`` is ml_dtypes' (an optional dependency: the CPU path needs NumPy alone). NumPy files
it under kind ``"V"`` and ``np.finfo`` refuses it, so code that asks whether a dtype is floating,
for its kind letter or for its limits asks here (``is_float``, ``kind_of``, ``finfo``), not NumPy.

``float8_e4m3fn`` and ``float8_e5m2`` (ml_dtypes' too) hold values for products only: a tensor of
them is cast to (``converted``: saturating, so an outlier becomes the largest float8, never NaN or
inf), moved (reshaped, transposed, sliced, gathered) and multiplied (``matmul``, ``einsum``: every product of
two float8 values is exact in float32, where they are summed), and cast back; no other op takes it.
"""

import numpy as np

from ..errors import DTypeError


try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

BFLOAT16 = None if ml_dtypes is None else np.dtype(ml_dtypes.bfloat16)  # None without ml_dtypes
FLOAT8 = () if ml_dtypes is None else (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))

SUPPORTED = tuple(
    np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
) + ((BFLOAT16,) if BFLOAT16 is not None else ()) + FLOAT8


def is_bfloat16(dtype):
    return BFLOAT16 is not None and dtype == BFLOAT16  # (np.dtype == None is True: test None first)


def is_float8(dtype):
    """Whether ``dtype`` is float8_e4m3fn or float8_e5m2: one for products and storage only."""
    return dtype in FLOAT8


def kind_of(dtype):
    """NumPy's kind letter (``"b"``, ``"i"``, ``"u"``, ``"f"``), with bfloat16 and float8 the floats they are."""
    return "f" if is_bfloat16(dtype) or is_float8(dtype) else dtype.kind


def is_float(dtype):
    """Whether ``dtype`` is floating: float16, float32, float64, bfloat16 or a float8."""
    return kind_of(dtype) == "f"


def is_narrow_float(dtype):
    """Whether ``dtype`` is float16 or bfloat16: too few digits to add many values in (ones summed
    in float16 stop at 2048, in bfloat16 at 256), so sums and products of them accumulate in
    float32 and round once (``Op.computes_in_float32``)."""
    return is_float(dtype) and dtype.itemsize == 2


def finfo(dtype):
    """The limits of a floating dtype (``np.finfo`` does not know bfloat16 or float8; ml_dtypes' does)."""
    return ml_dtypes.finfo(dtype) if is_bfloat16(dtype) or is_float8(dtype) else np.finfo(dtype)


def converted(array, dtype):
    """``array`` as ``dtype``, as NumPy's ``astype`` converts it, except that a float8 saturates: a value beyond
    its largest (an infinity too) becomes the largest of its sign, as a GPU's ``satfinite`` conversion makes it
    and as fp8 training wants (an outlier clipped, not a NaN that poisons the step); NaN stays NaN."""
    if not is_float8(dtype):
        return array.astype(dtype)
    largest = float(finfo(dtype).max)
    return np.clip(array, -largest, largest).astype(dtype)


def as_strided(array, shape, strides, writeable=True):
    """NumPy's ``as_strided`` (byte ``strides``) for an array of any supported dtype: NumPy's array interface has no
    code for a float8, so the view is made over bytes and read as the dtype again."""
    raw = array.view(np.dtype((np.void, array.itemsize)))
    return np.lib.stride_tricks.as_strided(raw, shape, strides, writeable=writeable).view(array.dtype)


ML_DTYPES_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


AMBIGUOUS = {"float": ("float64", "float32"), "int": ("int64", "int32")}  # name: (NumPy's dtype, PyTorch's)


def as_dtype(spec):
    """The supported NumPy dtype named by ``spec`` (a string, a NumPy type or a dtype). The names NumPy and PyTorch
    give two widths (``AMBIGUOUS``) are refused: ``"float"`` would be float64 where a PyTorch user means float32."""
    if isinstance(spec, str) and spec in AMBIGUOUS:
        raise DTypeError(f"the dtype {spec!r} is {AMBIGUOUS[spec][0]} in NumPy and {AMBIGUOUS[spec][1]} in PyTorch: "
                         f"name its width ({AMBIGUOUS[spec][1]!r} or {AMBIGUOUS[spec][0]!r})")
    if ml_dtypes is None and isinstance(spec, str) and spec in ML_DTYPES_NAMES:
        raise DTypeError(f"the dtype {spec} needs the ml_dtypes package, which is not installed: pip install ml_dtypes")
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
