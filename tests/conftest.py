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
