"""CUDA C for a fused region: the C of its body's expressions, and the elementwise kernel.

Every shape and stride is known when the program is built, so all index arithmetic is written
into the source as constants (a division by a constant compiles to a multiply and a shift) and a
kernel takes only its pointers. Each operand is read through its own layout: a transposed or
broadcast view costs nothing, its strides are simply different constants. Dimensions that are
contiguous in an operand are merged first, so a plain operand is read at the flat index itself.

An elementwise kernel gives each thread ``VEC`` consecutive elements, read and written as one
16-byte vector wherever an operand is stored contiguously, and indexes in 32 bits where every
offset fits. Its grid covers the whole range, a thread to a vector: on the H200 that streamed
4.26 TB/s where a grid of 8 blocks per multiprocessor looping over the range streamed 3.70.
float16 and bfloat16 values (``is_narrow_float``) are computed and accumulated in float32, as the
reference computes their sums, and rounded to their dtype where a value leaves half precision (a comparison, a
conversion: ``_Writer._judged``); the lowering spells the softmax family out in float32 for them
(``rules.decompositions``). Each elementwise op's C expression is its entry of ``C_EXPRESSIONS``.
The reduction kernels are ``reduction_kernels`` and ``row_kernels``; ``sources`` picks a body's form.
"""

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ...errors import BackendError
from ...exprgraph.dtypes import is_float, is_float8, is_narrow_float, kind_of
from ...exprgraph.graph import post_order
from ...exprgraph.scaling import is_exact_power_of_two
from ...exprgraph.ops import (
    ABS, ADD, BROADCAST_TO, CAST, CONST, COS, DIVIDE, ELEMENTWISE, EQUAL, EXP, EXPM1, FLOAT8_GRADIENT, FLOOR_DIVIDE,
    GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, LOG, LOG1P, LOGICAL_AND, LOGICAL_NOT, LOGICAL_OR, LOGICAL_XOR, MAX, MAXIMUM, MEAN,
    MINIMUM, MULTIPLY, NEGATIVE, NOT_EQUAL, PAD, PARAM, POWER, RELU, REMAINDER, RINT, SIGN, SIN, SQRT, STOP_GRADIENT, SUBTRACT,
    SUM, TANH, WHERE, may_fail,
)
from ...rules.fusion import padded_rows
from .launch import WAIT_PRIOR_GRIDS

THREADS = 256
# the most bytes of its operands' and results' elements an elementwise kernel's thread holds at once, where its
# narrowest type's 16 bytes would take more: an AdamW step of float32 state and a bfloat16 gradient (seven arrays)
# took 25.0 us at 8 elements a thread and 17.8 at 4 (3072 x 768 on an H200)
THREAD_VECTOR_BYTES = 128
VECTOR_BYTES = 16  # the widest load or store of one thread, and cuBLASLt's tensor-core kernels' unit of access
STORAGE = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long",
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
    "float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2",
}
HALVES = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}  # each half type's rounding from float
REDUCTIONS = (SUM, MEAN, MAX)

