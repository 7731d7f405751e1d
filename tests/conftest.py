import os

from hypothesis import HealthCheck, settings

# Deadlines measure the machine, not correctness; CI machines are small and shared.
settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("CORTADO_HYPOTHESIS_PROFILE", "default"))
