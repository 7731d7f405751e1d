"""The GPU backend's views, checked on the CPU: a reshape is a view wherever NumPy's reshape needs no copy, with
strides that address the same elements, and a crop is a view of its operand at the offset of its first element."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends.cupy.codegen import contiguous_strides
from cortado.backends.cupy.layout import ALIGNMENT, crop_offset, reshaped_strides
from cortado.rules.fusion import KernelShapes, fuse


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
    (region,), _ = fuse([ct.pad(ct.exp(x), pad_width)], shapes=KernelShapes(one_op=True))
    return region


def test_a_crop_is_a_view_at_its_first_element_where_that_keeps_the_alignment():
    def offset(pad_width):
        region = _crop((2, 8, 384), pad_width)
        return crop_offset(region, {region.args[0]: contiguous_strides((2, 8, 384))})

    assert offset(((0, 0), (-1, 0), (-128, -128))) == 384 + 128  # a row in, then 128 elements: 1024 bytes
    assert (384 + 128) * 2 % ALIGNMENT == 0
    assert offset(((0, 0), (0, 0), (-64, -64))) is None  # 128 bytes in
    assert offset(((0, 0), (0, 0), (1, -1))) is None  # pads too


def _gpu_plan(outputs, inputs):
    """The cupy backend's kernels, strides and views of ``outputs``, planned on the CPU (no GPU is asked)."""
    from cortado import compiler
    from cortado.backends.cupy import backend as engine
    from cortado.backends.cupy.layout import layouts

    roots = compiler._rewrite(outputs, engine, {})
    kernels = compiler._kernels(roots, compiler._signature(roots, inputs, None, None))
    return kernels, *layouts(kernels, compiler._options(engine, {}))


def test_a_linear_layer_over_sequences_writes_over_its_residual():
    """``h + x @ w`` with x of (batch, time, width) is one gemm whose c reshapes the residual h: the gemm may write its
    result over h's buffer, as it does over a matrix's."""
    from cortado.backends.cupy.layout import _inplace

    x, h0, w = ct.var("x", (4, 64, 256), "bfloat16"), ct.var("h", (4, 64, 256), "bfloat16"), ct.var("w", (256, 256), "bfloat16")
    residual = ct.gelu(h0 * 2.0)  # computed: an arena buffer the gemm may take
    kernels, strides, views = _gpu_plan([ct.sum(ct.cast((residual + x @ w) ** 2, "float32"))], [x, h0, w])
    (gemm,) = [k for k in kernels if k.term.op.name == "gemm"]
    assert gemm.term.args[2] in views  # c: the residual's rows, a view
    assert _inplace(gemm, strides, views) == ((gemm.term, gemm.term.args[2].args[0]),)


def test_sibling_sums_write_over_nothing_either_reads_along_the_reduced_axis():
    """Two column sums merged into one kernel: ``w`` is read by the first's prologue at ``(r, b)`` (broadcast along
    the reduced axis, with as many rows as the outputs), so other blocks' outputs must not land in its buffer while
    it is read. Only what the epilogue alone reads may be written over."""
    from cortado.backends.cupy.layout import _inplace

    x, q = ct.var("x", (64, 64, 48)), ct.var("q", (64, 48))
    w = ct.softmax(q * 3.0, axis=-1)
    first, second = ct.sum(x * w, axis=1), ct.sum(ct.exp(x), axis=1)
    kernels, strides, views = _gpu_plan([ct.sum(first * second, axis=0)], [x, q])
    (merged,) = [k for k in kernels if len(k.terms) == 2]
    assert not _inplace(merged, strides, views)


def test_attention_gradients_are_not_concatenated_in_place_across_permuted_batch_axes():
    """Heads split from a projection whose batch axes the transpose also swaps: dq, dk and dv do not lie in the
    concatenation's columns in the concatenation's order, so each is written apart and concatenated by a kernel."""
    from cortado.backends.cupy.layout import concatenated_in_place

    outer, inner, time, heads, size = 3, 2, 16, 2, 64
    x = ct.var("x", (outer, inner, time, heads * size), "bfloat16")
    w = ct.var("w", (heads * size, 3 * heads * size), "bfloat16")
    for axes, found in (((0, 1, 3, 2, 4), 3), ((1, 0, 3, 2, 4), 0)):
        q, k, v = (ct.transpose(ct.reshape(t, (outer, inner, time, heads, size)), axes) for t in ct.split(x @ w, 3, -1))
        mixed = ct.softmax(q @ ct.transpose(k, (0, 1, 2, 4, 3)) * 0.125, axis=-1) @ v
        loss = ct.sum(ct.cast(mixed * mixed, "float32"))
        kernels, _, _ = _gpu_plan([loss, *ct.grad(loss, [x, w])], [x, w])
        assert len(concatenated_in_place(kernels)[0]) == found


