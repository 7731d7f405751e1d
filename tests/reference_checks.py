"""The check every backend test shares: a compiled program computes what its expressions say, as the reference
interpreter does, element by element: the same NaNs, the same infinities, finite values close."""

import numpy as np
import pytest
from hypothesis import assume

import cortado as ct
from cortado.backends import gpu_visible, names
from cortado.backends.numpy import gemm
from cortado.exprgraph.dtypes import finfo, is_float
from cortado.exprgraph.graph import schedule
from cortado.exprgraph.ops import CONV, EINSUM, MATMUL
from cortado.exprgraph.term import make
from cortado.rules.stability import stabiliser

BACKENDS = [pytest.param(name, marks=pytest.mark.gpu) if name == "cupy" else name for name in names()]
RTOL = {"bfloat16": 5e-2, "float16": 1e-2, "float32": 1e-5, "float64": 1e-12}


def skip_without_device(backend):
    if backend == "cupy" and not gpu_visible():
        pytest.skip("no NVIDIA GPU is visible")


def sums_otherwise(backend, terms):
    """Whether ``backend`` may sum ``terms``' values in another order than the reference does (the GPU's kernels; the
    CPU's own products of matrices, where it has them: ``backends.numpy.gemm``), so a result's rounding error is
    relative to its largest values rather than to each element."""
    return backend != "numpy" or fuses_products(backend, terms)


def fuses_products(backend, terms):
    """Whether ``backend`` multiplies ``terms``' matrices with fused multiply-adds (the GPU; the CPU's own products),
    skipping each product's own rounding: where that rounding overflows, the result is float64's (2 x -3.4e38 beside
    an infinity: NaN written, inf fused) or another overflow's (2 x 3.4e38 and 2 x -3.4e38: NaN written, the first
    partial sum's infinity fused, of either sign, which the ops after it may make finite: a relu of -inf is 0;
    ``check`` does not judge feeds whose products may overflow so); a 0 x inf is NaN either way."""
    if backend == "numpy" and not gemm.available():
        return False
    return any(t.op in (MATMUL, CONV, EINSUM) for t in ct.Graph(terms).schedule)


def _overflows_meet(terms, feed):
    """Whether a product of matrices among ``terms``' values may overflow in one order of its sums and not in another
    (``_past_range`` of its operands' absolute values' product, in float64)."""
    products = [t for t in ct.Graph(terms).schedule if t.op in (MATMUL, CONV, EINSUM) and is_float(t.dtype)]
    if not products:
        return False
    absolute = [make(t.op, [ct.abs(a) for a in t.args], tuple(t.attrs)) for t in products]
    feed = {name: feed[name] for name in ct.Graph(absolute).variables_by_name()}
    return any(_past_range(m, t.dtype).any() for t, m in zip(products, ct.evaluate(absolute, feed, precision="float64")))


def zeros_face_non_finite_weights(terms, feed):
    """Whether a convolution among ``terms``' values pads its image (or puts zeros between its values: an input
    dilation) where its weights hold a NaN or an infinity: the reference multiplies those zeros (0 x inf is NaN),
    cuDNN's convolutions add no term for them (docs/gpu.md, Convolutions), so the GPU's finite value
    and the reference's NaN are both what a convolution says, by two readings of its padding."""
    convs = [t for t in ct.Graph(terms).schedule if t.op is CONV and is_float(t.dtype)
             and (any(low or high for low, high in t.attr("padding")) or any(d > 1 for d in t.attr("lhs_dilation")))]
    if not convs:
        return False
    weights = [t.args[1] for t in convs]
    feed = {name: feed[name] for name in ct.Graph(weights).variables_by_name()}
    return any(not np.isfinite(np.asarray(w, np.float64)).all() for w in ct.evaluate(weights, feed))


def _past_range(magnitude, dtype):
    """Where a sum of finite terms whose absolute values sum to ``magnitude`` may overflow ``dtype`` in some order: at
    its largest value or beyond, within the rounding of a sum (so a partial sum or a product of it, rounded up, may
    pass it), and finite (an infinite term overflows in every order)."""
    magnitude = np.asarray(magnitude, np.float64)
    return np.isfinite(magnitude) & (magnitude >= float(finfo(dtype).max) * (1 - 2.0 ** -10))


def made_in(term):
    """The least precise float dtype of the values ``term`` is made from, where it is less precise than ``term``'s
    own (a float32 convolution cast to float64 keeps float32's rounding, which the CPU's fused multiply-adds may take
    otherwise than the reference); else None."""
    floats = [t.dtype for t in schedule(term) if is_float(t.dtype)]
    least = min(floats, key=lambda d: np.dtype(d).itemsize, default=None)
    return least if least is not None and np.dtype(least).itemsize < np.dtype(term.dtype).itemsize else None


def host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def as_dtype(value, dtype):
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(dtype)


def agrees(ours, reference, dtype, normwise=False, magnitude=None):
    """Elementwise: the same NaNs, the same infinities, finite values within the dtype's tolerance; ``normwise``
    scales the tolerance by the output's largest value, as rounding in another order (the GPU's kernels, its
    fast intrinsics) loses digits to cancellation relative to that; ``magnitude`` (an array of the output's shape)
    by each element's own scale of cancellation: the value computed from the operands' absolute values."""
    ours, reference = ours.astype(np.float64), reference.astype(np.float64)
    same_nan = np.isnan(ours) == np.isnan(reference)
    same_inf = np.where(np.isinf(ours) | np.isinf(reference), ours == reference, True)
    finite = np.isfinite(ours) & np.isfinite(reference)
    rtol = RTOL[np.dtype(dtype).name]
    scale = np.max(np.abs(reference[np.isfinite(reference)]), initial=0.0) if normwise else 0.0
    if magnitude is not None:
        scale = np.maximum(scale, np.nan_to_num(np.asarray(magnitude, np.float64), nan=0.0, posinf=0.0))
    bound = rtol * scale + rtol * np.abs(reference) + 4 * float(finfo(dtype).smallest_subnormal)
    close = np.where(finite, np.abs(ours - reference) <= bound, True)
    huge = float(finfo(dtype).max) * (1 - rtol)
    near_overflow = (np.sign(ours) == np.sign(reference)) & (np.minimum(np.abs(ours), np.abs(reference)) >= huge)
    return same_nan & (same_inf | near_overflow) & close


