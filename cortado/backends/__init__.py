"""Backends: the reference interpreter (the oracle), and the executors ``compile`` builds for.

A compile backend provides its ``name``, the ``alignment`` of its arena, its ``lowering`` rules
(or None), ``steps(kernels)`` (what the memory planner needs to know of each kernel) and
``executor(...)``, which builds the runnable step over the plan.
"""

from ..errors import BackendError

BACKENDS = ("numpy",)


def backend_named(name):
    """The backend module called ``name``, or a BackendError listing those there are."""
    if name == "numpy":
        from . import numpy

        return numpy
    raise BackendError(f"compile: there is no backend {name!r}; the backends are {', '.join(map(repr, BACKENDS))}")
