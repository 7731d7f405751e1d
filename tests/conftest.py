import os

import pytest
from hypothesis import HealthCheck, settings

# Deadlines measure the machine, not correctness; CI machines are small and shared.
settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("CORTADO_HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def blas_products(monkeypatch):
    """Products of matrices on the CPU as NumPy's BLAS computes them (its bits), where the CPU would take cortado's own
    (``backends.numpy.gemm``), as ``CORTADO_GEMM=blas`` asks: for tests of NumPy's bits through a step's products."""
    from cortado.backends.numpy import gemm

    monkeypatch.setattr(gemm, "available", lambda: False)


@pytest.fixture(autouse=True, scope="session")
def _choices_of_the_session(tmp_path_factory):
    """Tuning's choices (``calls.choices``) kept in a folder of the test session's own, for the processes the tests
    start too: the suite neither takes the choices a user's programs made on this machine nor leaves its own (some
    tests force a choice) behind for them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORTADO_CHOICES_DIR", str(tmp_path_factory.mktemp("choices")))
        yield


@pytest.fixture
def fresh_choices(monkeypatch, tmp_path):
    """No choice remembered, by the process or on disk, for this test alone (a test that forces one keeps it to
    itself)."""
    from cortado.backends.cupy.calls import choices

    monkeypatch.setattr(choices, "_remembered", {})
    monkeypatch.setattr(choices, "folder", lambda: str(tmp_path))