def _array_of(t, source):
    """View ``t`` of the array ``source`` (its operand's values), as the reference computes it."""
    from cortado.exprgraph.windowing import window_view

    name = t.op.name
    if name == "transpose":
        return np.transpose(source, t.attr("axes"))
    if name == "broadcast_to":
        return np.broadcast_to(source, t.shape)
    if name == "reshape":
        return source.reshape(t.shape)
    if name == "windows":
        return window_view(source, *t.attrs)
    (crop,) = t.attr("outputs")  # a fused crop
    return source[tuple(slice(-low, n + high) for (low, high), n in zip(crop.attr("pad_width"), source.shape))]


def _check_views_address_their_elements(kernels, strides, views):
    """Every view (a transpose, reshape, broadcast, window or crop, with its element offset) reads, at its strides,
    the elements the reference gives it from the value it views; every column of a concatenation written in place
    holds the element the concatenation puts there."""
    from cortado.backends.cupy.layout import concatenated_in_place

    owners = {}
    for k in kernels:
        t = k.term
        if t in views:
            base, offset = owners[t.args[0]] if t.args[0] in owners else (t.args[0], 0)
            owners[t] = (base, offset + views[t])
    for t, (base, offset) in owners.items():
        labels = np.arange(base.size).reshape(base.shape)
        memory = np.zeros(offset + sum((n - 1) * s for n, s in zip(t.shape, strides[t])) + base.size + 1, np.int64)
        placed = np.lib.stride_tricks.as_strided(memory, base.shape, tuple(s * 8 for s in strides[base]))
        placed[...] = labels
        expected = labels
        for step in _chain(t, base):
            expected = _array_of(step, expected)
        read = np.lib.stride_tricks.as_strided(memory[offset:], t.shape, tuple(s * 8 for s in strides[t]))
        np.testing.assert_array_equal(read, expected)
    parts, wholes = concatenated_in_place(kernels)
    for whole in wholes:
        labels = np.arange(whole.size).reshape(whole.shape)  # the whole is stored in C order
        for d, (outer, offset) in parts.items():
            if outer is not whole:
                continue
            read = np.lib.stride_tricks.as_strided(labels.reshape(-1)[offset:], d.shape, tuple(s * 8 for s in strides[d]))
            rows = read.transpose(_only_reader_axes(kernels, d)).reshape(d.shape[:-3] + (d.shape[-2], -1))
            np.testing.assert_array_equal(rows, labels[..., offset % whole.shape[-1]:][..., :rows.shape[-1]])


def _chain(t, base):
    steps = []
    while t is not base:
        steps.append(t)
        t = t.args[0]
    return reversed(steps)


def _only_reader_axes(kernels, d):
    (swap,) = [k.term for k in kernels if k.term.op.name == "transpose" and k.term.args[0] is d]
    return swap.attr("axes")


def test_every_view_of_a_gpt_step_reads_the_elements_the_reference_gives_it():
    """The GPT's step as the GPU plans it (on the CPU): the heads split from the qkv projection (crops at an offset,
    reshapes of them, transposes), the heads merged back, the gradients written into their columns."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import gpt_by_hand as gpt

    config = gpt.Config(11, context=16, width=128, heads=2, layers=1)
    params = gpt.parameters(config)
    loss, _, tokens, labels = gpt.gpt(config, 2, params, "bfloat16")
    kernels, strides, views = _gpu_plan([loss, *ct.grad(loss, list(params.values()))],
                                        [tokens, labels, *params.values()])
    assert any(views.get(k.term) for k in kernels)  # some crop at an offset
    _check_views_address_their_elements(kernels, strides, views)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_view_of_a_sliced_value_reads_the_elements_the_reference_gives_it(data):
    """A computed value sliced along every axis, returned and read by a product: where the GPU plans the slice (and
    what reshapes it) as views, each view's strides and offset address the elements NumPy's indexing gives."""
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)), 64 * data.draw(st.integers(1, 3)))
    key = []
    for n in shape:
        start = data.draw(st.integers(0, n - 1) | st.sampled_from([0, 64, 128][: (n - 1) // 64 + 1]))
        key.append(slice(start, data.draw(st.integers(start + 1, n))))
    x = ct.var("x", shape, "float32")
    sliced = ct.exp(x)[tuple(key)]
    outputs = [sliced]
    if sliced.ndim >= 2 and sliced.size:
        outputs.append(ct.reshape(sliced, (-1, sliced.shape[-1])) @ ct.const(np.ones((sliced.shape[-1], 2), np.float32)))
    kernels, strides, views = _gpu_plan(outputs, [x])
    _check_views_address_their_elements(kernels, strides, views)
