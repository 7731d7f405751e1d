"""The VJPs of convolution and the window ops, which need arithmetic on their geometry.

Every VJP is again a plain convolution or window op, so gradients of gradients work:

- the input's VJP of ``conv`` is the output's adjoint, dilated by the stride (``lhs_dilation``), padded
  so that each input element meets every output it fed, convolved with the weights flipped in space and
  with their input and output channels swapped (within each group); never a transposed convolution;
- the weights' VJP is the input convolved with the output's adjoint: the batch becomes the channels
  that are summed, the adjoint (dilated by the stride) the kernel, and the weight dilation the stride;
- ``windows`` and ``overlap_add`` are each other's adjoints, ``pad`` is undone by the opposite widths
  and ``flip`` by itself.
"""

from ..exprgraph import constructors as ct
from ..exprgraph.windowing import dilated_size, window_extent


def _regrouped(t, groups, shape, axes):
    """``t`` split into ``shape``, its axes permuted by ``axes`` and the first three merged into two as the
    permutation says: how channels trade places within groups. A plain transpose where ``groups`` is 1."""
    split = ct.reshape(t, shape)
    moved = ct.transpose(split, axes)
    merged = moved.shape[:1] + (moved.shape[1] * moved.shape[2],) + moved.shape[3:]
    return ct.reshape(moved, merged)


def _swapped_weights(w, groups):
    """``(G*Kg, Cg, *k)`` weights as ``(G*Cg, Kg, *k)``, flipped in space: the kernel of the input's VJP."""
    kg, cg = w.shape[0] // groups, w.shape[1]
    spatial = tuple(range(2, w.ndim))
    if groups == 1:
        swapped = ct.transpose(w, (1, 0) + spatial)
    else:
        split = ct.transpose(ct.reshape(w, (groups, kg, cg) + w.shape[2:]), (0, 2, 1) + tuple(a + 1 for a in spatial))
        swapped = ct.reshape(split, (groups * cg, kg) + w.shape[2:])
    return ct.flip(swapped, axis=spatial)


def conv_input_vjp(b):
    x, w, dy = b["_x"], b["_w"], b["_dy"]
    strides, padding, lhs, rhs, groups = b["_s"], b["_p"], b["_l"], b["_r"], b["_g"]
    pairs = []
    for size, kernel, stride, (low, _), dilation, tap in zip(x.shape[2:], w.shape[2:], strides, padding, lhs, rhs):
        extent = window_extent(kernel, tap)
        front = extent - 1 - low
        pairs.append((front, (size - 1) * dilation + extent - dilated_size(dy.shape[2 + len(pairs)], stride) - front))
    return ct.conv(dy, _swapped_weights(w, groups), strides=lhs, padding=tuple(pairs), lhs_dilation=strides,
                   rhs_dilation=rhs, groups=groups)


def conv_weight_vjp(b):
    x, w, dy = b["_x"], b["_w"], b["_dy"]
    strides, padding, lhs, rhs, groups = b["_s"], b["_p"], b["_l"], b["_r"], b["_g"]
    n, cg = x.shape[0], x.shape[1] // groups
    spatial = tuple(range(2, x.ndim))
    if groups == 1:
        images = ct.transpose(x, (1, 0) + spatial)
    else:  # (N, G*Cg, ...) -> (Cg, G*N, ...): the batch, within each group, is what the kernel sums over
        images = _regrouped(x, groups, (n, groups, cg) + x.shape[2:], (2, 1, 0) + tuple(a + 1 for a in spatial))
    kernels = ct.transpose(dy, (1, 0) + spatial)
    pairs = []
    for size, kernel, stride, (low, _), dilation, tap, count in zip(
            x.shape[2:], w.shape[2:], strides, padding, lhs, rhs, dy.shape[2:]):
        pairs.append((low, (kernel - 1) * tap + dilated_size(count, stride) - dilated_size(size, dilation) - low))
    result = ct.conv(images, kernels, strides=rhs, padding=tuple(pairs), lhs_dilation=lhs, rhs_dilation=strides,
                     groups=groups)
    return ct.transpose(result, (1, 0) + spatial)


def windows_vjp(b):
    x = b["_x"]
    count = len(b["_k"])
    return ct.overlap_add(b["_dy"], x.shape[x.ndim - count:], strides=b["_s"], dilation=b["_d"])


def overlap_add_vjp(b):
    x = b["_x"]
    count = len(b["_n"])
    return ct.windows(b["_dy"], x.shape[x.ndim - count:], strides=b["_s"], dilation=b["_d"])


def pad_vjp(b):
    return ct.pad(b["_dy"], tuple((-low, -high) for low, high in b["_w"]))
