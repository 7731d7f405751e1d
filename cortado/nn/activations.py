"""PyTorch's activation modules by their names, and its ``Identity``, ``Softmax`` and ``LogSoftmax``, for a
``Sequential`` (each ``Function`` of cortado's op)."""

import functools

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


class Softmax(Function):
    """PyTorch's ``nn.Softmax(dim)``: ``ct.softmax`` along ``dim``, which is required (PyTorch's default guesses it)."""

    def __init__(self, dim):
        super().__init__(functools.partial(ct.softmax, axis=dim))
        self.dim = dim

    def __repr__(self):
        return f"Softmax(dim={self.dim})"


class LogSoftmax(Function):
    """PyTorch's ``nn.LogSoftmax(dim)``: ``ct.log_softmax`` along ``dim``, which is required."""

    def __init__(self, dim):
        super().__init__(functools.partial(ct.log_softmax, axis=dim))
        self.dim = dim

    def __repr__(self):
        return f"LogSoftmax(dim={self.dim})"
