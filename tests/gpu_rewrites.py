"""The GPU's rule pipeline run on the CPU, for tests of the passes after fusion."""

from cortado import compiler
from cortado.backends.cupy import backend as gpu_backend
from cortado.backends.cupy import layout, targets


def planning_without_a_device(monkeypatch):
    """Let the GPU's planner run on the CPU: no device is asked for, and no library call needs scratch."""
    monkeypatch.setattr(layout, "require_gpu", lambda: None)
    monkeypatch.setattr(targets, "workspace_bytes", lambda kernel, view: 0)


def rewritten_for_the_gpu(outputs, monkeypatch=None, without=None):
    """The GPU's rewritten program and its traces; with ``monkeypatch``, without the compiler's pass named
    ``without`` (each returns its roots unchanged)."""
    if monkeypatch is not None:
        monkeypatch.setattr(compiler, without, lambda roots, trace: tuple(roots))
    traces = {}
    return compiler._rewrite(outputs, gpu_backend, traces), traces
