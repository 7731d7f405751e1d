"""Backends: the reference interpreter (the oracle), and the executors ``compile`` builds for.

A compile backend provides its ``name``, the ``alignment`` of its arena, its ``lowering`` (or None;
``lowering.run(roots, trace, keep_sums)`` returns the rewritten roots, leaving the sums in ``keep_sums``
as reductions), ``steps(kernels, options)`` (what the memory planner needs to know of each kernel) and
``Executor(...)``, which builds the runnable step over the plan. It may also have ``OPTIONS``
(the keyword options of ``compile`` it takes, with their defaults), ``feeds_in_place`` (its
executor finds the feeds a place at each call: the arena holds none) and ``direct_outputs(...)``
(the outputs its kernels write straight into the program's output buffers, which the arena then
leaves out).
"""

from ..errors import BackendError

BACKENDS = ("numpy", "cupy")


def gpu_visible():
    """Whether CuPy is installed and sees an NVIDIA GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean no GPU here
        return False


def backend_named(name):
    """The backend module called ``name``, or a BackendError listing those there are."""
    if name == "numpy":
        from . import numpy

        return numpy
    if name == "cupy":
        try:
            import cupy  # noqa: F401
            import nvmath  # noqa: F401
        except ImportError as error:
            raise BackendError(f"compile: the cupy backend needs CuPy and nvmath-python (pip install -e \".[gpu]\"): "
                               f"{error}") from None
        from . import cupy as gpu

        return gpu
    raise BackendError(f"compile: there is no backend {name!r}; the backends are {', '.join(map(repr, BACKENDS))}")
