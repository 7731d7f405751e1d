"""A NaN in the forward pass shows in the backward pass, as in PyTorch: ``max`` and ``max_pool2d`` route the
adjoint to the NaN (which equals no maximum), ``maximum``, ``minimum`` and ``relu`` do not drop it.

The expected gradients are PyTorch 2.13's on the CPU (``torch.max(x)`` for a full ``max``,
``torch.nn.functional.max_pool2d``, ``torch.maximum``, ``torch.minimum``, ``torch.relu``,
``torch.logsumexp``), written out so that the tests need no torch. Where PyTorch picks one of tied
elements by index (``torch.max(x, dim)``, ``max_pool2d``), cortado splits the adjoint evenly, as
``torch.max(x)`` and ``torch.amax`` do: the cases below tie only in a full ``max``. ``torch.amax``
differs at a NaN: its VJP is ``mask * (dy / count)`` with no element equal to the NaN maximum,
so ``0 * inf`` makes it NaN throughout.
"""

import numpy as np
import pytest

import cortado as ct
from cortado.backends import gpu_visible

nan, inf = np.nan, np.inf

POOLED = [[[[nan, 0, 1, 2], [3, 4, 5, 6], [7, 8, nan, 9], [1, 1, 1, 1]]]]


def _max_pool(kernel_size, stride=None, padding=0):
    return lambda x: ct.max_pool2d(x, kernel_size, stride, padding)


# name: (the function, its inputs, PyTorch's gradients of the sum of its outputs)
CASES = {
    "max": (lambda x: ct.max(x), [[nan, 0, 1, 2]], [[1, 0, 0, 0]]),
    "max-of-two-nans": (lambda x: ct.max(x), [[nan, 0, nan, 2]], [[0.5, 0, 0.5, 0]]),
    "max-finite-tie": (lambda x: ct.max(x), [[2, 0, 1, 2]], [[0.5, 0, 0, 0.5]]),  # unchanged
    "max-over-an-axis": (lambda x: ct.max(x, axis=1), [[[nan, 0, 1, 2], [3, 1, 4, 0]]],
                         [[[1, 0, 0, 0], [0, 0, 1, 0]]]),  # torch.max(x, dim=1)
    "max-through-sqrt": (lambda w: ct.max(ct.sqrt(w)), [[-1, 0.25, 1, 4]], [[nan, 0, 0, 0]]),
    "maximum": (ct.maximum, [[nan, 1, nan, 2, 1], [1, nan, nan, 2, 0]],
                [[1, 1, 1, 0.5, 1], [1, 1, 1, 0.5, 0]]),
    "minimum": (ct.minimum, [[nan, 1, nan, 2, 1], [1, nan, nan, 2, 0]],
                [[1, 1, 1, 0.5, 0], [1, 1, 1, 0.5, 1]]),
    "relu": (ct.relu, [[nan, 0, 1]], [[1, 0, 1]]),
    "logsumexp": (lambda x: ct.logsumexp(x, axis=0), [[nan, 0, 1, 2]], [[nan, nan, nan, nan]]),
    "logsumexp-of-inf": (lambda x: ct.logsumexp(x, axis=0), [[inf, 0, 1, 2]], [[nan, 0, 0, 0]]),
    "max_pool2d": (_max_pool(2), [POOLED],
                   [[[[[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]]]]]),
    "max_pool2d-overlapping": (_max_pool(2, 1), [POOLED],
                               [[[[[1, 0, 0, 0], [0, 0, 1, 1], [0, 2, 4, 0], [0, 0, 0, 0]]]]]),
    "max_pool2d-padded": (_max_pool(3, 2, 1), [POOLED],
                          [[[[[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]]]]]),
}


def _gradients(case, dtype):
    """The gradients' terms, the variables, and the feeds of ``case``."""
    function, values, _ = CASES[case]
    feeds = {f"x{i}": np.array(v, dtype) for i, v in enumerate(values)}
    xs = [ct.var(name, value.shape, dtype) for name, value in feeds.items()]
    return ct.grad(ct.sum(function(*xs)), xs), xs, feeds


def _assert_torchs(gradients, case):
    for ours, expected in zip(gradients, CASES[case][2]):
        np.testing.assert_array_equal(np.asarray(ours, np.float64), expected)  # NaN matches NaN


@pytest.mark.parametrize("case", CASES)
def test_the_reference_gives_torchs_gradients(case):
    gradients, _, feeds = _gradients(case, "float32")
    _assert_torchs(ct.evaluate(gradients, feeds), case)


@pytest.mark.parametrize("case", CASES)
def test_the_numpy_backend_gives_torchs_gradients(case):
    gradients, xs, feeds = _gradients(case, "float32")
    _assert_torchs(ct.compile(gradients, inputs=xs, backend="numpy")(**feeds), case)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("case", CASES)
def test_the_cupy_backend_gives_torchs_gradients(case, dtype):
    """The generated kernels keep ``x != x``: a NaN is found in the max's gradient, in float16 as in float32."""
    gradients, xs, feeds = _gradients(case, dtype)
    program = ct.compile(gradients, inputs=xs, backend="cupy")
    for _ in range(2):  # captured, then replayed
        _assert_torchs([g.get() for g in program(**feeds)], case)
