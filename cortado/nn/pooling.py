"""PyTorch's parameterless shape modules by their names, for a ``Sequential``: pooling and flattening."""

import math

from ..errors import CortadoError
from ..exprgraph import constructors as ct
from .module import Module


class _Pool2d(Module):
    """A pooling of NCHW images by ``pool`` (``ct.max_pool2d``, ``ct.avg_pool2d``) over windows of ``kernel_size``."""

    pool = None

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return type(self).pool(x, self.kernel_size, self.stride, self.padding)


class MaxPool2d(_Pool2d):
    """PyTorch's ``nn.MaxPool2d(kernel_size, stride=None, padding=0)``: ``ct.max_pool2d`` over NCHW images. Its
    gradient splits a tie evenly among the window's largest (PyTorch's goes to the first). ``dilation``,
    ``ceil_mode`` and ``return_indices`` other than PyTorch's defaults are refused."""

    pool = ct.max_pool2d

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        _only_defaults("MaxPool2d", dilation=(dilation, 1), ceil_mode=(ceil_mode, False),
                       return_indices=(return_indices, False))
        super().__init__(kernel_size, stride, padding)


class AvgPool2d(_Pool2d):
    """PyTorch's ``nn.AvgPool2d(kernel_size, stride=None, padding=0)``: ``ct.avg_pool2d``, padding counted as zeros
    (PyTorch's ``count_include_pad=True``); ``ceil_mode``, ``count_include_pad=False`` and ``divisor_override`` are
    refused."""

    pool = ct.avg_pool2d

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        _only_defaults("AvgPool2d", ceil_mode=(ceil_mode, False), count_include_pad=(count_include_pad, True),
                       divisor_override=(divisor_override, None))
        super().__init__(kernel_size, stride, padding)


class Flatten(Module):
    """PyTorch's ``nn.Flatten(start_dim=1, end_dim=-1)``: the axes from ``start_dim`` to ``end_dim`` merged into
    one (a reshape, which moves no data)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        x = ct.as_term(x)
        rank = max(x.ndim, 1)
        start, end = self.start_dim % rank, self.end_dim % rank
        if not (-rank <= self.start_dim < rank and -rank <= self.end_dim < rank) or start > end:
            raise CortadoError(f"nn.Flatten(start_dim={self.start_dim}, end_dim={self.end_dim}) of "
                               f"{x.dtype}[{','.join(map(str, x.shape))}]: the axes from start_dim to end_dim "
                               f"must exist, in that order")
        if x.ndim == 0:
            return ct.reshape(x, (1,))
        merged = math.prod(x.shape[start:end + 1])
        return ct.reshape(x, x.shape[:start] + (merged,) + x.shape[end + 1:])


def _only_defaults(layer, **given):
    """Refuse a setting other than PyTorch's default, naming it: each is ``name=(value, default)``."""
    changed = [f"{name}={value!r}" for name, (value, default) in given.items() if value != default]
    if changed:
        raise CortadoError(f"nn.{layer}: {', '.join(changed)} is not supported; only PyTorch's defaults "
                           f"({', '.join(f'{n}={d!r}' for n, (_, d) in given.items())})")
