"""float16 sums, means, the softmax family and products accumulate in float32 and round once, as
bfloat16's do (issue 21): in the reference, in the NumPy backend's plain and fused kernels, and on
the GPU (its cases marked ``gpu``, skipped where none is visible). Every value is checked against
float64 arithmetic rounded once to float16.

NumPy adds float16 in float16 along any axis but a contiguous last one: 3000 times 0.1 summed down
a column gave 256, a softmax over 4000 zeros summed to 1.95, and one over 100,000 zeros, whose
sum overflows float16, gave zeros.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible
from cortado.backends.cupy.codegen import Operand, contiguous_strides
from cortado.backends.cupy.sources import kernel_sources
from cortado.exprgraph.graph import schedule
from cortado.exprgraph.ops import parameter
from cortado.backends.cupy.lowering import lowering as gpu_lowering

GPU = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]
BACKENDS = ["reference", "numpy", pytest.param("cupy", marks=GPU)]
U32 = 2.0 ** -24  # float32's unit roundoff: one rounding errs by at most this much, relatively


def computed(backend, out, feeds):
    """``out``'s value, its variables fed ``feeds`` (``{var: array}``), from the reference interpreter or from
    a program compiled for ``backend``; and the program (None for the reference)."""
    named = {v.name: value for v, value in feeds.items()}
    if backend == "reference":
        return ct.evaluate(out, named), None
    program = ct.compile([out], inputs=list(feeds), backend=backend)
    (value,) = program(**named)
    return (value.get() if hasattr(value, "get") else np.asarray(value)), program


def exact(out, feeds):
    """``out`` computed in float64 throughout."""
    return ct.evaluate(out, {v.name: value for v, value in feeds.items()}, precision="float64")


def assert_rounded_once(ours, exact, slack=0.0):
    """``ours`` within one ulp of its dtype of the float64 ``exact``, and ``slack`` (float32's own error)."""
    rounded = np.asarray(exact).astype(ours.dtype)
    assert ours.shape == rounded.shape
    a, r = ours.astype(np.float64), rounded.astype(np.float64)
    ulp = np.spacing(np.maximum(np.abs(a), np.abs(r)).astype(ours.dtype)).astype(np.float64)
    off = ~((a == r) | (np.abs(a - r) <= ulp + slack))
    assert not off.any(), f"{off.sum()} of {off.size} values off, such as {a[off][:3]} for {r[off][:3]}"


# -- the cases of the issue ------------------------------------------------------------------

# name -> (the op, the operand's shape, dtype and fill); 0.1 in float16 is 819/8192, so float32 adds
# 3000 of them exactly in any order
REDUCTIONS = {
    "sum of 3000 tenths": (lambda x: ct.sum(x), (3000,), "float16", 0.1),
    "sum of 3000 tenths down a column": (lambda x: ct.sum(x, axis=0), (3000, 4), "float16", 0.1),
    "mean of 3000 tenths down a column": (lambda x: ct.mean(x, axis=0), (3000, 4), "float16", 0.1),
    "logsumexp of 4000 zeros down a column": (lambda x: ct.logsumexp(x, axis=0), (4000, 3), "float16", 0),
    "softmax of 4000 zeros down a column": (lambda x: ct.softmax(x, axis=0), (4000, 3), "float16", 0),
    "softmax of 100,000 zeros": (lambda x: ct.softmax(x), (100_000,), "float16", 0),
    "log_softmax of 100,000 zeros": (lambda x: ct.log_softmax(x), (100_000,), "float16", 0),
    "softmax of 100,000 int8 zeros": (lambda x: ct.softmax(x), (100_000,), "int8", 0),  # computed as float16
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_float16_reductions_accumulate_in_float32_and_round_once(name, fused, backend):
    op, shape, dtype, fill = REDUCTIONS[name]
    x = ct.var("x", shape, dtype)
    out = op(x * 2 if fused else x)  # x * 2 makes the NumPy backend run the op inside a fused region
    assert out.dtype == np.float16
    feeds = {x: np.full(shape, fill, dtype)}
    ours, program = computed(backend, out, feeds)
    if backend == "numpy":
        assert any(k.term.op.name == "fused" for k in program.kernels) == fused
    assert_rounded_once(ours, exact(out, feeds))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float16_softmax_over_4000_zeros_sums_to_one(backend):
    x = ct.var("x", (4000, 3), "float16")
    out = ct.sum(ct.cast(ct.softmax(x, axis=0), "float32"), axis=0)  # each 1/2048 where added in float16: 1.95
    total, _ = computed(backend, out, {x: np.zeros((4000, 3), np.float16)})
    np.testing.assert_allclose(total, 1.0, atol=1e-3)


CONTRACTIONS = {  # name -> (the product, its two operands' shapes and fills)
    "matmul": (lambda a, b: a @ b, [((2, 3000), 0.1), ((3000, 2), 1)]),
    "matmul of a transposed operand": (lambda a, b: ct.transpose(a) @ b, [((3000, 2), 0.1), ((3000, 2), 1)]),
    "einsum": (lambda a, b: ct.einsum("ik,kj->ij", a, b), [((2, 3000), 0.1), ((3000, 2), 1)]),
    "einsum down columns": (lambda a, b: ct.einsum("ki,kj->ij", a, b), [((3000, 2), 0.1), ((3000, 2), 1)]),
    "a bias gradient over 3000 rows": (lambda a, b: ct.grad(ct.sum(a * b), [b])[0], [((3000, 2), 0.1), ((2,), 1)]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CONTRACTIONS)
def test_float16_products_of_3000_terms_accumulate_in_float32(name, backend):
    product, operands = CONTRACTIONS[name]
    variables = [ct.var(letter, shape, "float16") for letter, (shape, _) in zip("ab", operands)]
    out = product(*variables)
    read = set(schedule(out))  # a gradient may read one operand only
    feeds = {v: np.full(shape, fill, np.float16) for v, (shape, fill) in zip(variables, operands) if v in read}
    assert out.dtype == np.float16
    ours, _ = computed(backend, out, feeds)
    assert_rounded_once(ours, exact(out, feeds))


# -- any float16 reduction -------------------------------------------------------------------


@st.composite
def float16_reductions(draw):
    """``(op, axes, keepdims, x)``: one axis up to 3000 long, values of one sign or both."""
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    shape[draw(st.integers(0, rank - 1))] = draw(st.integers(1, 3000))
    op = draw(st.sampled_from(["sum", "mean", "logsumexp", "softmax", "log_softmax"]))
    axes = draw(st.none() | st.sets(st.integers(0, rank - 1), min_size=1).map(lambda s: tuple(sorted(s))))
    keepdims = draw(st.booleans())
    low = draw(st.sampled_from([0.0, -1.0]))
    scale = 1.0 if op in ("sum", "mean") else draw(st.sampled_from([1.0, 8.0]))  # sums stay below float16's max
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    return op, axes, keepdims, (rng.uniform(low, 1.0, shape) * scale).astype(np.float16)


def reduced(op, x, axes, keepdims):
    if op in ("softmax", "log_softmax"):
        return getattr(ct, op)(x, axis=axes)
    return getattr(ct, op)(x, axis=axes, keepdims=keepdims)


def float32_error(op, x, axes, out):
    """Twice the textbook bound on float32's own error in ``op`` over ``axes`` of ``x`` (``out`` the exact
    result): each of the ``n`` additions rounds a partial sum no larger than the sum of magnitudes; an
    exponential errs by a few roundings of its argument (at most ``spread``, the group's range), a
    logarithm, a division and the last addition by a few of their results."""
    x = x.astype(np.float64)
    n = x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))

    def per_group(values):  # a value per reduced group, in the result's shape (or broadcasting to it)
        return np.reshape(values, out.shape) if values.size == out.size else values

    magnitude = per_group(np.sum(np.abs(x), axis=axes, keepdims=True))
    peak, low = np.max(x, axis=axes, keepdims=True), np.min(x, axis=axes, keepdims=True)
    spread, peak = per_group(peak - low), per_group(peak)
    size = {"sum": n * magnitude, "mean": 2 * magnitude,
            "logsumexp": n + spread + 4 + 2 * np.abs(out) + np.abs(peak),
            "softmax": (n + 2 * spread + 9) * np.abs(out),
            "log_softmax": n + 3 * spread + 4 + 2 * np.abs(out)}[op]
    return 2 * U32 * size


def check_a_reduction(case, backend):
    op, axes, keepdims, values = case
    x = ct.var("x", values.shape, "float16")
    out = reduced(op, x, axes, keepdims)
    ours, _ = computed(backend, out, {x: values})
    expected = exact(out, {x: values})
    assert_rounded_once(ours, expected, float32_error(op, values, axes, expected))


@pytest.mark.parametrize("backend", ["reference", "numpy"])
@given(float16_reductions())
def test_any_float16_reduction_is_float64_rounded_once(backend, case):
    check_a_reduction(case, backend)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@settings(max_examples=25)  # each compiles its kernels
@given(float16_reductions())
def test_any_float16_reduction_on_the_gpu_is_float64_rounded_once(case):
    check_a_reduction(case, "cupy")


# -- what the GPU runs, checked on the CPU -----------------------------------------------------


@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_the_gpu_spells_the_softmax_family_of_narrow_floats_out_in_float32(name, dtype):
    x = ct.var("x", (100_000,), dtype)
    out = getattr(ct, name)(x)
    (lowered,) = gpu_lowering.run([out])
    assert lowered.dtype == out.dtype
    assert {t.dtype for t in schedule(lowered) if t.op.name in ("max", "sum")} == {np.dtype(np.float32)}
    feeds = {"x": np.zeros(100_000, dtype)}
    np.testing.assert_array_equal(ct.evaluate(lowered, feeds), ct.evaluate(out, feeds))


def test_gpu_reductions_of_float16_accumulate_in_float():
    x = ct.var("x", (3000, 40), "float16")
    operand = Operand(x.shape, np.dtype(np.float16), contiguous_strides(x.shape))
    for axis in (0, 1):  # columns split into parts (two kernels), a row of a block
        for source in kernel_sources((ct.sum(parameter(0, x), axis=axis),), [operand]):
            assert "float acc0 = " in source.text and "__half acc" not in source.text and "__half sums" not in source.text
