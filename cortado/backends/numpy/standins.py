"""The arrays a step's workspace is measured with: each claims the strides of the value it stands for over one
allocated element (``kernels.c_strided``), so the memory two of them seem to span may overlap however the allocator
happens to place their elements. ``may_share_memory`` takes a stand-in to share memory with no other array, so what
is measured (which output a NumPy loop may write straight into, which loop may run in place) is the same in every
process; where the values do share memory when the step runs, the step asks again of its real arrays."""

import numpy as np


class StandIn(np.ndarray):
    """An array standing for a value while a step is measured: never read or written."""


def may_share_memory(a, b):
    """``np.may_share_memory``, but false for a stand-in."""
    return not (isinstance(a, StandIn) or isinstance(b, StandIn)) and np.may_share_memory(a, b)
