"""The GPU's rule pipeline run on the CPU, for tests of the passes after fusion."""

from cortado import compiler
from cortado.backends.cupy import backend as gpu_backend


def rewritten_for_the_gpu(outputs, monkeypatch=None, without=None):
    """The GPU's rewritten program and its traces; with ``monkeypatch``, without the compiler's pass named
    ``without`` (each returns its roots unchanged)."""
    if monkeypatch is not None:
        monkeypatch.setattr(compiler, without, lambda roots, trace: tuple(roots))
    traces = {}
    return compiler._rewrite(outputs, gpu_backend, traces), traces
