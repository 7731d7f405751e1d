"""Broadcasts of intermediates inside fused regions, compiled against the reference interpreter.

A broadcast inside a fused body is a view of its source: the source's buffer must outlive every
read of the view. Issue 21 found 180 of 224 such graphs wrong on the CPU, because the body reused
the source's scratch (``tanh`` in place of ``v * 2``) while ``broadcast_to(v * 2)`` was still to be read.
The graphs drawn here are built to hit that: intermediates broadcast and then read beside other
users of the same intermediate. The GPU test in ``test_gpu_fused_broadcasts`` replays the property there.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortado as ct
from cortado.backends import gpu_visible

UNARY = [ct.tanh, ct.exp, ct.negative, ct.sigmoid, lambda x: x * 2.0, lambda x: x + 1.0]
BINARY = [ct.add, ct.multiply, ct.subtract, ct.maximum]


def broadcastable(*shapes):
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        return False
    return True


@st.composite
def broadcast_graphs(draw):
    """``(outputs, variable, feeds)``: elementwise chains over one variable in which intermediates are
    broadcast to a larger shape and read beside their other users."""
    side = draw(st.integers(1, 4))
    v = ct.var("v", (side,), draw(st.sampled_from(["float32", "float64"])))
    values = [v]
    for _ in range(draw(st.integers(2, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "broadcast", "beside"]))
        a = draw(st.sampled_from(values))
        if kind == "beside":  # a broadcast of ``a`` read with another user of ``a``, in either order
            lead = tuple(draw(st.lists(st.integers(2, 3), min_size=1, max_size=2)))
            pair = [ct.broadcast_to(a, lead + a.shape), draw(st.sampled_from(UNARY))(a)]
            values.append(draw(st.sampled_from(BINARY))(*draw(st.permutations(pair))))
        elif kind == "unary":
            values.append(draw(st.sampled_from(UNARY))(a))
        elif kind == "broadcast":
            lead = tuple(draw(st.lists(st.integers(2, 3), min_size=1, max_size=2)))
            values.append(ct.broadcast_to(a, lead + a.shape))
        else:
            b = draw(st.sampled_from(values))
            if broadcastable(a.shape, b.shape):
                values.append(draw(st.sampled_from(BINARY))(a, b))
    widest = max(values, key=lambda t: t.ndim)
    outputs = [widest] if widest is values[-1] else [widest, values[-1]]
    shift = draw(st.floats(0.1, 0.5))  # distinct, nonzero elements: a clobbered zero could read as right
    return outputs, v, {"v": (np.linspace(-0.9, 0.9, side) + shift).astype(v.dtype)}


def check(case, backend):
    outputs, v, feeds = case
    program = ct.compile(outputs, inputs=[v], backend=backend, debug=True)
    for ours, expected in zip(program(**feeds), ct.evaluate(outputs, feeds)):
        ours = ours.get() if hasattr(ours, "get") else ours
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


def test_the_issue_example_reads_the_broadcast_source_before_it_is_reused():
    v = ct.var("v", (3,))
    a = v * 2
    e = ct.broadcast_to(a, (2, 3)) + ct.tanh(a)
    feeds = {"v": np.array([0.1, 0.2, 0.3], np.float32)}
    (ours,) = ct.compile([e], inputs=[v])(**feeds)
    np.testing.assert_allclose(ours, ct.evaluate(e, feeds), rtol=1e-6)


@given(broadcast_graphs())
def test_broadcasts_of_intermediates_compile_to_the_reference_values(case):
    check(case, "numpy")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")
@settings(max_examples=40)
@given(broadcast_graphs())
def test_gpu_fused_broadcasts(case):
    check(case, "cupy")
