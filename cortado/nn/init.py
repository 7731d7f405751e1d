"""Initialisers: ``init(rng, shape, dtype) -> array``, PyTorch's defaults among them, each drawn from the NumPy
generator a module gives it (seeded by the model's seed and the parameter's name)."""

import math

import numpy as np


def zeros(rng, shape, dtype):
    return np.zeros(shape, dtype)


def ones(rng, shape, dtype):
    return np.ones(shape, dtype)


def uniform(bound):
    """``U(-bound, bound)``."""
    return lambda rng, shape, dtype: rng.uniform(-bound, bound, shape).astype(dtype)


def normal(std=1.0, mean=0.0):
    """``N(mean, std^2)``: ``normal(0.02)`` is GPT-2's."""
    return lambda rng, shape, dtype: (mean + std * rng.standard_normal(shape)).astype(dtype)


def fan_in_uniform(fan_in):
    """PyTorch's default for a linear or convolution layer's weight and bias: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
    (its ``kaiming_uniform_(a=sqrt(5))`` for the weight; the same bound for the bias)."""
    return uniform(1 / math.sqrt(fan_in) if fan_in > 0 else 0.0)
