"""Tests against a peer's own results (PyTorch's layers, optimizers and functions): marked ``peer`` and skipped where
the peer is not installed. CI installs no peer; ``benchmarks/run_gpu.sh tests`` runs them on the GPU machine,
which has PyTorch."""

import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None


def needs_torch(test):
    """``test``, which compares against PyTorch: marked ``peer``, skipped where torch is not installed."""
    return pytest.mark.peer(pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")(test))
