"""The CPU's attention in C a head at a time, its large products and regions in parts on the pool's threads, NumPy's
own loops called from C: the same bits as NumPy's calls, and NumPy's where a check says otherwise. The parts are
tested on pools of two threads and of more (an odd number: parts of unequal sizes) than this machine may have."""

import ctypes
import os
import re
import threading

import numpy as np
import pytest

import cortado as ct
from cortado.backends.numpy import attention, blas, gemm, loops, native
from cortado.exprgraph import attending, constructors

pytestmark = pytest.mark.skipif(native.toolchain() is None or blas.gemm("float32") is None,
                                reason="no C compiler or no BLAS entry point NumPy calls here")


@pytest.fixture(params=[2, 3, 5])
def threads(request, monkeypatch):
    """The pool's size, as ``CORTADO_THREADS`` would set it."""
    monkeypatch.setattr(native, "threads", lambda: request.param)
    return request.param


def _part_counts(program, kind):
    """The number of parts of each C function of ``kind`` (a name's start) the program's library runs on the pool."""
    return sorted(int(count) for source in program._executor.native.sources
                  for count in re.findall(rf"ct_in_parts\({kind}_[0-9a-f]+_part, p, (\d+)\)", source))


def _attention_program(q_shape, k_shape, dtype, causal, same=False):
    """An attention and its gradients, compiled, with random feeds (some not finite): ``(program, outputs, feeds)``."""
    q, k, v = ct.var("q", q_shape, dtype), ct.var("k", k_shape, dtype), ct.var("v", k_shape, dtype)
    out = constructors.attention(q, q if same else k, v, 0.37, causal)
    inputs = [q, v] if same else [q, k, v]
    outputs = [out, *ct.grad(ct.sum(out * out), inputs)]
    rng = np.random.default_rng(7)
    feeds = {x.name: rng.standard_normal(x.shape).astype(dtype) for x in inputs}
    if q_shape[-2] > 2:
        feeds["q"][(0,) * (len(q_shape) - 2) + (2, 1)] = np.inf
        feeds["v"][(0,) * (len(k_shape) - 2) + (1, 0)] = np.nan
    return ct.compile(outputs, inputs=inputs), outputs, feeds


def _attention_functions(program):
    return sorted(name.rsplit("_", 1)[0] for name in program._executor.native.names if name.startswith("attention"))


@pytest.mark.usefixtures("blas_products")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape,k_shape,dtype", [((16, 4, 64, 16), (16, 4, 64, 16), "float32"),
                                                   ((1, 5, 16, 4), (1, 5, 16, 4), "float32"),
                                                   ((3, 32, 8), (3, 48, 8), "float64"),
                                                   ((64, 16), (64, 16), "float32"),
                                                   ((2, 2, 600, 8), (2, 2, 600, 8), "float32")])  # sums in blocks
def test_attention_is_one_c_call_a_head_at_a_time_with_numpys_bits(q_shape, k_shape, dtype, causal, threads):
    """Heads even and odd in number, queries and keys of other lengths, no lead axes, float64, infinities and NaNs;
    the heads in as many parts as there are threads, or heads."""
    program, outputs, feeds = _attention_program(q_shape, k_shape, dtype, causal)
    if q_shape[-2] == 600 and not _c_attention_gives_numpys_bits(q_shape, k_shape, dtype, causal):
        # some BLAS builds (OpenBLAS running its Haswell kernels on some AMD EPYCs) sum 600 keys on their threads in
        # blocks no call from C reproduces: the attention stays NumPy's there
        assert _attention_functions(program) == []
    else:
        assert _attention_functions(program) == ["attention", "attention_grad"]
        heads = int(np.prod(q_shape[:-2]))
        assert _part_counts(program, "attention(?:_grad)?") == [min(threads, heads)] * 2
    for ours, numpy in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours.view(np.uint8), numpy.view(np.uint8))


