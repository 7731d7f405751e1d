"""Quantization (``quantize``, ``dequantize``, ``fake_quantize``) and the ops it is built from (``rint``,
``stop_gradient``), on the CPU: against NumPy's formulas on random tensors, rounding ties, clamping,
per-channel axes and zero points; the straight-through gradient; compiled against the reference; errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cortado as ct

RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


@st.composite
def quantization_cases(draw):
    """``(x, scale, zero point, dtype, axis)``: float32 values, half of them exact ties of ``x / scale``, scales
    and zero points per tensor or per index of an axis."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=5))
    dtype = draw(st.sampled_from(sorted(RANGES)))
    low, high = RANGES[dtype]
    axis = draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    count = () if axis is None else (shape[axis],)
    scale = draw(hnp.arrays(np.float32, count, elements=st.sampled_from([0.5, 0.25, 0.1, 1.0, 3.0, 0.0078125])))
    zero_point = draw(hnp.arrays(np.int32, count, elements=st.integers(low, high)))
    halves = draw(hnp.arrays(np.int32, shape, elements=st.integers(-600, 600)))
    noise = draw(hnp.arrays(np.float32, shape, elements=st.floats(-300, 300, width=32)))
    exact = draw(hnp.arrays(np.bool_, shape))
    lead = np.reshape(scale, count + (1,) * (len(shape) - (axis % len(shape)) - 1)) if axis is not None else scale
    x = np.where(exact, (halves * np.float32(0.5)) * lead, noise).astype(np.float32)
    return x, scale, zero_point, dtype, axis


def _along(values, x, axis):
    return values if axis is None else np.reshape(values, values.shape + (1,) * (x.ndim - axis % x.ndim - 1))


def numpy_quantize(x, scale, zero_point, dtype, axis):
    low, high = RANGES[dtype]
    levels = np.rint(x.astype(np.float32) * (np.float32(1) / _along(scale, x, axis).astype(np.float32)))  # as torch
    return np.clip(levels + _along(zero_point, x, axis).astype(np.float32), low, high).astype(dtype)


def numpy_dequantize(q, scale, zero_point, axis):
    return (q.astype(np.float32) - _along(zero_point, q, axis).astype(np.float32)) * _along(scale, q, axis).astype(np.float32)


@settings(max_examples=150, deadline=None)
@given(quantization_cases())
def test_quantize_and_dequantize_follow_the_formula(case):
    x, scale, zero_point, dtype, axis = case
    xv = ct.var("x", x.shape)
    q = ct.quantize(xv, scale, zero_point, dtype=dtype, axis=axis)
    expected = numpy_quantize(x, scale, zero_point, dtype, axis)
    found = ct.evaluate(q, {"x": x})
    assert found.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(found, expected)
    qv = ct.var("q", x.shape, dtype)
    back = ct.evaluate(ct.dequantize(qv, scale, zero_point, axis=axis), {"q": expected})
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, numpy_dequantize(expected, scale, zero_point, axis))


@settings(max_examples=100, deadline=None)
@given(quantization_cases())
def test_fake_quantize_is_quantize_then_dequantize_with_a_straight_through_gradient(case):
    x, scale, zero_point, dtype, axis = case
    xv = ct.var("x", x.shape)
    fake = ct.fake_quantize(xv, scale, zero_point, dtype=dtype, axis=axis)
    weights = np.arange(x.size, dtype=np.float32).reshape(x.shape) - x.size / 2
    (gradient,) = ct.grad(ct.sum(fake * weights), [xv])
    value, found = ct.evaluate([fake, gradient], {"x": x})
    expected = numpy_dequantize(numpy_quantize(x, scale, zero_point, dtype, axis), scale, zero_point, axis)
    np.testing.assert_array_equal(value, expected)
    low, high = RANGES[dtype]
    levels = np.rint(x * (np.float32(1) / _along(scale, x, axis))) + _along(zero_point, x, axis)
    inside = (levels >= low) & (levels <= high)
    np.testing.assert_array_equal(found, np.where(inside, weights, 0))


@settings(max_examples=60, deadline=None)
@given(quantization_cases())
def test_a_compiled_quantization_program_matches_the_reference(case):
    x, scale, zero_point, dtype, axis = case
    xv = ct.var("x", x.shape)
    q = ct.quantize(xv, scale, zero_point, dtype=dtype, axis=axis)
    fake = ct.fake_quantize(xv, scale, zero_point, dtype=dtype, axis=axis)
    outputs = [q, ct.dequantize(q, scale, zero_point, axis=axis), fake] + ct.grad(ct.sum(fake * fake), [xv])
    program = ct.compile(outputs, inputs=[xv])
    for ours, theirs in zip(program(x=x), ct.evaluate(outputs, {"x": x})):
        np.testing.assert_array_equal(ours, theirs)


def test_rint_takes_ties_to_even_and_has_no_derivative():
    x = ct.var("x", (8,))
    values = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -3.7], np.float32)
    np.testing.assert_array_equal(ct.evaluate(ct.rint(x), {"x": values}), np.rint(values))
    (gradient,) = ct.grad(ct.sum(ct.rint(x) * x), [x])
    np.testing.assert_array_equal(ct.evaluate(gradient, {"x": values}), np.rint(values))


def test_stop_gradient_is_the_identity_whose_derivative_is_zero():
    x = ct.var("x", (3,))
    y = ct.stop_gradient(x) * x
    (gradient,) = ct.grad(ct.sum(y), [x])
    values = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(ct.evaluate(gradient, {"x": values}), values)  # d/dx of c * x, c = x held
    program = ct.compile([y], inputs=[x])
    assert "stop_gradient" not in program.explain().split("kernels")[1]  # a program computes x itself
    np.testing.assert_array_equal(program(x=values)[0], values * values)


