"""Backends: the reference interpreter (the oracle), and the targets ``compile`` builds for, by name.

Each target is a package making a ``Backend`` (``interface``), registered here by the module that
holds it; a backend is imported only when a program is built for it, so the CPU path never
imports CuPy.
"""

import importlib

from ..errors import BackendError
from .interface import Backend, Executor  # noqa: F401  (the contract, for backend packages)

_REGISTRY = {}  # name -> a Backend, or the module whose ``backend`` attribute is one


def register(name, backend):
    """Make ``compile(..., backend=name)`` build with ``backend``: a ``Backend``, or the name of the module
    holding it as ``backend`` (imported on first use)."""
    if not isinstance(backend, (Backend, str)):
        raise BackendError(f"register: {name!r} needs a Backend or a module name, not {type(backend).__name__}")
    _REGISTRY[name] = backend


register("numpy", "cortado.backends.numpy")
register("cupy", "cortado.backends.cupy")


def names():
    """The names ``compile`` takes for ``backend``."""
    return tuple(_REGISTRY)


def backend_named(name):
    """The backend registered as ``name``, its requirements checked; a BackendError naming those there are."""
    if name not in _REGISTRY:
        raise BackendError(f"compile: there is no backend {name!r}; the backends are {', '.join(map(repr, names()))}")
    backend = _REGISTRY[name]
    if isinstance(backend, str):
        backend = importlib.import_module(backend).backend
    backend.require()
    return backend


def gpu_visible():
    """Whether CuPy is installed and sees an NVIDIA GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean no GPU here
        return False
