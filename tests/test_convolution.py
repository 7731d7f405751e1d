"""Convolution, pooling and the window ops on the CPU: against loop-by-loop oracles and PyTorch's
definitions, compiled against the reference, adjoint pairs, gradients of first and second order,
errors and narrow and integer dtypes."""

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy_oracle import _conv as oracle_conv
from numpy_oracle import _overlap_add as oracle_overlap_add
from numpy_oracle import _pad as oracle_pad
from numpy_oracle import _windows as oracle_windows

import cortado as ct
from cortado.exprgraph.dtypes import BFLOAT16, finfo
from cortado.gradcheck import check_grads

TOLERANCE = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12)}
FLOATS = st.sampled_from(["float32", "float64"])


@dataclass(frozen=True)
class Geometry:
    """One convolution's operand shapes and ``ct.conv`` keywords."""

    x_shape: tuple
    w_shape: tuple
    strides: tuple
    padding: tuple
    lhs_dilation: tuple
    rhs_dilation: tuple
    groups: int

    @property
    def options(self):
        return dict(strides=self.strides, padding=self.padding, lhs_dilation=self.lhs_dilation,
                    rhs_dilation=self.rhs_dilation, groups=self.groups)

    def oracle(self, x, w):
        return oracle_conv(x, w, self.strides, self.padding, self.lhs_dilation, self.rhs_dilation, self.groups)


@st.composite
def geometries(draw, spatial=(1, 2), max_side=5):
    """A convolution whose kernel fits its padded, dilated input at least once; low padding from -2
    (cropping) to 2 and high padding from the least that fits to two more, negative included."""
    count = draw(st.sampled_from(spatial))
    groups = draw(st.integers(1, 3))
    per_group, outputs = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sizes, kernel, strides, padding, lhs, rhs = [], [], [], [], [], []
    for _ in range(count):
        sizes.append(draw(st.integers(1, max_side)))
        kernel.append(draw(st.integers(1, 3)))
        strides.append(draw(st.integers(1, 3)))
        lhs.append(draw(st.integers(1, 3)))
        rhs.append(draw(st.integers(1, 2)))
        low = draw(st.integers(-2, 2))
        least = (kernel[-1] - 1) * rhs[-1] + 1 - ((sizes[-1] - 1) * lhs[-1] + 1) - low
        high = draw(st.integers(max(least, -2), max(least, -2) + 2))
        padding.append((low, high))
    return Geometry((draw(st.integers(1, 2)), groups * per_group, *sizes), (groups * outputs, per_group, *kernel),
                    tuple(strides), tuple(padding), tuple(lhs), tuple(rhs), groups)