REORDERED_SPREAD = 8  # a sum in another order is off by up to this many times the reference's own rounding error


def assert_computes_what_it_says(terms, feed, results, more_accurate=False, normwise=False, also=None,
                                 non_finite_alike=False, magnitudes=None, reordered=False):
    """Each of ``results`` agrees, element by element, with the reference in the declared dtypes; with
    ``more_accurate``, the float64 reference rounded to them will do too (a stable form, or half precision kept in
    float32 inside a kernel, gives the finite answer where the written form overflows); ``also``: lists of other
    values the results may have instead, element by element; ``non_finite_alike``: a NaN and an infinity agree;
    ``magnitudes``: per result, the scale each element's rounding error is relative to (``agrees``); ``reordered``:
    sums in another order than the reference's may be as far from float64 as ``REORDERED_SPREAD`` times the
    reference's own error at each element (large where terms cancel: a product of weights of 2^33 summing to 3e5)."""
    declared = ct.evaluate(terms, feed)
    exact = ct.evaluate(terms, feed, precision="float64") if more_accurate or reordered else declared
    for n, (term, ours, said, precise) in enumerate(zip(terms, results, declared, exact)):
        ours = host(ours)
        assert ours.shape == term.shape and ours.dtype == term.dtype, term
        if not is_float(term.dtype):
            np.testing.assert_array_equal(ours, said, err_msg=repr(term))
            continue
        scale = None if magnitudes is None else magnitudes[n]
        if reordered:
            with np.errstate(all="ignore"):
                spread = np.abs(np.asarray(said, np.float64) - np.asarray(precise, np.float64))
            spread = np.where(np.isfinite(spread), spread, 0.0) * REORDERED_SPREAD / RTOL[np.dtype(term.dtype).name]
            scale = spread if scale is None else np.maximum(scale, spread)
        ok = agrees(ours, said, term.dtype, normwise, scale) | agrees(ours, as_dtype(precise, term.dtype), term.dtype,
                                                                      normwise, scale)
        for values in also or ():
            ok |= agrees(ours, as_dtype(values[n], term.dtype), term.dtype, normwise, scale)
        if non_finite_alike:
            ok |= ~np.isfinite(ours.astype(np.float64)) & ~np.isfinite(np.asarray(said, np.float64))
        wrong = [tuple(i) for i in np.argwhere(~ok)[:4]]
        shown = "\n".join(f"  at {i}: ours {ours[i]!r}, reference {np.asarray(said)[i]!r}, float64 {np.asarray(precise)[i]!r}"
                          for i in wrong)
        assert ok.all(), f"{term!r} differs from the reference:\n{shown}\nfeeds {feed}"


def with_gradients(outputs, inputs):
    """``outputs`` and the gradient of the sum of their float elements with respect to each float input."""
    floats = [o for o in outputs if is_float(o.dtype)]
    wrt = [v for v in inputs if is_float(v.dtype)]
    if not floats or not wrt:
        return list(outputs)
    total = sum(ct.sum(ct.cast(o, "float64")) for o in floats)
    return list(outputs) + list(ct.grad(total, wrt))


def run(terms, inputs, feed, backend, **options):
    program = ct.compile(terms, inputs=inputs, backend=backend, **options)
    return program, [host(r) for r in program(**feed)]


def check(terms, inputs, feed, backend, also=(), non_finite_alike=False, magnitudes=None, **options):
    """``terms`` compiled on ``backend`` compute what they say at ``feed``: as the reference does in their dtypes,
    or more accurately only where a stability rule rewrote them (then as the reference computes the stable forms:
    ``-1 + exp(x)`` is ``expm1(x)``, 1.5e-49 where the written form gives 0) or the GPU computes half precision
    in float32."""
    with np.errstate(all="ignore"):
        fused = fuses_products(backend, terms)
        # where a product's sums may overflow in one order and not another (the written form's NaN of infinities
        # that meet, fused multiply-adds' first overflow, which the ops after it may turn into any value: a relu's
        # mask, then a gradient), or the GPU's convolutions read padding otherwise than the reference, there is no
        # one answer to hold them to: such feeds are set aside before anything is compiled
        if fused and _overflows_meet(terms, feed):
            assume(False)
        if backend == "cupy" and zeros_face_non_finite_weights(terms, feed):
            assume(False)
        program, results = run(terms, inputs, feed, backend, **options)
        half = any(t.dtype.itemsize == 2 and is_float(t.dtype) for t in ct.Graph(terms).schedule)
        stabilised = bool(program.traces["stability"])
        if stabilised:
            also = [*also, ct.evaluate(stabiliser.run(list(terms)), feed)]
        more_accurate = stabilised or (backend == "cupy" and half) or fused
        assert_computes_what_it_says(terms, feed, results, more_accurate, normwise=sums_otherwise(backend, terms),
                                     also=also, non_finite_alike=non_finite_alike or fused, magnitudes=magnitudes,
                                     reordered=fused)