# The functions kernels call. Composite ops (sigmoid, softplus, gelu) never reach a kernel: they are spelled out in
# primitives first (rules.primitives).
PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
template <typename T> __device__ __forceinline__ T ct_load(T x) { return x; }
__device__ __forceinline__ float ct_load(__half x) { return __half2float(x); }
// a bfloat16's float is its bits shifted up (exact), written so the compiler sees plain arithmetic: CUDA's own
// conversion is inline assembly, which nvcc neither merges nor hoists, so a row kernel computed each row's values
// (divisions among them) again for every element of every pass
__device__ __forceinline__ float ct_load(__nv_bfloat16 x) { return __uint_as_float((unsigned int)__bfloat16_as_ushort(x) << 16); }
__device__ __forceinline__ float ct_load(__nv_fp8_e4m3 x) { return float(x); }
__device__ __forceinline__ float ct_load(__nv_fp8_e5m2 x) { return float(x); }
template <typename T, typename C> __device__ __forceinline__ T ct_store(C x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half ct_store<__half, float>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 ct_store<__nv_bfloat16, float>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ __forceinline__ T ct_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> __device__ __forceinline__ T ct_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> __device__ __forceinline__ T ct_sign(T a) { return a > T(0) ? T(1) : (a < T(0) ? T(-1) : a); }
template <typename T> __device__ __forceinline__ T ct_ipow(T base, T exponent) {  // exponent >= 0; wraps as NumPy
    unsigned long long b = (unsigned long long)(long long)base, e = (unsigned long long)exponent, r = 1ULL;
    for (; e; e >>= 1, b *= b) { if (e & 1ULL) r *= b; }
    return (T)r; }
// NumPy's floor_divide and remainder. Integers: by 0, 0; MIN // -1 wraps to MIN and MIN % -1 is 0; a quotient
// rounded toward minus infinity, a remainder of the divisor's sign. Floats: NumPy's npy_divmod, step for step (fmod,
// the quotient snapped to an integer, zeros signed as NumPy signs them), so the same bits.
template <typename T> __device__ __forceinline__ T ct_floor_divide(T a, T b) {
  if (b == (T)0) return (T)0;
  if ((T)(-1) > (T)0) return a / b;
  if (b == (T)(-1)) return (T)(0ull - (unsigned long long)(long long)a);
  const T q = a / b;
  return (a % b != (T)0 && ((a < (T)0) != (b < (T)0))) ? (T)(q - (T)1) : q;
}
template <typename T> __device__ __forceinline__ T ct_remainder(T a, T b) {
  if (b == (T)0 || ((T)(-1) < (T)0 && b == (T)(-1))) return (T)0;
  const T r = a % b;
  return (r != (T)0 && ((r < (T)0) != (b < (T)0))) ? (T)(r + b) : r;
}
#define CT_DIVMOD(T, FMOD, FLOOR, COPYSIGN) \
  __device__ __forceinline__ T ct_divmod(T a, T b, T* modulus) { \
    T mod = FMOD(a, b); \
    T div = (a - mod) / b; \
    if (mod != (T)0) { if ((b < (T)0) != (mod < (T)0)) { mod += b; div -= (T)1; } } \
    else { mod = COPYSIGN((T)0, b); } \
    T floordiv; \
    if (div != (T)0) { floordiv = FLOOR(div); if (div - floordiv > (T)0.5) floordiv += (T)1; } \
    else { floordiv = COPYSIGN((T)0, a / b); } \
    *modulus = mod; return floordiv; } \
  __device__ __forceinline__ T ct_floor_divide(T a, T b) { T mod; return b == (T)0 ? a / b : ct_divmod(a, b, &mod); } \
  __device__ __forceinline__ T ct_remainder(T a, T b) { \
    T mod; if (b == (T)0) return FMOD(a, b); ct_divmod(a, b, &mod); return mod; }
CT_DIVMOD(float, fmodf, floorf, copysignf) CT_DIVMOD(double, fmod, floor, copysign)
template <typename T, int V> struct alignas(sizeof(T) * V) ct_vec { T v[V]; };
// x rounded to the nearest (even) integer, or toward zero, and clamped into T's range in one instruction, NaN to 0
template <typename T, bool NEAREST> __device__ __forceinline__ T ct_saturated(float x);
#define CT_SATURATED(T, PTX_TYPE) \
  template <> __device__ __forceinline__ T ct_saturated<T, true>(float x) { \
    int r; asm("cvt.rni.sat." PTX_TYPE ".f32 %0, %1;" : "=r"(r) : "f"(x)); return (T)r; } \
  template <> __device__ __forceinline__ T ct_saturated<T, false>(float x) { \
    int r; asm("cvt.rzi.sat." PTX_TYPE ".f32 %0, %1;" : "=r"(r) : "f"(x)); return (T)r; }
CT_SATURATED(signed char, "s8") CT_SATURATED(unsigned char, "u8") CT_SATURATED(short, "s16")
CT_SATURATED(unsigned short, "u16")
// Every kernel calls this before touching memory a kernel writes: launched to overlap the kernel before it
// (launch.py), it waits until that grid has finished and its writes are visible; launched plainly, or before sm_90,
// it does nothing.
__device__ __forceinline__ void ct_wait_prior_grids() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
"""


@dataclass(frozen=True)
class Operand:
    """How a kernel reads one input: its shape, dtype and element strides (0 where broadcast)."""

    shape: tuple
    dtype: np.dtype
    strides: tuple


@dataclass(frozen=True)
class Source:
    """A kernel's CUDA C, its entry point, and its launch: ``blocks`` of ``block`` threads."""

    name: str
    text: str
    blocks: object  # blocks, or a (x, y, z) grid
    block: tuple
    shared: int = 0  # dynamic shared memory, bytes
    options: tuple = ()  # NVRTC's, besides -std=c++17


def contiguous_strides(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def strides_in_order(shape, order):
    """Packed strides of ``shape`` whose axes lie in memory in ``order`` (outermost first)."""
    strides, step = [0] * len(shape), 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


def channels_last_strides(shape):
    """Packed strides of an ``N, C, *spatial`` shape with the channels innermost (NHWC)."""
    return strides_in_order(shape, (0,) + tuple(range(2, len(shape))) + (1,))


def same_layout(shape, strides, others):
    """Whether two layouts of ``shape`` place every element alike (strides of axes of size 1 never matter)."""
    return all(s == o for d, s, o in zip(shape, strides, others) if d != 1)


def in_c_order(shape, strides):
    """Whether ``strides`` place the elements of ``shape`` as C order does."""
    return same_layout(shape, strides, contiguous_strides(shape))


def memory_order(shape, strides):
    """The axes of a value packed with ``strides``, from the outermost in memory to the innermost, as an
    elementwise kernel's ``order`` takes them; None where they are in C order."""
    if strides == contiguous_strides(shape):
        return None
    return tuple(sorted(range(len(shape)), key=lambda axis: -strides[axis]))


def compute_type(dtype):
    """The C type a value of ``dtype`` is computed in, and a reduction of it accumulates in (a float8 is only ever
    held, in float, on its way to or from a cast)."""
    return "float" if is_narrow_float(dtype) or is_float8(dtype) else STORAGE[dtype.name]


def storage_type(dtype):
    return STORAGE[dtype.name]


# -- literals and op expressions ---------------------------------------------------------------


def literal(value, dtype):
    """``value`` as a C expression of ``dtype``'s compute type, exactly."""
    value = np.asarray(value).astype(dtype)[()]
    kind = kind_of(dtype)
    if kind == "b":
        return "true" if value else "false"
    if kind in "iu":
        number = int(value)
        if number == -(2 ** 63):
            return "(-9223372036854775807LL - 1)"
        return f"(({STORAGE[dtype.name]}){number}{'ULL' if kind == 'u' else 'LL'})"
    c = compute_type(dtype)
    number = float(value)
    if math.isnan(number):
        return "__int_as_float(0x7fc00000)" if c == "float" else "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(number):
        bits = ("0x7f800000", "0xff800000") if c == "float" else ("0x7ff0000000000000LL", "0xfff0000000000000LL")
        pattern = bits[number < 0]
        return f"__int_as_float({pattern})" if c == "float" else f"__longlong_as_double({pattern})"
    return f"(({c}){number.hex()})"


def _math(name, dtype):
    return name + ("f" if compute_type(dtype) == "float" else "")


@dataclass(frozen=True)
class _Operands:
    """What an op's C expression is built from: the body term, the dtype the op computes in, and
    its operands' C expressions, ``arg(k)`` converted to that dtype's compute type, ``raw(k)`` as is."""

    term: object
    dtype: np.dtype
    names: dict

    @property
    def c(self):
        return compute_type(self.dtype)

    def raw(self, k):
        return self.names[self.term.args[k]]

    def arg(self, k):
        converted = compute_type(self.term.args[k].dtype) == self.c
        return self.raw(k) if converted else f"(({self.c}){self.raw(k)})"


def _math_function(name):
    """A ``<math.h>`` function of one operand, in its float form (``expf``) where the op computes in float."""
    return lambda o: f"{_math(name, o.dtype)}({o.arg(0)})"


def _infix(symbol):
    return lambda o: f"({o.arg(0)} {symbol} {o.arg(1)})"


def _logical(symbol):
    """A logical op of NumPy's: each operand's truth (a number's: not 0, NaN included), then ``symbol`` on them."""
    return lambda o: f"((bool)({o.raw(0)}) {symbol} (bool)({o.raw(1)}))"


def _abs(o):
    x = o.arg(0)
    if is_float(o.dtype):
        return f"{_math('fabs', o.dtype)}({x})"
    return x if kind_of(o.dtype) in "ub" else f"({x} < 0 ? -{x} : {x})"


def _relu(o):
    x, c = o.arg(0), o.c
    return f"(({x} > ({c})0 || {x} != {x}) ? {x} : ({c})0)"


def _power(o):
    if is_exact_power_of_two(o.term):  # a float8 scale: exactly 2^k (pow may be a unit off), NaN kept
        k = o.arg(1)
        return f"(({k}) != ({k}) ? ({k}) : {_math('ldexp', o.dtype)}(({o.c})1, (int)({k})))"
    if is_float(o.dtype):
        return f"{_math('pow', o.dtype)}({o.arg(0)}, {o.arg(1)})"
    if may_fail(o.term):
        raise BackendError(f"{o.term!r}: an integer power whose exponent may be negative, where NumPy raises; a GPU "
                           f"kernel cannot stop its step. Make the exponent unsigned or one non-negative constant, "
                           f"or cast to a float")
    return f"ct_ipow<{o.c}>({o.arg(0)}, {o.arg(1)})"


def _cast(o):
    x = o.raw(0)
    saturated = _saturated_conversion(o)
    if saturated is not None:
        return saturated
    if kind_of(o.dtype) == "b":
        return f"({x} != 0)"
    if o.dtype.name in HALVES:  # round as the stored value would be
        return f"ct_load({HALVES[o.dtype.name]}((float){x}))"
    if is_float8(o.dtype):  # rounded to nearest even and saturated (satfinite: beyond the largest, the largest)
        wide = "double" if o.term.args[0].dtype == np.float64 else "float"
        return f"float({STORAGE[o.dtype.name]}(({wide}){x}))"
    return f"(({o.c}){x})"


# integer types a float converts into, clamped, by one instruction (cvt.sat); their PTX names are in PRELUDE
SATURATING = ("int8", "uint8", "int16", "uint16")


def _splat(t):
    """The one value of constant ``t`` (through broadcasts), else None."""
    while t.op is BROADCAST_TO:
        t = t.args[0]
    return t.attr("value").scalar if t.op is CONST else None


def _clamped(t, dtype):
    """``v`` where ``t`` is ``v`` clamped into integer ``dtype``'s range by a ``minimum`` and a ``maximum``
    (nested either way, either operand order) with the range's ends as constants; else None."""
    info = np.iinfo(dtype)
    bounds = {MAXIMUM: info.min, MINIMUM: info.max}
    for _ in range(2):
        if t.op not in bounds:
            return None
        inner = [a for a, b in (t.args, t.args[::-1]) if _splat(b) is not None and _splat(b) == bounds[t.op]]
        if not inner:
            return None
        del bounds[t.op]
        t = inner[0]
    return t


def _saturated_conversion(o):
    """A cast to a ``SATURATING`` type of a float value clamped into its range, written as one saturating
    conversion, rounding to nearest where the value is a ``rint`` (the quantize ops' levels); else None. The
    clamp and the cast took eight instructions, two of them conversions; the result is the same, NaN included
    (0). Where the clamped value is read elsewhere too, it is computed anyway: nothing is saved, nothing lost."""
    if o.dtype.name not in SATURATING:
        return None
    value = _clamped(o.term.args[0], o.dtype)
    if value is None or compute_type(value.dtype) != "float":
        return None
    nearest = value.op is RINT
    source = value.args[0] if nearest else value
    if compute_type(source.dtype) != "float":
        return None
    return f"ct_saturated<{STORAGE[o.dtype.name]}, {'true' if nearest else 'false'}>({o.names[source]})"


ARITHMETIC = {ADD: "+", SUBTRACT: "-", MULTIPLY: "*", DIVIDE: "/"}
COMPARISONS = {LESS: "<", LESS_EQUAL: "<=", GREATER: ">", GREATER_EQUAL: ">=", EQUAL: "==", NOT_EQUAL: "!="}

C_EXPRESSIONS = {  # op -> its C expression, a function of the ``_Operands`` of one body term
    NEGATIVE: lambda o: f"(-{o.arg(0)})",
    **{op: _math_function(name) for op, name in ((EXP, "exp"), (LOG, "log"), (LOG1P, "log1p"), (EXPM1, "expm1"),
                                                 (SQRT, "sqrt"), (TANH, "tanh"), (RINT, "rint"), (SIN, "sin"),
                                                 (COS, "cos"))},
    ABS: _abs,
    SIGN: lambda o: f"ct_sign<{o.c}>({o.arg(0)})",
    RELU: _relu,
    **{op: _infix(symbol) for op, symbol in (ARITHMETIC | COMPARISONS).items()},
    **{op: _logical(symbol) for op, symbol in ((LOGICAL_AND, "&&"), (LOGICAL_OR, "||"), (LOGICAL_XOR, "!="))},
    LOGICAL_NOT: lambda o: f"(!(bool)({o.raw(0)}))",
    MAXIMUM: lambda o: f"ct_max<{o.c}>({o.arg(0)}, {o.arg(1)})",
    MINIMUM: lambda o: f"ct_min<{o.c}>({o.arg(0)}, {o.arg(1)})",
    POWER: _power,
    # both operands cast to the compute type, so that a float's or a double's overload is the one called
    FLOOR_DIVIDE: lambda o: f"ct_floor_divide(({o.c})({o.arg(0)}), ({o.c})({o.arg(1)}))",
    REMAINDER: lambda o: f"ct_remainder(({o.c})({o.arg(0)}), ({o.c})({o.arg(1)}))",
    WHERE: lambda o: f"(({o.raw(0)}) ? {o.arg(1)} : {o.arg(2)})",
    CAST: _cast,
    STOP_GRADIENT: lambda o: o.raw(0),  # (identities: simplify takes them out of a program before this)
    FLOAT8_GRADIENT: lambda o: o.raw(0),
}


def _operand_dtype(t):
    """The dtype an op computes in: the result's, except comparisons (their operands')."""
    if t.op in COMPARISONS:
        return np.result_type(*(a.dtype for a in t.args))
    return t.dtype


def expression(t, names):
    """The C expression of body term ``t`` from its operands' variable ``names``."""
    build = C_EXPRESSIONS.get(t.op)
    if build is None:
        raise BackendError(f"{t!r}: the cupy backend has no kernel for {t.op.name}")
    return build(_Operands(t, _operand_dtype(t), names))


# -- index arithmetic --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Dim:
    size: int
    var: str  # the linear index this dimension is a digit of
    inner: int  # the product of the sizes of the later dimensions of the same linear index
    total: int  # the size of that linear index's whole range


def _space(shape, var):
    """The dimensions of ``shape``, all digits of one linear index ``var``."""
    dims, inner = [], 1
    for d in reversed(shape):
        dims.append(_Dim(d, var, inner, math.prod(shape)))
        inner *= d
    return tuple(reversed(dims))


def _reduction_space(shape, axes):
    """The input dimensions of a reduction: kept ones are digits of ``o``, reduced ones of ``r``."""
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    reduced = tuple(d for i, d in enumerate(shape) if i in axes)
    digits = {"o": list(_space(kept, "o")), "r": list(_space(reduced, "r"))}
    return tuple(digits["r" if i in axes else "o"].pop(0) for i in range(len(shape)))


def _digit(var, inner, size, total):
    """The C expression of the digit of linear index ``var`` that counts ``size`` steps of ``inner``
    (``total``: the index's whole range)."""
    if size == 1:
        return "0"
    digit = var if inner == 1 else f"({var} / {inner})"
    return digit if inner * size == total else f"({digit} % {size})"


def offset(space, operand):
    """The C expression of ``operand``'s element offset at a point of ``space`` (right-aligned)."""
    lead = len(space) - len(operand.shape)
    groups = []  # (var, inner, size, stride) of merged dimensions, outer first
    for d, dim in enumerate(space[lead:]):
        size, stride = operand.shape[d], operand.strides[d]
        if size == 1 or stride == 0 or dim.size == 1:
            continue
        if groups:
            var, inner, gsize, gstride = groups[-1]
            if var == dim.var and inner == dim.inner * dim.size and gstride == stride * dim.size:
                groups[-1] = (var, dim.inner, gsize * dim.size, stride)
                continue
        groups.append((dim.var, dim.inner, dim.size, stride))
    terms = []
    for var, inner, size, stride in groups:
        digit = _digit(var, inner, size, next(dim.total for dim in space if dim.var == var))
        terms.append(digit if stride == 1 else f"{digit} * {stride}")
    return " + ".join(terms) or "0"


def is_identity(space, operand):
    """Whether ``operand`` is read at the flat index of an elementwise ``space`` itself."""
    return offset(space, operand) == space[0].var if space else False


# -- bodies ------------------------------------------------------------------------------------


def shifted_operands(body):
    """The indices of the parameters that a ``pad`` in ``body`` reads: at other indices than the outputs'. (An
    output padded at the end of its rows, ``rules.fusion.padded_rows``, pads what it computes at its own indices.)"""
    padded = {t for t in body if padded_rows(t) is not None}
    return {t.args[0].attr("index") for t in post_order(body) if t.op is PAD and t not in padded}


class _Writer:
    """Statements computing body terms at one point of one space, each term once. ``order``: the axes of the
    outputs in the order ``space`` walks them (None: as they are)."""

    def __init__(self, space, operands, prefix, loads=None, order=None):
        self.space, self.operands, self.prefix = space, operands, prefix
        self.loads = loads or {}  # parameter index -> an expression already holding its element
        self.order = tuple(range(len(space))) if order is None else tuple(order)
        self.names, self.lines = {}, []
        self.read = set()  # the indices of the parameters read

    def bind(self, term, expression_text):
        self.names[term] = expression_text

    def _padded_read(self, t):
        """A ``pad`` of an operand: the operand's element ``lows`` before this point along each axis where the
        point is inside it, the padding value elsewhere (a negative low crops)."""
        k = t.args[0].attr("index")
        operand = self.operands[k]
        lead, operand_lead = len(self.space) - t.ndim, len(self.space) - len(operand.shape)
        inside, terms = [], []
        for j, dim in enumerate(self.space):
            axis, operand_axis = self.order[j] - lead, j - operand_lead
            if axis < 0 or operand_axis < 0:
                continue
            low, n, stride = t.attr("pad_width")[axis][0], operand.shape[operand_axis], operand.strides[operand_axis]
            source = f"(long long){_digit(dim.var, dim.inner, dim.size, dim.total)}"
            if low:
                source = f"({source} {'-' if low > 0 else '+'} {abs(low)})"
            if low > 0 or low + n < dim.size:
                inside.append(f"{source} >= 0 && {source} < {n}")
            if stride and n > 1:
                terms.append(f"{source} * {stride}")
        read = f"ct_load(in{k}[{' + '.join(terms) or '0'}])"
        if not inside:
            return read
        fill = literal(t.attr("constant_values"), t.dtype)
        return f"({' && '.join(inside)}) ? {read} : ({compute_type(t.dtype)})({fill})"

    def _judged(self, t):
        """The names of ``t``'s operands, each half-precision one this kernel computed (and keeps in float) rounded to
        its dtype where ``t`` leaves half precision: a comparison, a conversion to an integer, a bool or a wider float
        takes the value the program says, not the more precise one the kernel holds (a float16 ``expm1(x) <= x`` at
        float16's smallest normal is True, its float32 value says False). A loaded value, a constant and a cast to half
        precision are that value already."""
        rounded = {}
        for a in t.args:
            source = a
            while source.op is BROADCAST_TO:
                source = source.args[0]
            if a.dtype.name in HALVES and t.dtype != a.dtype and source.op not in (PARAM, CONST, PAD, CAST):
                rounded[a] = f"ct_load({HALVES[a.dtype.name]}({self.names[a]}))"
        return {**self.names, **rounded} if rounded else self.names

    def value(self, t):
        if t in self.names:
            return self.names[t]
        if t.op is not PAD:  # a pad reads its operand itself, at its own indices
            for a in t.args:
                self.value(a)
        name = f"{self.prefix}{len(self.lines)}"
        if t.op is PAD and t.args[0].op is PARAM:
            text = self._padded_read(t)
        elif t.op is PARAM:
            k = t.attr("index")
            self.read.add(k)
            source = self.loads.get(k) or f"in{k}[{offset(self.space, self.operands[k])}]"
            text = f"ct_load({source})"
        elif t.op is CONST:
            text = literal(t.attr("value").scalar if t.ndim else t.attr("value").array, t.dtype)
        elif t.op is BROADCAST_TO:
            self.names[t] = self.names[t.args[0]]
            return self.names[t]
        elif t.op.kind == ELEMENTWISE:
            text = expression(t, self._judged(t))
        else:
            raise BackendError(f"{t!r}: a fused kernel cannot compute {t.op.name} here")
        self.lines.append(f"const {compute_type(t.dtype)} {name} = {text};")
        self.names[t] = name
        return name


def _signature(operands, outputs, aliased):
    """The kernel's parameters: ``restrict`` only where no output shares the input's memory."""
    params = []
    for k, o in enumerate(operands):
        restrict = "" if k in aliased else " __restrict__"
        params.append(f"const {storage_type(o.dtype)}*{restrict} in{k}")
    params += [f"{storage_type(t.dtype)}* out{k}" for k, t in enumerate(outputs)]
    return ", ".join(params)


def kernel_name(text):
    """A kernel's name: the hash of its text, so equal kernels share one compiled module."""
    return "ct_" + hashlib.sha256(text.encode()).hexdigest()[:16]


def finished_source(kind, body_text, outputs, operands, aliased, blocks, block, extra=None, before=""):
    """The kernel ``kind`` named by the hash of its text, with the prelude; ``outputs`` are what it writes (their
    ``dtype`` is read); ``extra``: a last parameter's declaration; ``before``: device functions it calls. A block of
    more than ``THREADS`` threads bounds the registers a thread takes, so that the block can be launched."""
    signature = _signature(operands, outputs, aliased) + (f", {extra}" if extra else "")
    threads = math.prod(block) if block else THREADS
    bounds = f"__launch_bounds__({threads}) " if threads > THREADS else ""
    text = (f'{before}extern "C" __global__ void {bounds}{kind}({signature}) {{\n'
            f'  {WAIT_PRIOR_GRIDS}\n{body_text}}}\n')
    name = kernel_name(text)
    return Source(name, PRELUDE + text.replace(f"void {bounds}{kind}(", f"void {bounds}{name}(", 1), blocks, block)


def _index_type(outputs, operands):
    largest = max([math.prod(t.shape) for t in outputs] +
                  [1 + sum((d - 1) * s for d, s in zip(o.shape, o.strides)) for o in operands])
    return "unsigned int" if largest < 2 ** 31 else "unsigned long long"


def _vector_width(outputs, operands, space):
    """The elements a thread takes at a time: 16 bytes of the narrowest type (8 elements at most), or of the widest
    where those would take a thread more than ``THREAD_VECTOR_BYTES`` of its operands' and results' elements."""
    itemsizes = [t.dtype.itemsize for t in outputs] + [o.dtype.itemsize for o in operands
                                                       if is_identity(space, o) or _row_stride(space, o, 1)]
    vec = max(1, min(8, 16 // min(itemsizes)))
    while vec * sum(itemsizes) > THREAD_VECTOR_BYTES and vec * max(itemsizes) > 16:
        vec //= 2
    return vec


def _row_stride(space, operand, vec):
    """The elements between the rows of ``operand`` where it holds an elementwise ``space``'s elements in order but
    for its rows lying further apart (a weight gradient cropped from the product with its bias gradient's columns,
    ``lowering/bias_gradient_ones.py``), and ``vec`` elements at a time lie in one row; else None."""
    shape = tuple(d.size for d in space)
    if operand.shape != shape or len(shape) < 2 or operand.strides[-1] != 1:
        return None
    n, stride = shape[-1], operand.strides[-2]
    rows = contiguous_strides(shape[:-1] + (stride,))
    if stride <= n or n % vec or stride % vec or tuple(operand.strides[:-1]) != tuple(rows[:-1]):
        return None
    return stride


def _output_vector(shape, padded, vec):
    """The index of vector ``j`` of an elementwise kernel over ``shape`` in an output written plainly (``padded``
    None) or with constants after each row (``padded``, its ``pad`` term: ``rules.fusion.padded_rows``)."""
    if padded is None:
        return "j"
    per_row = shape[-1] // vec
    return f"j / {per_row} * {padded.shape[-1] // vec} + j % {per_row}"


def _row_constants(shape, padded, vec):
    """Lines in which the thread of each row's first vector writes the constants after the row, in each output of
    ``padded`` (``{k: its pad term}``)."""
    if not padded:  # (a kernel of one value has no rows)
        return []
    per_row = shape[-1] // vec
    return [line for k, t in padded.items() for line in (
        f"    if (j % {per_row} == 0) {{", "      " + constants_after_row(k, t, shape[-1], f"j / {per_row}"), "    }")]


def constants_after_row(k, pad, n, row):
    """The statement writing the constants that ``pad`` (an output padded at the end of its rows,
    ``rules.fusion.padded_rows``) puts after row ``row`` (a C expression) of ``n`` elements, in output ``k``."""
    length = pad.shape[-1]
    fill = f"ct_store<{storage_type(pad.dtype)}>({literal(pad.attr('constant_values'), pad.dtype)})"
    return f"for (int q = {n}; q < {length}; ++q) out{k}[{row} * {length} + q] = {fill};"


def _permuted(operand, order):
    """``operand`` as read over a space whose axes are the outputs' taken in ``order``: right-aligned to the
    outputs' rank (broadcast where it has fewer axes), then permuted."""
    lead = len(order) - len(operand.shape)
    shape, strides = (1,) * lead + operand.shape, (0,) * lead + operand.strides
    return Operand(tuple(shape[a] for a in order), operand.dtype, tuple(strides[a] for a in order))


def _elementwise_part(body, operands, order=None, offset=None):
    """``(statements, blocks)``: the loop computing ``body``'s outputs a thread per ``VEC`` elements, a scalar loop
    taking the tail, over ``blocks`` blocks of ``THREADS``: the whole grid, or, from the block named by the C
    expression ``offset`` on, its own of a grid shared with other parts. ``order`` as ``elementwise_source``'s."""
    padded = {k: t for k, t in enumerate(body) if padded_rows(t) is not None}
    body = [padded_rows(t) if k in padded else t for k, t in enumerate(body)]
    shape = body[0].shape
    if any(t.shape != shape for t in body):  # each output is written over the first one's elements
        raise BackendError(f"an elementwise kernel writes outputs of one shape, not {[t.shape for t in body]}")
    if order is not None:
        if padded:
            raise BackendError(f"an elementwise kernel writes padded rows in order only, not in {order}")
        shape = tuple(shape[a] for a in order)
        operands = [_permuted(o, order) for o in operands]
    n = math.prod(shape)
    space = _space(shape, "i")
    read = sorted({t.attr("index") for t in post_order(body) if t.op is PARAM})
    vec = _vector_width(body, [operands[k] for k in read], space)
    while vec > 1 and padded and any(t.shape[-1] % vec for t in [body[0], *padded.values()]):  # vectors in rows
        vec //= 2
    index = _index_type(body, [operands[k] for k in read])
    shifted = shifted_operands(body)
    identity = [k for k in read if k not in shifted and is_identity(space, operands[k])]
    apart = {k: stride for k in read if k not in shifted and k not in identity
             and (stride := _row_stride(space, operands[k], vec)) is not None}
    blocks = max(1, -(-max(n // vec, 1) // THREADS))
    block, grid = ("blockIdx.x", "gridDim.x") if offset is None else (f"(blockIdx.x - {offset})", f"{blocks}u")

    def element(loads, store):
        w = _Writer(space, operands, "v", loads, order)
        values = [w.value(t) for t in body]
        return w.lines + [store(k, t, v) for k, (t, v) in enumerate(zip(body, values))]

    vector_loads = {k: f"a{k}.v[u]" for k in identity + list(apart)}
    lines = [f"  const {index} stride = ({index}){grid} * blockDim.x;",
             f"  for ({index} j = ({index}){block} * blockDim.x + threadIdx.x; j < {n // vec}; j += stride) {{"]
    lines += [f"    const ct_vec<{storage_type(operands[k].dtype)}, {vec}> a{k} = "
              f"reinterpret_cast<const ct_vec<{storage_type(operands[k].dtype)}, {vec}>*>(in{k})[j];" for k in identity]
    lines += [f"    const ct_vec<{storage_type(operands[k].dtype)}, {vec}> a{k} = "
              f"reinterpret_cast<const ct_vec<{storage_type(operands[k].dtype)}, {vec}>*>(in{k})"
              f"[j / {shape[-1] // vec} * {stride // vec} + j % {shape[-1] // vec}];" for k, stride in apart.items()]
    lines += [f"    ct_vec<{storage_type(t.dtype)}, {vec}> o{k};" for k, t in enumerate(body)]
    lines += ["    #pragma unroll", f"    for (int u = 0; u < {vec}; ++u) {{", f"      const {index} i = j * {vec} + u;"]
    lines += ["      " + s for s in element(vector_loads, lambda k, t, v: f"o{k}.v[u] = ct_store<{storage_type(t.dtype)}>({v});")]
    lines += ["    }"]
    lines += [f"    reinterpret_cast<ct_vec<{storage_type(t.dtype)}, {vec}>*>(out{k})"
              f"[{_output_vector(shape, padded.get(k), vec)}] = o{k};" for k, t in enumerate(body)]
    lines += _row_constants(shape, padded, vec)
    lines += ["  }"]
    if n % vec:
        lines += [f"  for ({index} i = {n - n % vec} + ({index}){block} * blockDim.x + threadIdx.x; i < {n}; i += stride) {{"]
        lines += ["    " + s for s in element({}, lambda k, t, v: f"out{k}[i] = ct_store<{storage_type(t.dtype)}>({v});")]
        lines += ["  }"]
    return lines, blocks


def elementwise_source(body, operands, aliased=(), order=None):
    """One thread per ``VEC`` elements of the outputs' shape; a scalar loop takes the tail. ``order``: the outputs'
    axes from the outermost in memory to the innermost where they are not stored in C order (channels last),
    which the kernel then walks in memory order."""
    lines, blocks = _elementwise_part(body, operands, order)
    return finished_source("elementwise", "\n".join(lines) + "\n", body, operands, aliased, blocks, (THREADS, 1, 1))


def _accumulator(reduction):
    dtype = reduction.dtype
    return "int" if kind_of(dtype) == "b" else compute_type(dtype)


def _identity(reduction, acc):
    if reduction.op is not MAX:
        return f"({acc})0"
    dtype = reduction.dtype
    if is_float(dtype):
        return literal(-np.inf, dtype)
    if kind_of(dtype) == "b":
        return "0"
    return literal(np.iinfo(dtype).min, dtype)


def _combine(reduction, acc, a, b):
    return f"ct_max<{acc}>({a}, {b})" if reduction.op is MAX else f"({a} + {b})"