def normal(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def conv_operands(geometry, dtype):
    return ct.var("x", geometry.x_shape, dtype), ct.var("w", geometry.w_shape, dtype)


def assert_close(ours, expected, dtype):
    assert ours.shape == expected.shape and ours.dtype == expected.dtype
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(ours, expected, rtol=rtol, atol=atol)


# -- ct.conv against the loop-by-loop oracle, and compiled against the reference ----------------


@settings(max_examples=60)
@given(geometries(), FLOATS, st.integers(0, 2**32 - 1))
def test_conv_evaluates_as_the_loop_oracle(geometry, dtype, seed):
    x, w = conv_operands(geometry, dtype)
    y = ct.conv(x, w, **geometry.options)
    xv, wv = normal(x.shape, dtype, seed), normal(w.shape, dtype, seed + 1)
    expected = geometry.oracle(xv, wv)
    assert y.shape == expected.shape
    (ours,) = ct.evaluate([y], {"x": xv, "w": wv})
    assert_close(ours, expected, dtype)


@settings(max_examples=40)
@given(geometries(), FLOATS, st.integers(0, 2**32 - 1))
def test_compiled_conv_and_its_gradients_match_the_reference(geometry, dtype, seed):
    x, w = conv_operands(geometry, dtype)
    y = ct.conv(x, w, **geometry.options)
    outputs = [y] + ct.grad(ct.sum(y * y), [x, w])
    feeds = {"x": normal(x.shape, dtype, seed), "w": normal(w.shape, dtype, seed + 1)}
    program = ct.compile(outputs, inputs=[x, w], debug=True)
    assert "conv" in {k.term.op.name for k in program.kernels}
    for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        assert_close(ours, expected, dtype)


@st.composite
def pooled_chains(draw):
    """``pool(relu(conv2d(x, w) + b))`` for ``max_pool2d`` or ``avg_pool2d``, PyTorch's arguments drawn."""
    dtype = draw(FLOATS)
    groups = draw(st.integers(1, 2))
    channels, outputs = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    x = ct.var("x", (draw(st.integers(1, 2)), channels, draw(st.integers(3, 7)), draw(st.integers(3, 7))), dtype)
    w = ct.var("w", (outputs, channels // groups) + kernel, dtype)
    b = ct.var("b", (outputs,), dtype)
    stride = draw(st.sampled_from([1, 2, (1, 2)]))
    dilation = draw(st.sampled_from([(1, 1), (1, 2)]))
    padding = draw(st.sampled_from([0, 1, (1, 0), "valid"] + (["same"] if stride == 1 else [])))
    pads = (0, 0) if padding == "valid" else (padding, padding) if isinstance(padding, int) else padding
    if padding != "same":
        assume(all(n + 2 * p >= (k - 1) * d + 1 for n, p, k, d in zip(x.shape[2:], pads, kernel, dilation)))
    y = ct.relu(ct.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
                + ct.reshape(b, (-1, 1, 1)))
    pool_kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pool_padding = tuple(draw(st.integers(0, k // 2)) for k in pool_kernel)
    assume(all(n + 2 * p >= k for n, p, k in zip(y.shape[2:], pool_padding, pool_kernel)))
    pool = draw(st.sampled_from([ct.max_pool2d, ct.avg_pool2d]))
    return pool(y, pool_kernel, draw(st.sampled_from([None, 1, (2, 1)])), pool_padding), [x, w, b]


@settings(max_examples=40)
@given(pooled_chains(), st.integers(0, 2**32 - 1))
def test_compiled_conv_relu_pool_chains_and_their_gradients_match_the_reference(chain, seed):
    out, variables = chain
    dtype = out.dtype.name
    outputs = [out] + ct.grad(ct.sum(out * out), variables)
    feeds = {v.name: normal(v.shape, dtype, seed + i) for i, v in enumerate(variables)}
    program = ct.compile(outputs, inputs=variables, debug=True)
    for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        assert_close(ours, expected, dtype)


# -- PyTorch's fronts against PyTorch's definitions -------------------------------------------

CONV2D = [  # x shape, w shape, conv2d keywords, the (low, high) padding PyTorch applies per axis
    ((2, 3, 7, 6), (4, 3, 3, 3), {}, ((0, 0), (0, 0))),
    ((2, 3, 7, 6), (4, 3, 3, 3), dict(padding=1), ((1, 1), (1, 1))),
    ((1, 2, 8, 9), (3, 2, 3, 2), dict(stride=(2, 3), padding=(2, 1)), ((2, 2), (1, 1))),
    ((1, 4, 9, 8), (6, 2, 3, 3), dict(padding=2, dilation=2, groups=2), ((2, 2), (2, 2))),
    ((1, 4, 6, 6), (4, 1, 3, 3), dict(groups=4, padding="same"), ((1, 1), (1, 1))),
    ((2, 2, 6, 7), (3, 2, 2, 4), dict(padding="same"), ((0, 1), (1, 2))),  # even kernels: the extra after
    ((1, 2, 9, 8), (2, 2, 2, 3), dict(padding="same", dilation=(3, 2)), ((1, 2), (2, 2))),
    ((1, 3, 7, 7), (2, 3, 4, 2), dict(padding="same", dilation=(1, 3)), ((1, 2), (1, 2))),
    ((1, 3, 5, 6), (2, 3, 3, 4), dict(padding="valid", stride=2), ((0, 0), (0, 0))),
    ((2, 2, 5, 5), (2, 2, 1, 1), dict(stride=2, dilation=3), ((0, 0), (0, 0))),
]


def torch_conv2d_size(n, k, stride, low, high, dilation):
    """PyTorch's output size: floor((n + padding - dilation (k - 1) - 1) / stride + 1)."""
    return (n + low + high - dilation * (k - 1) - 1) // stride + 1


@pytest.mark.parametrize("x_shape, w_shape, options, padding", CONV2D)
def test_conv2d_follows_pytorch(x_shape, w_shape, options, padding):
    x, w = ct.var("x", x_shape, "float64"), ct.var("w", w_shape, "float64")
    y = ct.conv2d(x, w, **options)
    stride = options.get("stride", 1)
    stride = stride if isinstance(stride, tuple) else (stride, stride)
    dilation = options.get("dilation", 1)
    dilation = dilation if isinstance(dilation, tuple) else (dilation, dilation)
    sizes = tuple(torch_conv2d_size(n, k, s, low, high, d)
                  for n, k, s, (low, high), d in zip(x_shape[2:], w_shape[2:], stride, padding, dilation))
    assert y.shape == x_shape[:1] + w_shape[:1] + sizes
    if options.get("padding") == "same":
        assert sizes == x_shape[2:]
    xv, wv = normal(x_shape, "float64", 0), normal(w_shape, "float64", 1)
    expected = oracle_conv(xv, wv, stride, padding, (1, 1), dilation, options.get("groups", 1))
    np.testing.assert_allclose(ct.evaluate([y], {"x": xv, "w": wv})[0], expected, rtol=1e-12, atol=1e-12)


def torch_pool2d(x, kernel, stride, padding, reduce):
    """PyTorch's pooling, window by window: ``reduce`` of the window's elements inside the input
    (padding is -inf for max, so left out; avg divides by the whole window, padding counted as zeros)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x.shape
    out = np.empty((n, c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1))
    for i, j in np.ndindex(*out.shape[2:]):
        rows = [r for r in range(i * sh - ph, i * sh - ph + kh) if 0 <= r < h]
        cols = [q for q in range(j * sw - pw, j * sw - pw + kw) if 0 <= q < w]
        window = x[:, :, rows][:, :, :, cols]
        out[:, :, i, j] = window.max(axis=(2, 3)) if reduce == "max" else window.sum(axis=(2, 3)) / (kh * kw)
    return out


POOLS = [  # kernel_size, stride, padding, PyTorch's (kernel, stride, padding) pairs
    (2, None, 0, ((2, 2), (2, 2), (0, 0))),
    (3, None, 1, ((3, 3), (3, 3), (1, 1))),
    (3, 1, 1, ((3, 3), (1, 1), (1, 1))),
    (3, 2, 1, ((3, 3), (2, 2), (1, 1))),
    ((2, 3), (1, 2), (1, 0), ((2, 3), (1, 2), (1, 0))),
    ((3, 1), None, (1, 0), ((3, 1), (3, 1), (1, 0))),
    (2, 1, 1, ((2, 2), (1, 1), (1, 1))),
    ((4, 2), 3, (2, 1), ((4, 2), (3, 3), (2, 1))),
]


@pytest.mark.parametrize("pool, reduce", [(ct.max_pool2d, "max"), (ct.avg_pool2d, "avg")])
@pytest.mark.parametrize("kernel_size, stride, padding, torch_args", POOLS)
def test_pools_follow_pytorch(pool, reduce, kernel_size, stride, padding, torch_args):
    x = ct.var("x", (2, 3, 7, 8), "float64")
    xv = normal(x.shape, "float64", 0) - 3  # all negative: padding taken for zeros would win a max
    expected = torch_pool2d(xv, *torch_args, reduce)
    y = pool(x, kernel_size, stride, padding)
    assert y.shape == expected.shape
    np.testing.assert_allclose(ct.evaluate([y], {"x": xv})[0], expected, rtol=1e-12, atol=1e-12)
    (compiled,) = ct.compile([y], inputs=[x])(x=xv)
    np.testing.assert_allclose(compiled, expected, rtol=1e-12, atol=1e-12)


def test_pool_stride_defaults_to_the_kernel_and_ceil_mode_is_not_offered():
    x = ct.var("x", (1, 1, 7, 7))
    assert ct.max_pool2d(x, 3) is ct.max_pool2d(x, 3, stride=3)
    assert ct.avg_pool2d(x, (2, 3)).shape == (1, 1, 3, 2)
    for pool in (ct.max_pool2d, ct.avg_pool2d):
        with pytest.raises(TypeError, match="ceil_mode"):
            pool(x, 2, ceil_mode=True)


# -- the window ops against their oracles and as adjoint pairs --------------------------------


@st.composite
def window_cases(draw):
    """An input shape, a window over its last one or two axes, strides and dilation that fit."""
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    count = draw(st.integers(1, 2))
    window = tuple(draw(st.integers(1, 3)) for _ in range(count))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(count))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(count))
    spatial = tuple((k - 1) * d + 1 + draw(st.integers(0, 4)) for k, d in zip(window, dilation))
    return lead + spatial, window, strides, dilation


@given(window_cases(), st.integers(0, 2**32 - 1))
def test_windows_and_overlap_add_are_the_oracles_and_each_others_adjoints(case, seed):
    shape, window, strides, dilation = case
    x = ct.var("x", shape, "float64")
    views = ct.windows(x, window, strides=strides, dilation=dilation)
    y = ct.var("y", views.shape, "float64")
    added = ct.overlap_add(y, shape[len(shape) - len(window):], strides=strides, dilation=dilation)
    assert added.shape == shape
    xv, yv = normal(shape, "float64", seed), normal(views.shape, "float64", seed + 1)
    windowed, summed = ct.evaluate([views, added], {"x": xv, "y": yv})
    np.testing.assert_array_equal(windowed, oracle_windows(xv, window, strides, dilation))
    np.testing.assert_allclose(summed, oracle_overlap_add(yv, shape[len(shape) - len(window):], strides, dilation),
                               rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(np.sum(windowed * yv), np.sum(xv * summed), rtol=1e-12, atol=1e-12)
    compiled = ct.compile([views * 1.0, added], inputs=[x, y])(x=xv, y=yv)
    np.testing.assert_array_equal(compiled[0], windowed)
    np.testing.assert_allclose(compiled[1], summed, rtol=1e-14, atol=1e-14)


@st.composite
def pad_cases(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    widths = []
    for n in shape:
        low = draw(st.integers(-n, 3))
        widths.append((low, draw(st.integers(-(n + low) if n + low > 0 else 0, 3))))
    return shape, tuple(widths)


@given(pad_cases(), st.sampled_from([0, -1.5, 2]), st.integers(0, 2**32 - 1))
def test_pad_is_the_oracle_and_opposite_widths_are_its_adjoint(case, fill, seed):
    shape, widths = case
    x = ct.var("x", shape, "float64")
    padded = ct.pad(x, widths, constant_values=fill)
    xv = normal(shape, "float64", seed)
    expected = oracle_pad(xv, widths, constant_values=fill)
    assert padded.shape == expected.shape
    np.testing.assert_array_equal(ct.evaluate([padded], {"x": xv})[0], expected)
    np.testing.assert_array_equal(ct.compile([padded], inputs=[x])(x=xv)[0], expected)
    y = ct.var("y", padded.shape, "float64")
    linear, back = ct.pad(x, widths), ct.pad(y, tuple((-low, -high) for low, high in widths))
    assert back.shape == shape
    yv = normal(y.shape, "float64", seed + 1)
    forward, backward = ct.evaluate([linear, back], {"x": xv, "y": yv})
    np.testing.assert_allclose(np.sum(forward * yv), np.sum(xv * backward), rtol=1e-12, atol=1e-12)


def test_flip_is_numpys():
    x = ct.var("x", (2, 3, 4), "int32")
    xv = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    for axis in (None, 0, (1, 2), -1):
        np.testing.assert_array_equal(ct.evaluate([ct.flip(x, axis)], {"x": xv})[0], np.flip(xv, axis))


# -- gradients --------------------------------------------------------------------------------


@settings(max_examples=25)
@given(geometries(max_side=4), st.sampled_from([1, 2]), st.integers(0, 2**32 - 1))
def test_conv_gradients_agree_with_finite_differences(geometry, order, seed):
    x, w = conv_operands(geometry, "float64")
    y = ct.tanh(ct.conv(x, w, **geometry.options))
    feeds = {"x": normal(x.shape, "float64", seed) * 0.5, "w": normal(w.shape, "float64", seed + 1) * 0.5}
    check_grads(y, [x, w], feeds, order=order, rtol=1e-6, seed=seed)


def distinct(shape, seed):
    """Values at least 4 / size apart, shuffled: no two elements tie within a finite difference's step."""
    size = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(size) * (4 / size) - 2).reshape(shape)


POOLED = [(2, None, 0), (3, 1, 1), ((2, 3), (1, 2), (1, 1)), (3, 2, 1)]


@pytest.mark.parametrize("kernel_size, stride, padding", POOLED)
@pytest.mark.parametrize("pool", [ct.max_pool2d, ct.avg_pool2d])
@pytest.mark.parametrize("order", [1, 2])
def test_pool_gradients_agree_with_finite_differences(pool, kernel_size, stride, padding, order):
    x = ct.var("x", (2, 2, 5, 6), "float64")
    check_grads(ct.tanh(pool(x, kernel_size, stride, padding)), x, {"x": distinct(x.shape, 0)}, order=order,
                rtol=1e-6)


WINDOW_OPS = {
    "windows": lambda x: ct.windows(x, (2, 3), strides=(2, 1), dilation=(1, 2)),
    "overlap_add": lambda x: ct.overlap_add(ct.reshape(x, (2, 3, 2, 2)), (5, 4), strides=(2, 1)),
    "pad": lambda x: ct.pad(x, ((1, -1), (-2, 3)), constant_values=0.5),
    "flip": lambda x: ct.flip(x, 1),
}


@pytest.mark.parametrize("op", WINDOW_OPS.values(), ids=WINDOW_OPS.keys())
@pytest.mark.parametrize("order", [1, 2])
def test_window_op_gradients_agree_with_finite_differences(op, order):
    x = ct.var("x", (4, 6), "float64")
    check_grads(ct.tanh(op(x)), x, {"x": normal(x.shape, "float64", 0)}, order=order, rtol=1e-6)


def ops_of(terms):
    return {t.op.name for t in ct.schedule(terms)}


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_gradients_are_convolutions(groups):
    x, w = ct.var("x", (2, 4, 9, 8), "float64"), ct.var("w", (6, 4 // groups, 3, 2), "float64")
    y = ct.conv(x, w, strides=(2, 3), padding=((1, -1), (2, 0)), rhs_dilation=(2, 1), groups=groups)
    dx, dw = ct.vjp(y, [x, w], ct.var("dy", y.shape, "float64"))
    assert dx.op.name == "conv", dx  # the input's VJP is itself a convolution, of the output's adjoint
    assert dx.attr("lhs_dilation") == (2, 3)  # dilated by the forward strides: no transposed convolution
    assert "conv" in ops_of([dw])
    assert ops_of([dx, dw]) <= {"var", "conv", "flip", "transpose", "reshape"}, ops_of([dx, dw])


# -- errors -----------------------------------------------------------------------------------

x4 = ct.var("x", (2, 4, 5, 5))
w4 = ct.var("w", (6, 4, 3, 3))

ERRORS = {
    "conv rank": (lambda: ct.conv(ct.var("a", (4, 5)), ct.var("b", (6, 4))), "(N, C, *spatial)", "(4, 5) and (6, 4)"),
    "conv ranks differ": (lambda: ct.conv(x4, ct.var("b", (6, 4, 3))), "(2, 4, 5, 5) and (6, 4, 3)"),
    "conv2d input rank": (lambda: ct.conv2d(ct.var("a", (4, 5, 5)), w4), "conv2d needs a 4-d input", "(4, 5, 5)"),
    "conv2d weight rank": (lambda: ct.conv2d(x4, ct.var("b", (6, 4, 3))), "conv2d needs a 4-d weight",
                           "(O, C/groups, kH, kW)", "(6, 4, 3)"),
    "channels": (lambda: ct.conv2d(x4, ct.var("b", (6, 3, 3, 3))), "input (2, 4, 5, 5) and weights (6, 3, 3, 3)",
                 "groups=1", "4 channels"),
    "groups": (lambda: ct.conv2d(x4, ct.var("b", (6, 2, 3, 3)), groups=3), "(6, 2, 3, 3) with groups=3"),
    "output groups": (lambda: ct.conv2d(x4, ct.var("b", (5, 2, 3, 3)), groups=2), "the 5 output channels",
                      "groups=2"),
    "groups zero": (lambda: ct.conv(x4, w4, groups=0), "groups must be a positive int, not 0"),
    "kernel too large": (lambda: ct.conv2d(x4, ct.var("b", (6, 4, 7, 3))), "(2, 4, 5, 5) and weights (6, 4, 7, 3)",
                         "spatial shape (-1, 3)", "kernel is larger than the padded input"),
    "dilated kernel too large": (lambda: ct.conv2d(x4, w4, dilation=3), "(3, 3) (weights)", "larger than"),
    "cropped too far": (lambda: ct.conv(x4, w4, padding=((-3, 0), (0, 0))), "padding ((-3, 0), (0, 0))",
                        "spatial shape (0, 3)"),
    "same with stride": (lambda: ct.conv2d(x4, w4, padding="same", stride=2), "padding='same' needs stride 1",
                         "(2, 2)"),
    "conv2d negative padding": (lambda: ct.conv2d(x4, w4, padding=(1, -1)), "padding must not be negative",
                                "(1, -1)"),
    "conv2d padding word": (lambda: ct.conv2d(x4, w4, padding="full"), "'same' or 'valid'", "'full'"),
    "zero stride": (lambda: ct.conv2d(x4, w4, stride=(1, 0)), "strides must be at least 1", "(1, 0)"),
    "strides per axis": (lambda: ct.conv(x4, w4, strides=(1, 2, 3)), "1 or 2 values", "(1, 2, 3)"),
    "padding pairs": (lambda: ct.conv(x4, w4, padding=((1, 1),)), "2 (low, high) pairs", "((1, 1),)"),
    "kernel_size triple": (lambda: ct.max_pool2d(x4, (2, 2, 2)), "max_pool2d's kernel_size", "(2, 2, 2)"),
    "kernel_size zero": (lambda: ct.max_pool2d(x4, 0), "max_pool2d's kernel_size", "positive", "(0, 0)"),
    "kernel_size float": (lambda: ct.avg_pool2d(x4, 2.5), "avg_pool2d's kernel_size", "2.5"),
    "pool stride zero": (lambda: ct.avg_pool2d(x4, 2, stride=0), "avg_pool2d's stride", "positive", "(0, 0)"),
    "pool kernel too large": (lambda: ct.max_pool2d(x4, (6, 2)), "max_pool2d(float32[2,4,5,5], kernel_size=(6, 2))",
                              "the 6x2 window is larger than the input's 5x5"),
    "pool padding over half": (lambda: ct.max_pool2d(x4, 3, padding=2), "padding (2, 2)", "half the kernel (3, 3)"),
    "pool padding negative": (lambda: ct.avg_pool2d(x4, 3, padding=(0, -1)), "padding (0, -1)",
                              "between 0 and half"),
    "pool rank": (lambda: ct.max_pool2d(ct.var("a", (5, 5)), 2), "max_pool2d needs a 4-d input", "(5, 5)"),
    "windows too large": (lambda: ct.windows(x4, (2, 6)), "windows of (2, 6)", "(5, 5)"),
    "windows none": (lambda: ct.windows(x4, ()), "window_shape ()", "(2, 4, 5, 5)"),
    "overlap_add counts": (lambda: ct.overlap_add(ct.var("a", (3, 3, 2, 2)), (5, 5)), "fit (4, 4) times into (5, 5)",
                           "(3, 3, 2, 2) has (3, 3)"),
    "pad crops too much": (lambda: ct.pad(x4, ((0, 0), (0, 0), (-3, -3), (0, 0))), "crops more than (2, 4, 5, 5)"),
    "pad integers with a fraction": (lambda: ct.pad(ct.var("i", (3,), "int32"), 1, constant_values=0.5),
                                     "int32[3]", "cannot be padded with 0.5"),
}


@pytest.mark.parametrize("build, fragments", [(v[0], v[1:]) for v in ERRORS.values()], ids=ERRORS.keys())
def test_bad_geometry_is_a_shape_error_naming_the_shapes(build, fragments):
    with pytest.raises(ct.ShapeError) as info:
        build()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in:\n{info.value}"


@pytest.mark.parametrize("dtype, value", [("uint8", -1), ("uint8", 300), ("int8", 128), ("bool", 2)])
def test_a_pad_value_its_tensors_dtype_cannot_hold_is_refused_when_built(dtype, value):
    """It was accepted, then failed when run (NumPy's pad wraps it: 300 pads a uint8 with 44)."""
    with pytest.raises(ct.DTypeError, match=f"{dtype}"):
        ct.pad(ct.var("u", (3,), dtype), 1, constant_values=value)
    assert ct.pad(ct.var("u", (3,), dtype), 1, constant_values=1).shape == (5,)


def test_operands_without_a_common_dtype_are_a_dtype_error():
    with pytest.raises(ct.DTypeError, match=r"conv\(bfloat16\[2,4,5,5\], float16\[6,4,3,3\]\).*no common dtype"):
        ct.conv(ct.var("a", (2, 4, 5, 5), "bfloat16"), ct.var("b", (6, 4, 3, 3), "float16"))


# -- dtypes -----------------------------------------------------------------------------------

NARROW = [("float16", np.float16), ("bfloat16", BFLOAT16)]


@pytest.mark.parametrize("name, narrow", NARROW)
@settings(max_examples=15)
@given(geometry=geometries(), seed=st.integers(0, 2**32 - 1))
def test_narrow_float_conv_is_float32_rounded_once(name, narrow, geometry, seed):
    """Narrow operands are accumulated in float32: the result is the float32 one rounded once."""
    x, w = conv_operands(geometry, name)
    y = ct.conv(x, w, **geometry.options)
    feeds = {"x": normal(x.shape, np.float32, seed).astype(narrow),
             "w": normal(w.shape, np.float32, seed + 1).astype(narrow)}
    wide = {k: v.astype(np.float32) for k, v in feeds.items()}
    (expected,) = ct.evaluate([ct.conv(*conv_operands(geometry, "float32"), **geometry.options)], wide)
    eps = float(finfo(np.dtype(narrow)).eps)
    tiny = 1e-5 * max(1.0, float(np.abs(expected).max()))  # float32's summation order, not the rounding
    for ours in (ct.evaluate([y], feeds)[0], ct.compile([y], inputs=[x, w])(**feeds)[0]):
        assert ours.dtype == np.dtype(narrow)
        np.testing.assert_allclose(ours.astype(np.float32), expected, rtol=eps / 2, atol=tiny)


@settings(max_examples=30)
@given(geometries(), st.integers(0, 2**32 - 1))
def test_integer_conv_is_exact(geometry, seed):
    x, w = conv_operands(geometry, "int32")
    y = ct.conv(x, w, **geometry.options)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.integers(-50, 50, x.shape, dtype=np.int32), "w": rng.integers(-50, 50, w.shape, dtype=np.int32)}
    expected = geometry.oracle(feeds["x"], feeds["w"])
    assert y.dtype == np.int32 and expected.dtype == np.int32
    np.testing.assert_array_equal(ct.evaluate([y], feeds)[0], expected)
    np.testing.assert_array_equal(ct.compile([y], inputs=[x, w])(**feeds)[0], expected)


# -- the GPU backend's layout choice (decided without a GPU) ----------------------------------


def test_nhwc_auto_stores_the_tensor_core_dtypes_channels_last():
    from cortado.backends.cupy.layout import channels_last_dtypes

    names = lambda options: {d.name for d in channels_last_dtypes(options)}  # noqa: E731
    assert names({"nhwc": "auto", "tf32": False}) == {"float16", "bfloat16"}
    assert names({"nhwc": "auto", "tf32": True}) == {"float16", "bfloat16", "float32"}
    assert names({"nhwc": False, "tf32": True}) == set()
    assert names({"nhwc": True, "tf32": False}) >= {"float16", "bfloat16", "float32", "float64"}
    with pytest.raises(ct.BackendError, match="nhwc option is True, False or 'auto', not 'yes'"):
        channels_last_dtypes({"nhwc": "yes", "tf32": False})


def test_explain_names_the_unfused_choice_when_every_fused_plan_disagreed():
    from cortado.backends.cupy.calls import cudnn_conv

    alone, runner = object.__new__(cudnn_conv.Conv), object.__new__(cudnn_conv.Conv)
    windows = type("Windows", (), {"describe": lambda self: "im2col"})()
    alone.__dict__.update(choice=cudnn_conv.WINDOWS, times=None, plans=[], others={cudnn_conv.WINDOWS: windows})
    runner.__dict__.update(choice=cudnn_conv.UNFUSED, unfused=alone, epilogue="bias_relu", plans=[3, 5], dropped={3, 5},
                           times=(None, {cudnn_conv.UNFUSED: 1e-2}))
    assert runner.describe() == ("im2col, then a generated kernel for its bias_relu (unfused 10.0 us, 2 fused plans "
                                 "dropped: they disagreed with it unfused)")


def test_a_remembered_convolution_still_lets_each_other_candidate_take_its_own_choice(monkeypatch, fresh_choices):
    """A convolution of shapes the process has tuned before takes the remembered choice without timing anything, and
    each other candidate tunes too, so a GEMM inside one takes the algorithm remembered for it (untuned, it stayed at
    the heuristic's first, and two builds of one program added their sums in different orders)."""
    from cortado.backends.cupy.calls import choices, cudnn_conv

    tuned = []

    class Candidate:
        def __init__(self, name):
            self.name = name

        def tune(self, pointers, stream):
            tuned.append((self.name, pointers, stream))

    conv = object.__new__(cudnn_conv.Conv)
    others = {cudnn_conv.WINDOWS: Candidate("windows"), cudnn_conv.SPLIT: Candidate("split")}
    conv.__dict__.update(tuned_key="shapes", others=others, plans=[0], choice=0, times=None)
    choices.remember("cudnn", "shapes", [cudnn_conv.WINDOWS, 1e-3, {}])
    monkeypatch.setattr(cudnn_conv.Conv, "_time", lambda *args: pytest.fail("a remembered convolution timed a call"))
    conv.tune((1, 2, 3, 4), "stream")
    assert conv.choice == cudnn_conv.WINDOWS and conv.times == (1e-3, {})
    assert sorted(tuned) == [("split", (1, 2, 3, 4), "stream"), ("windows", (1, 2, 3, 4), "stream")]


def test_an_untuned_convolution_runs_its_first_choice_whatever_the_process_remembers(monkeypatch, fresh_choices):
    """A convolution built where the process remembers a tuned choice for its shapes still runs cuDNN's first plan
    until it is tuned: a program compiled with ``autotune=False`` runs first choices at every level (it once took the
    remembered convolution with its inner GEMM at the heuristic's first algorithm, a mix no tuned program runs)."""
    from cortado.backends.cupy.calls import choices, cudnn_conv
    from cortado.backends.cupy.codegen import contiguous_strides
    from cortado.backends.cupy.lowering.conv import dnn_conv

    x, w = ct.var("x", (2, 4, 8, 8)), ct.var("w", (6, 4, 3, 3))
    term = dnn_conv(x, w, "fprop", (1, 1), ((1, 1), (1, 1)), (1, 1), 1, (2, 6, 8, 8))
    call = _call(term, {t: contiguous_strides(t.shape) for t in (x, w, term)})
    for builder in ("_as_gemm", "window_gemm", "split_wgrad", "nchw_call"):  # cuDNN's plans alone
        monkeypatch.setattr(cudnn_conv, builder, lambda call: None)
    monkeypatch.setattr(cudnn_conv, "_graphs", {call: (_NamedPlans(), (), None, [7, 9], 0)})
    choices.remember("cudnn", (call, False, None), ["plan 9", 1e-3, {}])
    conv = cudnn_conv.Conv(call)
    assert (conv.choice, conv.times) == (7, None)
    monkeypatch.setattr(cudnn_conv.Conv, "_time", lambda *args: pytest.fail("a remembered convolution timed a call"))
    conv.tune((1, 2, 3, 4), "stream")
    assert (conv.choice, conv.times) == (9, (1e-3, {}))


class _NamedPlans:
    """A cuDNN graph as far as choosing among its plans goes: plan ``i`` is named "plan i"."""

    def get_plan_name_at_index(self, index):
        return f"plan {index}"


def _call(term, strides):
    """The ``ConvCall`` the GPU's conv target makes of ``dnn_conv`` ``term`` stored at ``strides``."""
    from cortado.backends.cupy.targets.conv import conv_call

    return conv_call(term, strides, {"tf32": False, "deterministic": True})


@pytest.mark.parametrize("x_shape, dy_shape, w_shape, strides, groups", [
    ((128, 32, 32, 32), (128, 32, 32, 32), (32, 32, 3, 3), (1, 1), 1),
    ((128, 3, 32, 32), (128, 32, 32, 32), (32, 3, 3, 3), (1, 1), 1),
    ((128, 32, 32, 32), (128, 64, 16, 16), (64, 32, 3, 3), (2, 2), 1),
    ((8, 64, 224, 224), (8, 64, 224, 224), (64, 64, 3, 3), (1, 1), 1),
    ((2, 8, 10, 10), (2, 8, 10, 10), (8, 2, 3, 3), (1, 1), 4),
    ((4, 6, 300), (4, 5, 300), (5, 6, 7), (1,), 1),
    ((8, 64, 32, 32), (8, 64, 32, 32), (64, 64, 7, 7), (1, 1), 1),  # one output channel a thread: 49 sums
])
def test_our_weight_gradient_kernels_tiles_fit_its_block(x_shape, dy_shape, w_shape, strides, groups, monkeypatch):
    """The tiling ``split_wgrad`` chooses (no GPU needed to choose it): shared memory, threads and partial sums
    within its limits, every output channel and input channel of a group covered by whole blocks."""
    from cortado.backends.cupy.calls import conv_wgrad
    from cortado.backends.cupy.codegen import contiguous_strides
    from cortado.backends.cupy.lowering.conv import dnn_conv

    monkeypatch.setattr(conv_wgrad, "_multiprocessors", lambda: 132)
    x, dy = ct.var("x", x_shape), ct.var("dy", dy_shape)
    padding = tuple((k // 2, k // 2) for k in w_shape[2:])
    term = dnn_conv(x, dy, "wgrad", strides, padding, (1,) * len(strides), groups, w_shape)
    kernel = conv_wgrad.split_wgrad(_call(term, {t: contiguous_strides(t.shape) for t in (x, dy, term)}))
    g = kernel.geometry
    assert g._shared_bytes(*g.tile) <= conv_wgrad.SHARED_BYTES and kernel.block[0] <= conv_wgrad.THREADS
    assert g.og % g.ob == 0 and g.cg % g.cb == 0 and g.ob % g.opt == 0 and g.opt * g.taps <= 2 * conv_wgrad.ACCUMULATORS
    assert kernel.workspace_bytes <= conv_wgrad.PARTIAL_BYTES + conv_wgrad.ALIGNMENT
    assert math.prod(kernel.grid) >= 132 or kernel.splits == g.n * -(-g.p // g.tile[0]) * -(-g.q // g.tile[1])


def test_our_weight_gradient_kernel_leaves_what_it_does_not_take():
    from cortado.backends.cupy.codegen import contiguous_strides
    from cortado.backends.cupy.lowering.conv import dnn_conv
    from cortado.backends.cupy.calls.conv_wgrad import split_wgrad

    def kernel(x_shape, dy_shape, w_shape, dtype="float32", stride=1):
        x, dy = ct.var("x", x_shape, dtype), ct.var("dy", dy_shape, dtype)
        spatial = len(w_shape) - 2
        term = dnn_conv(x, dy, "wgrad", (stride,) * spatial, ((0, 0),) * spatial, (1,) * spatial, 1, w_shape)
        return split_wgrad(_call(term, {t: contiguous_strides(t.shape) for t in (x, dy, term)}))

    assert kernel((2, 4, 8, 8), (2, 6, 4, 4), (6, 4, 1, 1), stride=2) is None  # one tap, strided: no product per image
    assert kernel((2, 4, 8, 8), (2, 6, 6, 6), (6, 4, 3, 3), dtype="bfloat16") is None  # cuDNN's tensor cores
    assert kernel((2, 4, 6, 6, 6), (2, 6, 4, 4, 4), (6, 4, 3, 3, 3)) is None  # three spatial axes
    assert kernel((2, 4, 40, 40), (2, 6, 26, 26), (6, 4, 15, 15)) is None  # 225 taps: too many sums per thread


def test_a_1x1_weight_gradient_is_a_product_per_nchw_image_or_one_over_nhwc_pixels():
    from cortado.backends.cupy.codegen import channels_last_strides, contiguous_strides
    from cortado.backends.cupy.lowering.conv import dnn_conv
    from cortado.backends.cupy.calls.conv_wgrad import _Geometry

    x, dy = ct.var("x", (2, 4, 8, 8)), ct.var("dy", (2, 6, 8, 8))
    term = dnn_conv(x, dy, "wgrad", (1, 1), ((0, 0), (0, 0)), (1, 1), 1, (6, 4, 1, 1))
    packed = {t: contiguous_strides(t.shape) for t in (x, dy, term)}
    last = {**packed, x: channels_last_strides(x.shape), dy: channels_last_strides(dy.shape)}
    packed, last, mixed = (_Geometry(_call(term, strides)) for strides in (packed, last, {**packed, x: last[x]}))
    assert packed.products_per_image() and not packed.product_over_pixels()
    assert last.product_over_pixels() and not last.products_per_image()
    assert not mixed.product_over_pixels()  # dy NCHW: no rows of pixels


def test_channels_last_io_stores_feeds_and_results_of_four_or_more_axes_channels_last():
    from cortado.backends.cupy.layout import io_strides

    images, vector = ct.var("x", (2, 3, 4, 5)), ct.var("b", (3,))
    assert io_strides(images, {"channels_last_io": True}) == (60, 1, 15, 3)
    assert io_strides(images, {"channels_last_io": False}) == (60, 20, 5, 1)
    assert io_strides(vector, {"channels_last_io": True}) == (1,)
    with pytest.raises(ct.BackendError, match="channels_last_io option is True or False, not 'yes'"):
        io_strides(images, {"channels_last_io": "yes"})


def test_an_operand_read_twice_is_copied_to_nchw_for_each_read():
    from cortado.backends.cupy.codegen import channels_last_strides, contiguous_strides
    from cortado.backends.cupy.calls.conv_nchw import nchw_call
    from cortado.backends.cupy.lowering.conv import dnn_conv

    x = ct.var("x", (2, 4, 6, 6))
    term = dnn_conv(x, x, "wgrad", (1, 1), ((1, 1), (1, 1)), (1, 1), 1, (4, 4, 3, 3))  # sum(conv(x, w) * x)'s
    nchw, copied = nchw_call(_call(term, {x: channels_last_strides(x.shape), term: contiguous_strides(term.shape)}))
    assert copied == [0, 1] and nchw.first.strides == nchw.second.strides == contiguous_strides(x.shape)
    assert nchw_call(_call(term, {x: contiguous_strides(x.shape), term: contiguous_strides(term.shape)})) is None


def test_a_remembered_choice_the_call_could_not_have_made_is_not_taken(fresh_choices):
    """A file of the choices edited or damaged into another shape, or naming a candidate the call lacks: timed
    again, not taken."""
    from cortado.backends.cupy.calls import choices, cudnn_conv

    conv = object.__new__(cudnn_conv.Conv)
    conv.__dict__.update(tuned_key="shapes", others={cudnn_conv.WINDOWS: None}, plans=[], graph=None)
    for stored in (["windows", 1e-3], [cudnn_conv.SPLIT, 1e-3, {}], [cudnn_conv.WINDOWS, "fast", {}],
                   [cudnn_conv.WINDOWS, None, {"elsewhere": 1.0}], {"windows": 1}):
        choices.remember("cudnn", "shapes", stored)
        assert conv._remembered() is None, stored
    choices.remember("cudnn", "shapes", [cudnn_conv.WINDOWS, None, {cudnn_conv.WINDOWS: 2e-3}])
    assert conv._remembered() == (cudnn_conv.WINDOWS, (None, {cudnn_conv.WINDOWS: 2e-3}))
