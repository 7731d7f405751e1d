"""The convolution target: ``dnn_conv``, cuDNN's three convolutions, and the rules that recognise them.

cuDNN computes a convolution three ways, each over PyTorch's layout: ``fprop`` (the forward
convolution of an input with weights), ``dgrad`` (its data gradient, from the output's gradient and
the same weights) and ``wgrad`` (its weight gradient, from the input and the output's gradient). The
derivative rules write both gradients as plain ``conv`` terms (``rules.convolution_vjps``); the
rules here read each ``conv`` back as the cuDNN call that computes it without materialising what the
plain form spells out:

- a convolution of an input dilated by ``s`` (``lhs_dilation``), or of stride 1 with weights flipped in
  space, is the data gradient of a forward convolution of stride ``s``, whose weights are the given
  ones flipped back and with their channels swapped back (which cancels the flip and swap the
  derivative wrote, so nothing is computed);
- a convolution of a transposed input with a transposed kernel, transposed back, is a weight
  gradient: the ``N``-axis of both is what it sums over;
- every other convolution is a forward one; padding with a negative side (a crop) and an input
  dilation no gradient form explains are spelled out first with ``pad`` and ``reshape``;
- one cuDNN cannot take (more than three spatial axes, integer operands) is a matrix product over
  its windows, which the gemm target, after this one, lowers in turn.

``dnn_conv`` keeps the geometry of the forward convolution it belongs to (``strides``, ``padding``
as non-negative ``(low, high)`` pairs, ``dilation``, ``groups``) and the shape it makes, which a
strided forward convolution leaves ambiguous for ``dgrad``. Its reference semantics are the plain
form's, evaluated by the reference interpreter. ``calls.cudnn_conv`` runs it; cuDNN takes 1 to 3 spatial axes,
in float16, bfloat16, float32 and float64.
"""

import math
from collections import Counter

import numpy as np

from ....exprgraph import constructors as ct
from ....exprgraph.dtypes import BFLOAT16
from ....exprgraph.graph import post_order
from ....exprgraph.ops import ADD, FLIP, LOWERED, RELU, RESHAPE, TRANSPOSE, Op
from ....exprgraph.windowing import window_extent
from ....exprgraph.term import make, shape_violation
from ....rules.algebra import algebra
from ....rules.convolution_vjps import conv_input_vjp, conv_weight_vjp
from ....rules.engine import Rewrite, Rule, RuleSet, bottom_up

MODES = ("fprop", "dgrad", "wgrad")
DNN_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)) + ((BFLOAT16,) if BFLOAT16 else ())
MAX_SPATIAL = 3


EPILOGUES = ("none", "relu", "bias", "bias_relu", "add", "add_relu", "bias_add", "bias_add_relu")


def epilogue_parts(epilogue):
    """The steps of an epilogue, in order: of ``bias`` (a per-channel vector added), ``add`` (a tensor of the
    result's shape added), ``relu``."""
    return tuple(part for part in epilogue.split("_") if part != "none")


def _meaning(args, mode, strides, padding, dilation, groups, shape, epilogue="none"):
    """The plain convolution a ``dnn_conv`` computes, over ``args`` (terms), then its epilogue."""
    ones = (1,) * len(strides)
    if mode == "fprop":
        out = ct.conv(*args[:2], strides=strides, padding=padding, rhs_dilation=dilation, groups=groups)
        extras = iter(args[2:])
        for part in epilogue_parts(epilogue):
            if part == "bias":
                out = out + ct.reshape(next(extras), (-1,) + (1,) * (len(shape) - 2))
            elif part == "add":
                out = out + next(extras)
            else:
                out = ct.relu(out)
        return out
    x_like, w_like = (ct.var("x", shape, args[0].dtype), args[1]) if mode == "dgrad" else \
                     (args[0], ct.var("w", shape, args[0].dtype))
    x, w, dy = (x_like, w_like, args[0]) if mode == "dgrad" else (x_like, w_like, args[1])
    bindings = {"_x": x, "_w": w, "_dy": dy, "_s": strides, "_p": padding, "_l": ones, "_r": dilation, "_g": groups}
    return conv_input_vjp(bindings) if mode == "dgrad" else conv_weight_vjp(bindings)