def test_a_fake_quantized_float16_tensor_stays_float16_and_its_second_derivative_is_zero():
    x = ct.var("x", (4,), "float16")
    fake = ct.fake_quantize(x, 0.125)
    assert fake.dtype == np.float16
    (first,) = ct.grad(ct.sum(fake * fake), [x])
    (second,) = ct.grad(ct.sum(first), [x])
    values = np.array([0.3, -1.0, 40.0, 0.0625], np.float16)
    expected = np.float16(np.clip(np.rint(values.astype(np.float32) / 0.125), -128, 127) * 0.125)
    found_fake, found_second = ct.evaluate([fake, second], {"x": values})
    np.testing.assert_array_equal(found_fake, expected)
    # d/dx of 2 * fake * dfake/dx is 2 * dfake/dx ** 2: 1 inside the range (40 / 0.125 = 320 lies outside)
    np.testing.assert_array_equal(found_second, np.array([2, 2, 0, 2], np.float16))


@pytest.mark.parametrize("build, error, message", [
    (lambda x: ct.quantize(x, 0.5, dtype="int16"), ct.DTypeError, "quantizes to int8 or uint8, not int16"),
    (lambda x: ct.quantize(ct.cast(x, "int32"), 0.5), ct.DTypeError, "quantizes a floating tensor, not int32"),
    (lambda x: ct.quantize(x, 0.0), ct.ShapeError, "scales must be positive and finite"),
    (lambda x: ct.quantize(x, 1e-46), ct.ShapeError, "scales must be positive and finite"),  # 0 in float32
    (lambda x: ct.quantize(x, [0.5, 0.5]), ct.ShapeError, "scale must be one value, not shape"),
    (lambda x: ct.quantize(x, [0.5] * 4, axis=1), ct.ShapeError, "one value per index of axis 1 \\(3\\)"),
    (lambda x: ct.quantize(x, 0.5, axis=2), ct.ShapeError, "axis 2 is out of range"),
    (lambda x: ct.quantize(x, 0.5, 200), ct.ShapeError, "zero points must be integers within \\[-128, 127\\]"),
    (lambda x: ct.fake_quantize(x, 0.5, 0.5, dtype="uint8"), ct.ShapeError, "integers within \\[0, 255\\]"),
    (lambda x: ct.dequantize(x, 0.5), ct.DTypeError, "takes integers"),
])
def test_bad_quantization_parameters_are_refused_naming_them(build, error, message):
    with pytest.raises(error, match=message):
        build(ct.var("x", (2, 3)))


def test_scales_and_zero_points_may_be_terms():
    x, scale, zero_point = ct.var("x", (2, 3)), ct.var("s", (3,)), ct.var("z", (3,), "int32")
    q = ct.quantize(x, scale, zero_point, axis=-1)
    values = {"x": np.array([[0.3, -0.7, 9.0], [1.1, 0.0, -9.0]], np.float32),
              "s": np.array([0.1, 0.2, 0.05], np.float32), "z": np.array([1, -3, 0], np.int32)}
    expected = numpy_quantize(values["x"], values["s"], values["z"], "int8", 1)
    np.testing.assert_array_equal(ct.evaluate(q, values), expected)


def test_quantize_multiplies_by_the_float32_reciprocal_of_the_scale_as_pytorch_does():
    x = ct.var("x", (1,))
    found = ct.evaluate(ct.quantize(x, 0.1), {"x": np.array([5.95], np.float32)})
    assert found[0] == 60  # x / 0.1 rounds to 59.0 in float32; x * float32(1 / 0.1) to 60.0, as torch's kernels



# -- what the GPU runs, checked on the CPU -----------------------------------------------------


def _gpu_source(term, *inputs):
    from cortado.backends.cupy.codegen import Operand, contiguous_strides
    from cortado.backends.cupy.sources import kernel_source
    from cortado.exprgraph.ops import parameter
    from cortado.rules.api import simplify, subs

    operands = [Operand(v.shape, v.dtype, contiguous_strides(v.shape)) for v in inputs]
    body = subs(simplify(term), {v: parameter(i, v) for i, v in enumerate(inputs)})
    return kernel_source((body,), operands).text


@pytest.mark.parametrize("dtype", sorted(RANGES))
def test_the_gpu_rounds_and_clamps_a_quantized_value_in_one_saturating_conversion(dtype):
    """``cast(clip(rint(v)))`` into the dtype's whole range is ``cvt.rni.sat``, ``cast(clip(v))`` ``cvt.rzi.sat``
    (levels with a zero point added are integers already), both sending NaN to 0 as the clamp and cast did; a clamp
    into a narrower range keeps its own code."""
    x = ct.var("x", (64,))
    ctype = {"int8": "signed char", "uint8": "unsigned char"}[dtype]
    assert f"ct_saturated<{ctype}, true>(" in _gpu_source(ct.quantize(x, 0.5, 0, dtype=dtype), x)
    assert f"ct_saturated<{ctype}, false>(" in _gpu_source(ct.quantize(x, 0.5, 3, dtype=dtype), x)  # an integer
    low, high = RANGES[dtype]
    narrower = ct.cast(ct.minimum(ct.maximum(ct.rint(x), low + 1), high), dtype)
    assert "ct_saturated<" not in _kernel_body(_gpu_source(narrower, x))


def _kernel_body(text):
    return text[text.index('extern "C"'):]
