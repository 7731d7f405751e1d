"""The backend contract: backends are registered by name and reached only through ``Backend``."""

import numpy as np
import pytest

import cortado as ct
from cortado import backends
from cortado.backends.numpy import NumpyBackend


class CountingBackend(NumpyBackend):
    """The CPU backend, counting the steps it plans and proposing one alternative lowering."""

    name = "counting"

    def __init__(self):
        self.planned = 0
        self.variants = []

    def steps(self, kernels, options):
        self.planned += 1
        return super().steps(kernels, options)

    def alternatives(self, built):
        return ["again"] if self.variants == [None] else []

    @property
    def lowering(self):
        backend = self

        class Recording:
            def run(self, roots, trace, variant):
                backend.variants.append(variant)
                return roots

        return Recording()


def test_a_backend_registered_by_name_is_what_compile_builds_with():
    counting = CountingBackend()
    backends.register("counting", counting)
    try:
        x = ct.var("x", (3,))
        step = ct.compile([ct.exp(x) * 2], inputs=[x], backend="counting")
        value = np.array([0.0, 1.0, 2.0], np.float32)
        np.testing.assert_allclose(step(x=value)[0], np.exp(value) * 2, rtol=1e-6)
        assert step.backend == "counting"
        assert counting.variants == [None, "again"]  # each alternative the backend proposes is planned too
        assert counting.planned == 2
    finally:
        backends._REGISTRY.pop("counting")
    assert "counting" not in backends.names()


def test_an_unknown_backend_names_those_there_are():
    with pytest.raises(ct.BackendError, match="'numpy', 'cupy'"):
        x = ct.var("x", (1,))
        ct.compile([x], inputs=[x], backend="tpu")


def test_register_refuses_what_is_no_backend():
    with pytest.raises(ct.BackendError, match="needs a Backend"):
        backends.register("nothing", 42)