def _shape(args, mode, strides, padding, dilation, groups, shape, epilogue):
    if mode not in MODES:
        raise shape_violation(f"dnn_conv's mode is one of {MODES}, not {mode!r}")
    if epilogue not in EPILOGUES or (epilogue != "none" and mode != "fprop"):
        raise shape_violation(f"a {mode} dnn_conv's epilogue is {'one of ' + str(EPILOGUES) if mode == 'fprop' else 'none'}"
                              f", not {epilogue!r}")
    parts = epilogue_parts(epilogue)
    if len(args) != 2 + parts.count("bias") + parts.count("add"):
        raise shape_violation(f"dnn_conv takes its two operands, then a bias and a residual as its epilogue "
                              f"{epilogue!r} names them: not {len(args)} arguments")
    extras = dict(zip([p for p in parts if p != "relu"], args[2:]))
    if "bias" in extras and extras["bias"].shape != shape[1:2]:
        raise shape_violation(f"a bias of {shape[1]} channels, not {extras['bias'].shape}")
    if "add" in extras and extras["add"].shape != shape:
        raise shape_violation(f"a residual of the result's shape {shape}, not {extras['add'].shape}")
    if any(low < 0 or high < 0 for low, high in padding):
        raise shape_violation(f"cuDNN pads, it does not crop: padding {padding}")
    made = _meaning(args[:2], mode, strides, padding, dilation, groups, shape).shape
    if made != shape:
        raise shape_violation(f"a {mode} of {[a.shape for a in args[:2]]} makes {made}, not {shape}")
    return shape


def _normalize(args, mode, strides, padding, dilation, groups, shape, epilogue="none"):
    return (mode, tuple(strides), tuple(tuple(p) for p in padding), tuple(dilation), int(groups), tuple(shape),
            str(epilogue))


def _dtype(args, *attrs):
    return args[0].dtype


def _evaluate(xs, *attrs):
    from ...reference import evaluate

    names = [f"a{k}" for k in range(len(xs))]
    terms = [ct.var(name, x.shape, x.dtype) for name, x in zip(names, xs)]
    (value,) = evaluate([_meaning(terms, *attrs)], dict(zip(names, xs)))
    return value


DNN_CONV = Op("dnn_conv", None, ("mode", "strides", "padding", "dilation", "groups", "shape", "epilogue"), _shape,
              _dtype, LOWERED, _normalize, evaluate=_evaluate)


def dnn_conv(a, b, mode, strides, padding, dilation, groups, shape, epilogue="none", extras=()):
    """The term of cuDNN's ``mode`` convolution of ``a`` and ``b`` (see the module docstring), and, for a forward
    one, its ``epilogue`` over ``extras`` (a bias, then a residual, as the epilogue names them)."""
    args = (a, b) + tuple(extras)
    return make(DNN_CONV, args, _normalize(args, mode, strides, padding, dilation, groups, shape, epilogue))


# -- recognising the gradients --------------------------------------------------------------------


def _spatial(t):
    return tuple(range(2, t.ndim))


def _flipped(v):
    """Whether ``v`` is weights flipped in space, as a data gradient's are."""
    return v.op is FLIP and v.attr("axes") == _spatial(v)


def _unflipped(v):
    """``v`` flipped back in space: the flip the derivative wrote, taken off, or a new one."""
    if _flipped(v):
        return v.args[0]
    return ct.flip(v, axis=_spatial(v))


def _unswapped(u, groups):
    """Weights ``(G*Cg, Kg, *k)`` with their channels swapped back to ``(G*Kg, Cg, *k)`` (within each group)."""
    if groups == 1:
        return ct.transpose(u, (1, 0) + _spatial(u))
    cg, kg = u.shape[0] // groups, u.shape[1]
    split = ct.reshape(u, (groups, cg, kg) + u.shape[2:])
    moved = ct.transpose(split, (0, 2, 1) + tuple(a + 1 for a in _spatial(u)))
    return ct.reshape(moved, (groups * kg, cg) + u.shape[2:])


def _forward_high(size, low, extent, count, stride):
    """The forward convolution's high padding that gives ``count`` outputs of an axis of ``size``: the least
    non-negative one, or None where a crop would be needed."""
    least = (count - 1) * stride + extent - size - low
    high = max(least, 0)
    return high if high <= least + stride - 1 else None


def _as_dgrad(dy, v, padding, lhs, rhs, groups, shape):
    """A stride-1 convolution of ``dy`` dilated by ``lhs``: the data gradient of a forward convolution of stride
    ``lhs``, or None where that forward convolution would need a crop."""
    w = _unswapped(_unflipped(v), groups)
    pairs = []
    for size, kernel, (low, _), stride, tap, count in zip(shape[2:], w.shape[2:], padding, lhs, rhs, dy.shape[2:]):
        extent = window_extent(kernel, tap)
        forward_low = extent - 1 - low
        high = _forward_high(size, forward_low, extent, count, stride)
        if forward_low < 0 or high is None:
            return None
        pairs.append((forward_low, high))
    return dnn_conv(dy, w, "dgrad", lhs, tuple(pairs), rhs, groups, shape)


def _swaps_leading_axes(t):
    return t.op is TRANSPOSE and t.attr("axes") == (1, 0) + _spatial(t)


