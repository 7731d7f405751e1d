"""Counter-based random numbers: Philox-4x32-10 against its published answers, ``random_uniform`` the same bits on
every backend, and ``nn.Dropout`` built on it."""

import numpy as np
import pytest
from reference_checks import BACKENDS, host, skip_without_device

import cortado as ct
from cortado import nn
from cortado.exprgraph.ops.random import philox

# Random123's known-answer vectors for philox4x32-10: (counter, key) -> result
KNOWN = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN)
def test_philox_gives_the_published_answers(counter, key, expected):
    words = philox([np.uint32(c) for c in counter], [np.uint32(k) for k in key])
    assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_draws_the_references_numbers(backend):
    skip_without_device(backend)
    seed, counter = ct.var("seed", (), "uint32"), ct.var("counter", (), "int32")
    u = ct.random_uniform(seed, counter, (3, 1000))
    feeds = {"seed": np.uint32(2 ** 32 - 5), "counter": np.int32(11)}
    expected = ct.evaluate(u, feeds)
    program = ct.compile([u * 2.0], inputs=[seed, counter], backend=backend)
    np.testing.assert_array_equal(host(program(**feeds)[0]), expected * 2)
    assert expected.dtype == np.float32 and 0 <= expected.min() and expected.max() < 1
    assert abs(float(expected.mean()) - 0.5) < 0.02 and abs(float(expected.var()) - 1 / 12) < 0.005


@pytest.mark.parametrize("shape, seed, counter, stream", [
    ((64, 64), np.uint32(1234), np.uint32(0), 0), ((3, 5, 2 ** 16 + 3), np.uint32(2 ** 32 - 1), np.uint32(2 ** 31 + 5), 1),
    ((7,), np.int64(-1), np.int32(7), 2 ** 32 - 1), ((0,), np.uint32(3), np.uint32(4), 2),
])
def test_the_cpus_c_draws_the_definitions_bits(shape, seed, counter, stream):
    """The CPU's C (``backends.numpy.philox``) writes the numbers NumPy's definition makes, bit for bit: keys modulo
    2^32, the largest stream, an empty draw."""
    from cortado.backends.numpy import native, philox as c_philox
    from cortado.exprgraph.ops.random import uniform

    if native.toolchain() is None:
        pytest.skip("no C compiler")
    out = np.empty(shape, np.float32)
    assert c_philox.uniform_into(out, seed, counter, stream)
    np.testing.assert_array_equal(out.view(np.uint32), uniform(seed, counter, shape, stream).view(np.uint32))
    assert not c_philox.uniform_into(np.empty((4, 4), np.float32).T[:, :2], seed, counter, stream)  # not C order


def test_another_key_gives_other_numbers_and_the_same_key_the_same():
    seed, counter = ct.var("seed", (), "uint32"), ct.var("counter", (), "uint32")
    u = ct.random_uniform(seed, counter, (256,))
    first = ct.evaluate(u, {"seed": np.uint32(1), "counter": np.uint32(0)})
    assert np.array_equal(first, ct.evaluate(u, {"seed": np.uint32(1), "counter": np.uint32(0)}))
    for other in ({"seed": np.uint32(1), "counter": np.uint32(1)}, {"seed": np.uint32(2), "counter": np.uint32(0)}):
        assert np.mean(first == ct.evaluate(u, other)) < 0.02


def test_random_uniform_says_what_its_key_must_be():
    with pytest.raises(ct.DTypeError, match="seed is an integer scalar"):
        ct.random_uniform(ct.var("s", ()), ct.var("c", (), "int32"), (2,))
    with pytest.raises(ct.DTypeError, match="counter is an integer scalar"):
        ct.random_uniform(ct.var("s", (), "int32"), ct.var("c", (2,), "int32"), (2,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_zeroes_a_p_of_the_elements_scales_the_rest_and_draws_anew_each_step(backend):
    skip_without_device(backend)
    model = nn.Sequential(nn.Dropout(0.25), nn.Dropout(0.5))
    x = ct.var("x", (4096,))
    y = model(x)
    updates = model.state_updates(y)
    assert sorted(v.name for v in updates) == ["0.counter", "1.counter"]
    step = ct.compile([y], inputs=[x], state=model.initial_values(seed=1), updates=updates, backend=backend)
    ones = np.ones(4096, np.float32)
    first, second = (host(step(x=ones)[0]) for _ in range(2))
    scale = np.float32(1 / 0.75) * np.float32(1 / 0.5)
    assert set(np.unique(first).tolist()) == {0.0, float(scale)}
    assert abs(np.mean(first == 0) - (1 - 0.75 * 0.5)) < 0.03
    assert np.mean(first != second) > 0.3  # the counters moved
    assert int(host(step.state["0.counter"])) == 2
    seeds = [int(host(step.state[f"{i}.seed"])) for i in range(2)]
    assert seeds[0] != seeds[1]
    if backend == "cupy":  # the GPU's masks are the CPU's
        cpu = ct.compile([y], inputs=[x], state=model.initial_values(seed=1), updates=updates, backend="numpy")
        np.testing.assert_array_equal(cpu(x=ones)[0], first)


def test_dropout_is_the_identity_in_inference_and_refuses_a_probability_of_one():
    model = nn.Dropout(0.5)
    x = ct.var("x", (8,))
    assert model.eval()(x) is x
    with pytest.raises(ct.CortadoError, match=r"at least 0 and below 1"):
        nn.Dropout(1.0)