def _c_attention(q_shape, k_shape, dtype, causal, same=False):
    """Which of attention and its gradient at these shapes run in C here (``attention.forward`` and ``backward`` asked
    as the executor asks them), each only where this BLAS's calls from C give NumPy's bits: the names
    ``_attention_functions`` lists."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal(q_shape).astype(dtype)
    k, v = (q if same else rng.standard_normal(k_shape).astype(dtype)), rng.standard_normal(k_shape).astype(dtype)
    scratch = [np.empty(n, dtype) for n in attending.scratch_sizes(q, k, v)]
    extra = np.empty(attention.extra_size(q, k), dtype)
    forward = attention.forward(np.empty_like(q), q, k, v, 0.37, causal, scratch[0], extra)
    gradients = [np.empty_like(x) for x in (q, k, v)]
    backward = attention.backward(*gradients, q, k, v, np.empty_like(q), 0.37, causal, *scratch[:3], extra)
    return [name for name, found in (("attention", forward), ("attention_grad", backward)) if found is not None]


def _c_attention_gives_numpys_bits(q_shape, k_shape, dtype, causal, same=False):
    """Whether attention and its gradient at these shapes both run in C here."""
    return len(_c_attention(q_shape, k_shape, dtype, causal, same)) == 2


@pytest.mark.usefixtures("blas_products")
@pytest.mark.parametrize("q_shape,same", [((2, 2, 1, 8), False),  # one query: NumPy's vector products
                                          ((2, 3, 7, 4), False),  # heads' row sums of other bits than all rows'
                                          ((2, 3, 16, 8), True)])  # q @ q^T: NumPy's syrk
def test_attention_stays_numpys_where_c_would_not_give_its_bits(q_shape, same):
    k_shape = q_shape[:-2] + (16 if q_shape[-2] == 1 else q_shape[-2], q_shape[-1])
    program, outputs, feeds = _attention_program(q_shape, k_shape, "float32", True, same)
    if q_shape == (2, 3, 7, 4) and _c_attention(q_shape, k_shape, "float32", True):
        # where this BLAS's ?gemv sums each head's rows as it sums all heads' rows at once, C may take them
        assert _attention_functions(program) == _c_attention(q_shape, k_shape, "float32", True)
    elif same:  # the gradient reads the forward's kept probabilities: it multiplies no matrix by its own transpose
        assert _attention_functions(program) == ["attention_grad"]
    else:
        assert _attention_functions(program) == []
        assert not isinstance(program._executor.threads, blas.one_thread)  # NumPy's products keep OpenBLAS's threads
    for ours, numpy in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours, numpy)


@pytest.mark.skipif(not gemm.available(), reason="the CPU's own products need x86-64 with AVX2 and FMA")
@pytest.mark.parametrize("q_shape,same", [((16, 4, 64, 16), False), ((2, 3, 7, 4), False), ((2, 3, 16, 8), True)])
def test_attention_with_the_cpus_own_products_is_c_whatever_their_layout_and_the_same_bits_on_any_threads(
        q_shape, same, monkeypatch):
    """Each head's products the CPU's own (``gemm``): C for every head, ``q @ q^T`` too, within rounding of the
    reference, and the same bits on one thread and on three."""
    k_shape = q_shape[:-2] + (q_shape[-2], q_shape[-1])
    results = []
    for count in (1, 3):
        monkeypatch.setattr(native, "threads", lambda count=count: count)
        program, outputs, feeds = _attention_program(q_shape, k_shape, "float32", True, same)
        assert _attention_functions(program) == ["attention", "attention_grad"]
        results.append(program(**feeds))
    for ours, other, reference in zip(*results, ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours.view(np.uint8), other.view(np.uint8))
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
        finite = np.isfinite(reference)
        np.testing.assert_allclose(ours[finite], reference[finite], rtol=1e-5, atol=1e-5 * np.abs(reference[finite]).max())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("keys", [1, 5, 16, 17, 63, 64, 129])
def test_the_einsum_of_the_gradients_rows_is_written_out_in_numpys_order(dtype, keys):
    assert attention.einsum_rows_agree(np.dtype(dtype), (3, 5, keys))


@pytest.mark.parametrize("ufunc", [np.exp, np.tanh, np.log, np.log1p, np.expm1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpys_own_loops_are_found_and_give_its_bits_in_stretches(ufunc, dtype):
    assert loops.unary(ufunc, np.dtype(dtype)) is not None
    assert loops.unary(np.add, np.dtype(dtype)) is None  # two operands: not a unary loop


@pytest.mark.usefixtures("blas_products")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_products_run_in_parts_on_the_pools_threads_with_numpys_bits(dtype, threads):
    """Parts of rows (a tall result) and of columns (a wide one), either operand transposed, one a thread and each
    of ``PART_SMALLEST`` multiply-adds or more, where this BLAS's parts give NumPy's bits; OpenBLAS's threads are held
    to one during the step where no product is left to NumPy, and given back after it."""
    x, w, u = ct.var("x", (512, 96), dtype), ct.var("w", (96, 160), dtype), ct.var("u", (96, 700), dtype)
    outputs = [x @ w, ct.transpose(w) @ ct.transpose(x), ct.transpose(u) @ x[:96] * 2.0]
    program = ct.compile(outputs, inputs=[x, w, u])
    # the parts a product is cut into, where this BLAS's calls on one thread give NumPy's bits in some blocking of its
    # sums (OpenBLAS running its Haswell kernels on some AMD EPYCs gives other bits on one thread than on its own)
    a, b, c = (np.zeros(shape, dtype) for shape in ((512, 96), (96, 160), (96, 700)))
    products = [(a, b), (b.T, a.T), (c.T, a[:96])]
    found = [blas.product(left, right, np.empty((left.shape[0], right.shape[1]), dtype)) for left, right in products]
    parted = [f for f in found if f is not None and f[0].startswith("gemm_parts")]
    assert _part_counts(program, "gemm_parts") == sorted(
        int(count) for _, source, _ in parted for count in re.findall(r"ct_in_parts\(\w+, p, (\d+)\)", source))
    if len(parted) == len(products):
        assert _part_counts(program, "gemm_parts") == sorted(min(threads, left.shape[0] * left.shape[1] * right.shape[1]
                                                                 // blas.PART_SMALLEST) for left, right in products)
    assert isinstance(program._executor.threads, blas.one_thread) == (None not in found)
    rng = np.random.default_rng(8)
    feeds = {v.name: rng.standard_normal(v.shape).astype(dtype) for v in (x, w, u)}
    before = blas.threads()[1]() if blas.threads() is not None else None
    for ours, numpy in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        np.testing.assert_array_equal(ours, numpy)
    assert (blas.threads()[1]() if blas.threads() is not None else None) == before


def _parted(program):
    return sum(name.startswith("parts_") for name in program._executor.native.names)


def _with_and_without_c(outputs, inputs, feeds, monkeypatch):
    """The program compiled with native code, and its outputs with it and without (NumPy's calls op by op)."""
    program = ct.compile(outputs, inputs=inputs)
    with monkeypatch.context() as patch:
        patch.setattr(native, "toolchain", lambda: None)
        without = ct.compile(outputs, inputs=inputs)
    return program, program(**feeds), without(**feeds)


def _feeds(variables, seed=9):
    """Random feeds, a few values not finite, some large enough that exp overflows."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in variables:
        value = (rng.standard_normal(v.shape) * 10.0 ** rng.uniform(-2, 2, v.shape)).astype(v.dtype)
        value.reshape(-1)[:3] = [np.inf, -np.nan, -np.inf][:value.size]
        feeds[v.name] = value
    return feeds


def _assert_same_bits(ours, numpy):
    """Bit for bit (the signs of zeros included), but for a NaN's sign: C's arithmetic and NumPy's give either."""
    for a, b in zip(ours, numpy):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        numbers = ~np.isnan(b)
        np.testing.assert_array_equal(a[numbers].view(np.uint8), b[numbers].view(np.uint8))


@pytest.mark.parametrize("shape,dtype", [((64, 1031), "float32"),  # parts of 32 rows, of 21 and 22, of 12 and 13
                                         ((1, 3, 5, 4801), "float64"),  # the first axis of more than one: 3 parts at most
                                         ((120000,), "float32")])  # one axis: parts of elements
def test_large_elementwise_regions_run_in_parts_with_numpys_bits(shape, dtype, monkeypatch, threads):
    """A gelu with its bias and its gradient (exp between loop nests: NumPy's own loop called from C on each part's
    elements), a tanh and a log1p: each region one C call of a part a thread, with NumPy's bits."""
    x, b, g = ct.var("x", shape, dtype), ct.var("b", shape[-1:], dtype), ct.var("g", shape, dtype)
    y = ct.gelu(x + b)
    outputs = [y, *ct.grad(ct.sum(y * g), [x]), ct.tanh(x) * g + ct.log1p(ct.abs(g))]
    program, ours, numpy = _with_and_without_c(outputs, [x, b, g], _feeds([x, b, g]), monkeypatch)
    assert _part_counts(program, "parts").count(min(threads, next(n for n in shape if n > 1))) >= 2
    _assert_same_bits(ours, numpy)


def test_layer_norms_run_in_parts_of_rows_their_sums_numpys(monkeypatch, threads):
    """A layer norm forward and backward: its rows' sums and means in C, as NumPy sums them, each part's rows on a
    thread."""
    from cortado import nn

    x, g = ct.var("x", (37, 3, 640)), ct.var("g", (37, 3, 640))
    model = nn.LayerNorm(640)
    y = model(x)
    params = {name: p.var for name, p in model.named_parameters()}
    outputs = [y, *ct.grad(ct.sum(y * g), [x])]
    feeds = _feeds([x, g])
    feeds.update({v.name: np.asarray(value) for v, value in model.initial_values(0).items()})
    program, ours, numpy = _with_and_without_c(outputs, [x, g, *params.values()], feeds, monkeypatch)
    assert _part_counts(program, "parts").count(threads) >= 2
    _assert_same_bits(ours, numpy)


def test_an_update_in_place_runs_in_parts_each_reading_an_element_before_writing_it(threads):
    n = 50001  # parts of 25000 and 25001 elements, of 16667 and 16667, ...
    w, g, m = ct.var("w", (n,)), ct.var("g", (n,)), ct.var("m", (n,))
    m_new = 0.9 * m + 0.1 * g
    step = ct.compile([], inputs=[g], state={w: np.ones(n, np.float32), m: np.zeros(n, np.float32)},
                      updates={m: m_new, w: w - 0.01 * m_new / (ct.sqrt(m_new * m_new) + 1e-8)})
    assert _part_counts(step, "parts") == [threads]
    grads = np.linspace(-1, 1, n, dtype=np.float32)
    step(g=grads)
    m1 = np.float32(0.9) * np.zeros(n, np.float32) + np.float32(0.1) * grads
    np.testing.assert_array_equal(step.state["m"], m1)
    np.testing.assert_array_equal(step.state["w"], 1 - np.float32(0.01) * m1 / (np.sqrt(m1 * m1) + np.float32(1e-8)))


def test_steps_try_their_parts_on_more_and_fewer_threads_and_keep_the_fastest_with_the_same_bits(threads):
    """``native.Pacing``: after the first steps, steps try the caller alone and with 1, 3, ... and all workers, timed,
    then keep the fastest; every step's results are the same bits."""
    x = ct.var("x", (64, 1024))
    program = ct.compile([ct.tanh(x) * x + 1], inputs=[x])
    pacing = program._executor.native.pacing
    assert _part_counts(program, "parts") == [threads] and pacing is not None
    assert pacing.ways == {2: [0, 1], 3: [0, 1, 2], 5: [0, 1, 3, 4]}[threads]
    feed = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    first = program(x=feed)[0]
    trials = pacing.ROUNDS * len(pacing.ways)
    helpers = []
    for _ in range(pacing.WARM + trials + 2):
        np.testing.assert_array_equal(program(x=feed)[0], first)
        helpers.append(pacing.helpers.value)
    assert helpers[pacing.WARM - 1:pacing.WARM - 1 + trials] == pacing.ways * pacing.ROUNDS and all(pacing.seconds)
    assert helpers[-1] == helpers[-2] == pacing.ways[pacing.seconds.index(min(pacing.seconds))]


@pytest.mark.parametrize("case", ["small", "kept_broadcast", "sum_over_first_axis", "no_loop"])
def test_regions_that_do_not_part_cleanly_stay_whole(case, monkeypatch):
    """Below the size that pays; a value computed once for every row (exp of a bias) that every part would write; a
    sum over the axis the parts would cut; NumPy's loop not found (its call stays NumPy's, between loop nests)."""
    rows = 4 if case == "small" else 300
    x, b = ct.var("x", (rows, 128)), ct.var("b", (128,))
    if case == "kept_broadcast":
        outputs = [ct.exp(b * 2.0) * x + 1.0]
    elif case == "sum_over_first_axis":
        outputs = [ct.sum(ct.exp(x * 2.0) * 3.0 + x, axis=0) - b]
    else:
        outputs = [ct.gelu(x + b)]
    if case == "no_loop":
        monkeypatch.setattr(loops, "unary", lambda ufunc, dtype: None)
    program, ours, numpy = _with_and_without_c(outputs, [x, b], _feeds([x, b]), monkeypatch)
    assert _parted(program) == 0
    assert program._executor.native.names  # C still computes the region's loop nests
    _assert_same_bits(ours, numpy)


@pytest.mark.usefixtures("blas_products")
def test_regions_run_whole_in_a_step_that_runs_numpys_blas(monkeypatch):
    """A matrix times its own transpose is NumPy's (syrk), on OpenBLAS's threads, whose idle threads spin on the second
    core: the step's large regions run on one thread."""
    x, b = ct.var("x", (256, 300)), ct.var("b", (300,))
    outputs = [ct.gelu(x + b), x @ ct.transpose(x)]
    program, ours, numpy = _with_and_without_c(outputs, [x, b], _feeds([x, b]), monkeypatch)
    assert _parted(program) >= 1 and not program._executor.native.parted
    _assert_same_bits(ours, numpy)
    assert ct.compile(outputs[:1], inputs=[x, b])._executor.native.parted


def test_regions_called_from_two_python_threads_at_once_keep_their_bits(threads):
    """Two programs of the same regions (one library), each called from a thread of its own: a call made while the
    other holds the pool runs every part itself."""
    x, b = ct.var("x", (256, 300)), ct.var("b", (300,))
    outputs = [ct.gelu(x + b), ct.tanh(x) * 2.0 + b]
    programs = [ct.compile(outputs, inputs=[x, b]) for _ in range(2)]
    assert all(_parted(p) >= 1 for p in programs)
    feeds = [_feeds([x, b], seed) for seed in (1, 2)]
    expected = [ct.evaluate(outputs, f) for f in feeds]
    failures = []

    def run(program, feed, want):
        for _ in range(200):
            got = program(**feed)
            if any(a.tobytes() != w.tobytes() for a, w in zip(got, want)):
                failures.append(program)
                return

    threads = [threading.Thread(target=run, args=args) for args in zip(programs, feeds, expected)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.mark.parametrize("ufunc", [np.exp, np.tanh, np.log1p])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpys_loops_give_the_same_bits_at_every_start_and_length_of_a_stretch(ufunc, dtype):
    """What lets a region's parts call the loop each on its own elements: an element's result depends neither on
    where its stretch starts (its alignment) nor on how long it is."""
    loop, data = loops.unary(ufunc, np.dtype(dtype))
    call = loops._LOOP(loop)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(400) * 10.0 ** rng.uniform(-3, 2, 400)).astype(dtype)
    x[::37] = np.inf
    with np.errstate(all="ignore"):
        expected = ufunc(x)
    itemsize = x.itemsize
    for start in range(17):
        for length in (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 200):
            out = np.zeros_like(x)
            arguments = (ctypes.c_void_p * 2)(x.ctypes.data + start * itemsize, out.ctypes.data + start * itemsize)
            call(arguments, (ctypes.c_ssize_t * 1)(length), (ctypes.c_ssize_t * 2)(itemsize, itemsize), data or None)
            np.testing.assert_array_equal(out[start:start + length].view(np.uint8),
                                          expected[start:start + length].view(np.uint8))


POOL_CHECK = r"""
static long ct_check_runs[64];
static void ct_check_part(void* const* p, long k) {
  __atomic_add_fetch(&ct_check_runs[k], 1, __ATOMIC_RELAXED);
  for (volatile long i = 0; i < (long)p[0]; ++i) {}
}
long ct_check(long calls) {  /* the first call (from 1) in which a part ran other than once, or 0 */
  for (long c = 1; c <= calls; ++c) {
    const long parts = 2 + c % 15;
    void* p[1] = {(void*)(c % 7 * 50)};
    for (long k = 0; k < parts; ++k) ct_check_runs[k] = 0;
    ct_in_parts(ct_check_part, p, parts);
    for (long k = 0; k < parts; ++k) if (ct_check_runs[k] != 1) return c;
  }
  return 0;
}
"""


@pytest.mark.parametrize("size", [2, 3, 16])
def test_the_pool_runs_each_part_of_each_call_once(size, monkeypatch):
    """Calls of 2 to 16 parts of uneven lengths in turn, on pools of more threads than cores too: a worker late from
    one call, which read the next call's number of parts beside the word it claims from, once ran a part twice."""
    monkeypatch.setattr(native, "threads", lambda: size)
    check = native.load(native.header() + POOL_CHECK).ct_check
    check.restype, check.argtypes = ctypes.c_long, [ctypes.c_long]
    found = []
    runner = threading.Thread(target=lambda: found.append(check(100000)), daemon=True)  # a pool that loses a part hangs
    runner.start()
    runner.join(timeout=120)
    assert found == [0]


@pytest.mark.usefixtures("blas_products")
@pytest.mark.parametrize("groups", [1, 2])
def test_convolutions_products_and_copies_run_in_parts_of_images_with_numpys_bits(groups, monkeypatch, threads):
    """A convolution and its gradients (themselves convolutions), a pooling and the windows' sums: each image's and
    group's product is the ?gemm NumPy's stacked matmul makes, from C, and the windows' copies into columns, the pads
    and the gradients' windows added back tap by tap (overlapping) are C loop nests, all in parts of the images on
    the pool's threads, with NumPy's bits."""
    x, w = ct.var("x", (6, 16, 16, 16)), ct.var("w", (32, 16 // groups, 3, 3))
    h = ct.conv(x, w, strides=(1, 1), padding=((1, 1), (1, 1)), groups=groups)
    pooled, sums = ct.max_pool2d(ct.tanh(h), 2), ct.sum(ct.windows(h, (3, 3), strides=(2, 2)), axis=(4, 5))
    loss = ct.sum(pooled * pooled) + ct.sum(sums * sums)
    outputs = [h, *ct.grad(loss, [x, w])]
    program, ours, numpy = _with_and_without_c(outputs, [x, w], _feeds([x, w]), monkeypatch)
    assert _part_counts(program, "gemm_stack") and max(_part_counts(program, "gemm_stack")) == min(threads, 6)
    copies = [k for k in program.kernels if k.term.op.name in ("conv", "overlap_add", "pad")]
    assert copies and _part_counts(program, "parts").count(min(threads, 6)) >= len(copies)
    _assert_same_bits(ours, numpy)


@pytest.mark.usefixtures("blas_products")
def test_a_stack_of_fewer_matrices_than_threads_cuts_each_matrix_too(monkeypatch, threads):
    """A convolution of one input channel: its weight gradient is one matrix (16 output channels by 9 taps, a sum over
    every image's pixels), cut into parts of its rows on the pool's threads, with NumPy's bits."""
    x, w = ct.var("x", (16, 1, 32, 32)), ct.var("w", (16, 1, 3, 3))
    h = ct.conv(x, w, strides=(1, 1), padding=((1, 1), (1, 1)))
    outputs = [h, *ct.grad(ct.sum(ct.tanh(h) * h), [w])]
    program, ours, numpy = _with_and_without_c(outputs, [x, w], _feeds([x, w]), monkeypatch)
    assert min(threads, 16 * 9 * 16 * 1024 // blas.PART_SMALLEST, 8) in _part_counts(program, "gemm_stack")
    _assert_same_bits(ours, numpy)


@pytest.mark.usefixtures("blas_products")
def test_the_search_for_numpys_blocking_of_a_sum_is_bounded(monkeypatch):
    """128 x 784 x 256 sums in two blocks of 392 on two OpenBLAS threads (on one call, 400 and 384): found among the
    blockings where the search may try them, not where it may try only one call (the product then stays NumPy's)."""
    shape = (np.dtype(np.float32), 128, 784, 256, blas.NO_TRANS, blas.NO_TRANS, 1)
    blas.blocks.cache_clear()
    found = blas.blocks(*shape)
    if found in (None, (784,)):
        pytest.skip(f"this OpenBLAS sums 128 x 784 x 256 as {found} on its threads")
    blas.blocks.cache_clear()
    monkeypatch.setattr(blas, "SEARCH_LIMIT", 0)
    assert blas.blocks(*shape) is None
    blas.blocks.cache_clear()


def test_the_pools_size_is_the_usable_cores_or_cortado_threads(monkeypatch):
    native.threads.cache_clear()
    try:
        monkeypatch.setenv("CORTADO_THREADS", "3")
        assert native.threads() == 3
        native.threads.cache_clear()
        monkeypatch.setenv("CORTADO_THREADS", "many")
        with pytest.raises(ValueError, match="CORTADO_THREADS='many': give a whole number of threads"):
            native.threads()
        native.threads.cache_clear()
        monkeypatch.delenv("CORTADO_THREADS")
        assert native.threads() == len(os.sched_getaffinity(0))
    finally:
        native.threads.cache_clear()
