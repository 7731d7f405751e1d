"""The GPU backend's views, checked on the CPU: a reshape is a view wherever NumPy's reshape needs no copy, with
strides that address the same elements, and a crop is a view of its operand at the offset of its first element."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends.cupy.codegen import contiguous_strides
from cortado.backends.cupy.layout import ALIGNMENT, crop_offset, reshaped_strides
from cortado.rules.fusion import fuse


@st.composite
def strided_values(draw):
    """A view of a C-ordered array: its axes permuted, then each stepped and cropped."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    base = np.arange(math.prod(shape)).reshape(shape)
    view = base.transpose(draw(st.permutations(range(len(shape)))))
    cuts = tuple(slice(draw(st.integers(0, n - 1)), None, draw(st.integers(1, 2))) for n in view.shape)
    return base, view[cuts]


@st.composite
def factorizations(draw, size):
    """A shape of ``size`` elements, with axes of 1 anywhere."""
    shape, left = [], size
    for _ in range(draw(st.integers(0, 4))):
        divisor = draw(st.sampled_from([d for d in range(1, left + 1) if left % d == 0]))
        shape.append(divisor)
        left //= divisor
    shape.append(left)
    return tuple(draw(st.permutations(shape)))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_reshape_is_a_view_exactly_where_numpy_needs_no_copy(data):
    base, view = data.draw(strided_values())
    new_shape = data.draw(factorizations(view.size))
    strides = reshaped_strides(view.shape, tuple(s // view.itemsize for s in view.strides), new_shape)
    reshaped = view.reshape(new_shape)
    if strides is None:
        assert not np.shares_memory(reshaped, base)
        return
    ours = np.lib.stride_tricks.as_strided(view, new_shape, tuple(s * view.itemsize for s in strides))
    np.testing.assert_array_equal(ours, reshaped)


def _crop(shape, pad_width, dtype="bfloat16"):
    x = ct.var("x", shape, dtype)
    (region,), _ = fuse([ct.pad(ct.exp(x), pad_width)], alone=True)
    return region


def test_a_crop_is_a_view_at_its_first_element_where_that_keeps_the_alignment():
    region = _crop((2, 8, 384), ((0, 0), (-1, 0), (-128, -128)))
    strides = {region.args[0]: contiguous_strides((2, 8, 384))}
    assert crop_offset(region, strides) == 384 + 128  # a row in, then 128 elements: 1024 bytes
    assert (384 + 128) * 2 % ALIGNMENT == 0
    assert crop_offset(_crop((2, 8, 384), ((0, 0), (0, 0), (-64, -64))), strides) is None  # 128 bytes in
    assert crop_offset(_crop((2, 8, 384), ((0, 0), (0, 0), (1, -1))), strides) is None  # pads too