def _regrouped_images(t, groups):
    """``x`` where ``t`` is images ``x`` (``(N, G*Cg, ...)``) regrouped to ``(Cg, G*N, ...)`` as the weight gradient
    of a grouped convolution writes them (split, batch and channels swapped, merged); else None."""
    if t.op is not RESHAPE or t.args[0].op is not TRANSPOSE or t.args[0].args[0].op is not RESHAPE:
        return None
    moved = t.args[0]
    split, x = moved.args[0], moved.args[0].args[0]
    n, g, cg = split.shape[:3]
    swapped = moved.attr("axes") == (2, 1, 0) + tuple(range(3, moved.ndim))
    shapes = x.shape == (n, g * cg) + split.shape[3:] and t.shape == (cg, g * n) + split.shape[3:]
    return x if swapped and g == groups and shapes else None


def _as_wgrad(a, b, strides, padding, rhs, groups, out):
    """A convolution of ``x^T`` with ``dy^T`` (channels and batch swapped; with groups, ``x`` regrouped so that
    each group's batch is what its kernel sums over): the transpose of the weight gradient of a forward
    convolution of stride ``rhs`` and dilation ``strides``; None where that is not its form."""
    x = a.args[0] if groups == 1 and _swaps_leading_axes(a) else _regrouped_images(a, groups) if groups > 1 else None
    if x is None or not _swaps_leading_axes(b):
        return None
    dy = b.args[0]
    weights = (dy.shape[1], x.shape[1] // groups) + out[2:]
    pairs = []
    for size, kernel, (low, _), stride, tap, count in zip(x.shape[2:], weights[2:], padding, rhs, strides, dy.shape[2:]):
        high = _forward_high(size, low, window_extent(kernel, tap), count, stride)
        if low < 0 or high is None:
            return None
        pairs.append((low, high))
    wgrad = dnn_conv(x, dy, "wgrad", rhs, tuple(pairs), strides, groups, weights)
    return ct.transpose(wgrad, (1, 0) + _spatial(wgrad))


# -- forward convolutions, and what cuDNN cannot take spelled out -----------------------------------


def _dilated(x, dilation):
    """``x`` with ``d - 1`` zeros between neighbours along each spatial axis, written with reshapes and pads."""
    for axis, d in enumerate(dilation, start=2):
        if d == 1:
            continue
        n = x.shape[axis]
        spread = ct.reshape(x, x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
        widths = [(0, 0)] * spread.ndim
        widths[axis + 1] = (0, d - 1)
        spread = ct.pad(spread, tuple(widths))
        merged = ct.reshape(spread, x.shape[:axis] + (n * d,) + x.shape[axis + 1:])
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, 1 - d)
        x = ct.pad(merged, tuple(widths))
    return x


def _as_fprop(x, w, strides, padding, lhs, rhs, groups):
    x = _dilated(x, lhs)
    pads = padding
    if any(low < 0 or high < 0 for low, high in padding):  # cropped and padded at once: a crop alone may leave nothing
        x, pads = ct.pad(x, ((0, 0), (0, 0)) + tuple(padding)), tuple((0, 0) for _ in padding)
    out = ct.conv(x, w, strides=strides, padding=pads, rhs_dilation=rhs, groups=groups).shape
    return dnn_conv(x, w, "fprop", strides, pads, rhs, groups, out)


def as_matmul_over_windows(x, w, strides, padding, lhs, rhs, groups):
    """A convolution cuDNN cannot take (more than ``MAX_SPATIAL`` axes, integers) as a matrix product over its
    windows: the dilated, padded input's windows (a strided view) as ``(G, N pixels, Cg taps)`` rows, times the
    weights as ``(G, Cg taps, Kg)``; the gemm target makes it cuBLASLt's where it can, a reduction elsewhere."""
    x = ct.pad(_dilated(x, lhs), ((0, 0), (0, 0)) + tuple(padding))
    n, c, k, count = x.shape[0], x.shape[1], w.shape[0], len(strides)
    windows = ct.windows(x, w.shape[2:], strides=strides, dilation=rhs)  # (N, C, *positions, *taps)
    positions = windows.shape[2:2 + count]
    grouped = ct.reshape(windows, (n, groups, c // groups) + windows.shape[2:])
    order = (1, 0) + tuple(range(3, 3 + count)) + (2,) + tuple(range(3 + count, 3 + 2 * count))
    rows = ct.reshape(ct.transpose(grouped, order), (groups, n * math.prod(positions), -1))
    weights = ct.transpose(ct.reshape(w, (groups, k // groups, -1)), (0, 2, 1))
    product = ct.reshape(ct.matmul(rows, weights), (groups, n) + positions + (k // groups,))  # (G, N, *pos, Kg)
    moved = ct.transpose(product, (1, 0, 2 + count) + tuple(range(2, 2 + count)))  # (N, G, Kg, *positions)
    return ct.reshape(moved, (n, k) + positions)


def _lower_conv(b):
    x, w = b["_x"], b["_w"]
    strides, padding, lhs, rhs, groups = b["_s"], b["_p"], b["_l"], b["_r"], b["_g"]
    dtype = b.term.dtype
    if x.dtype != dtype or w.dtype != dtype:
        x, w = ct.cast(x, dtype), ct.cast(w, dtype)
    if dtype not in DNN_DTYPES or not 1 <= x.ndim - 2 <= MAX_SPATIAL:
        return as_matmul_over_windows(x, w, strides, padding, lhs, rhs, groups)
    ones = (1,) * len(strides)
    if strides == ones and (lhs != ones or _flipped(w)):
        found = _as_dgrad(x, w, padding, lhs, rhs, groups, b.term.shape)
        if found is not None:
            return found
    if lhs == ones:
        found = _as_wgrad(x, w, strides, padding, rhs, groups, b.term.shape)
        if found is not None:
            return found
    return _as_fprop(x, w, strides, padding, lhs, rhs, groups)


rules = RuleSet([
    Rule("conv-to-dnn", "conv(_x, _w, strides=_s, padding=_p, lhs_dilation=_l, rhs_dilation=_r, groups=_g)",
         _lower_conv),
    algebra["transpose-transpose"],
    algebra["transpose-identity"],
    algebra["reshape-reshape"],
    algebra["reshape-identity"],
], name="convolution lowering")


def finish(roots, trace=None, keep=frozenset()):
    """``roots`` with each forward convolution's bias, residual and relu folded into its epilogue, where neither
    the convolution nor a partial sum has another user: cuDNN can apply them as it writes the result (or the
    runner follows the convolution with one generated kernel, as fusion would have)."""
    users = Counter(a for t in post_order(roots) for a in t.args)
    users.update(roots)

    def fold(original, rebuilt):
        found = _with_epilogue(original, rebuilt, users)
        if found is None:
            return rebuilt
        if trace is not None:
            trace.append(Rewrite("conv-epilogue", original, found))
        return found

    memo = {}
    return [bottom_up(root, memo, fold) for root in roots]


def _foldable(conv, original, users):
    """Whether ``conv`` (rebuilt from ``original``) is a forward ``dnn_conv`` no other term reads."""
    return conv.op is DNN_CONV and conv.attr("mode") == "fprop" and users[original] == 1


def _extended(conv, part, extra=None):
    """``conv`` with ``part`` appended to its epilogue (and ``extra`` to its arguments)."""
    epilogue = "_".join(epilogue_parts(conv.attr("epilogue")) + (part,))
    extras = conv.args[2:] + ((extra,) if extra is not None else ())
    attrs = conv.attrs
    return dnn_conv(*conv.args[:2], attrs.mode, attrs.strides, attrs.padding, attrs.dilation, attrs.groups, attrs.shape,
                    epilogue=epilogue, extras=extras)


def _channel_vector(v, conv):
    """``v`` as a vector of ``conv``'s channels where it broadcasts as one (``(K, 1, 1)``, say), else None."""
    shape = (1,) * (conv.ndim - v.ndim) + v.shape
    if v.dtype != conv.dtype or shape != (1, conv.shape[1]) + (1,) * (conv.ndim - 2):
        return None
    if v.op is RESHAPE and v.args[0].shape == conv.shape[1:2]:
        return v.args[0]
    return ct.reshape(v, conv.shape[1:2])


def _with_epilogue(original, rebuilt, users):
    """``rebuilt`` (a relu, or a sum, of a foldable convolution) as that convolution with a longer epilogue, or None:
    a relu last; a residual (of the result's shape) before it; a per-channel bias first."""
    if rebuilt.op is RELU:
        conv = rebuilt.args[0]
        if _foldable(conv, original.args[0], users) and "relu" not in epilogue_parts(conv.attr("epilogue")):
            return _extended(conv, "relu")
    if rebuilt.op is not ADD or rebuilt.dtype != rebuilt.args[0].dtype:
        return None
    for k in (0, 1):
        conv, other = rebuilt.args[k], rebuilt.args[1 - k]
        if not _foldable(conv, original.args[k], users):
            continue
        parts = epilogue_parts(conv.attr("epilogue"))
        if other.shape == conv.shape and other.dtype == conv.dtype and not {"add", "relu"} & set(parts):
            return _extended(conv, "add", other)
        bias = _channel_vector(other, conv)
        if bias is not None and not parts:
            return _extended(conv, "bias", bias)
    return None


def alternatives(planned):
    return []
