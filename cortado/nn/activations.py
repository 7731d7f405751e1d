"""PyTorch's activation modules by their names, and its ``Identity``, ``Softmax`` and ``LogSoftmax``, for a
``Sequential`` (each ``Function`` of cortado's op)."""

import functools

import numpy as np

from ..errors import CortadoError
from ..exprgraph import constructors as ct
from .module import Function


class ReLU(Function):
    """PyTorch's ``nn.ReLU``: ``ct.relu``."""

    def __init__(self):
        super().__init__(ct.relu)


class GELU(Function):
    """PyTorch's ``nn.GELU(approximate="tanh")``: ``ct.gelu``, the tanh form (cuBLASLt's epilogue). PyTorch's default,
    the exact form of ``erf``, is no op here; asked for, it is refused rather than given another function."""

    def __init__(self, approximate="none"):
        if approximate != "tanh":
            raise CortadoError(f"nn.GELU: cortado's gelu is the tanh form, nn.GELU(approximate='tanh'), not the erf "
                               f"form (approximate={approximate!r}), PyTorch's default")
        super().__init__(ct.gelu)

    def __repr__(self):
        return "GELU(approximate='tanh')"


class SiLU(Function):
    """PyTorch's ``nn.SiLU``: ``ct.silu``."""

    def __init__(self):
        super().__init__(ct.silu)


class Sigmoid(Function):
    """PyTorch's ``nn.Sigmoid``: ``ct.sigmoid``."""

    def __init__(self):
        super().__init__(ct.sigmoid)


class Tanh(Function):
    """PyTorch's ``nn.Tanh``: ``ct.tanh``."""

    def __init__(self):
        super().__init__(ct.tanh)


class Identity(Function):
    """PyTorch's ``nn.Identity``: its input (a placeholder where a layer is optional)."""

    def __init__(self, *args, **kwargs):  # (PyTorch's takes any arguments and ignores them)
        super().__init__(_identity)


def _identity(x):
    return x


class _AlongDim(Function):
    """A module of ``op(x, axis=dim)``, ``dim`` required (PyTorch's default guesses it)."""

    op = None

    def __init__(self, dim):
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):  # (PyTorch's None guesses an axis)
            raise CortadoError(f"nn.{type(self).__name__}(dim): dim is the axis to normalise, an int, not {dim!r}")
        super().__init__(functools.partial(type(self).op, axis=dim))
        self.dim = dim

    def __repr__(self):
        return f"{type(self).__name__}(dim={self.dim})"


class Softmax(_AlongDim):
    """PyTorch's ``nn.Softmax(dim)``: ``ct.softmax`` along ``dim``."""

    op = staticmethod(ct.softmax)


class LogSoftmax(_AlongDim):
    """PyTorch's ``nn.LogSoftmax(dim)``: ``ct.log_softmax`` along ``dim``."""

    op = staticmethod(ct.log_softmax)
