"""Counter-based random numbers: ``random_uniform(seed, counter, shape, stream=0)``, float32 values in ``[0, 1)``,
each a function of its two integer key operands, its ``stream`` and its flat index alone, so every backend computes
the same numbers (Philox-4x32-10, as cuRAND and Random123 define it: Salmon et al., "Parallel random numbers: as easy
as 1, 2, 3", SC 2011). Element ``i`` is the first word of Philox applied to the counter ``(i mod 2^32, i / 2^32,
stream, 0)`` under the key ``(seed, counter)``, its top 24 bits scaled by ``2^-24``: streams of one key are
independent sequences (a dropout called twice in a step draws one for each call). A program keeps
``seed`` and ``counter`` as state and adds 1 to the counter every step, so each step draws new
numbers and a run resumed from a checkpoint draws the same ones.
"""

import math

import numpy as np

from ..term import dtype_violation, shape_violation
from .base import Op

RANDOM = "random"  # made from its key operands and its own element indices
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)  # the key's increments between rounds
ROUNDS = 10
SCALE = 2.0 ** -24


def philox(counter, key):
    """Philox-4x32-10 of ``counter`` (four uint32 arrays) under ``key`` (two uint32 arrays): four uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) for c in counter)
    k0, k1 = (np.asarray(k, np.uint64) for k in key)
    mask = np.uint64(0xFFFFFFFF)
    for round_ in range(ROUNDS):
        if round_:
            k0, k1 = (k0 + np.uint64(WEYL[0])) & mask, (k1 + np.uint64(WEYL[1])) & mask
        p0, p1 = np.uint64(MULTIPLIERS[0]) * c0, np.uint64(MULTIPLIERS[1]) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def uniform(seed, counter, shape, stream=0):
    """What ``random_uniform`` computes, in NumPy."""
    size = math.prod(shape)
    index = np.arange(size, dtype=np.uint64)
    zero = np.zeros(size, np.uint64)
    key = tuple(np.asarray(k).astype(np.uint32).astype(np.uint64) for k in (seed, counter))  # modulo 2^32, as C casts
    word = philox((index & np.uint64(0xFFFFFFFF), index >> np.uint64(32), zero + np.uint64(stream), zero), key)[0]
    return ((word >> np.uint32(8)).astype(np.float32) * np.float32(SCALE)).reshape(shape)


def _normalize(args, shape, stream=0):
    for name, key in zip(("seed", "counter"), args):
        if key.ndim or key.dtype.kind not in "iu":
            raise dtype_violation(f"random_uniform's {name} is an integer scalar (a state variable a step updates), "
                                  f"not {key.dtype.name}{list(key.shape)}")
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    if any(int(n) != n or n < 0 for n in shape):
        raise shape_violation(f"random_uniform's shape has sizes of 0 or more, not {shape}")
    if int(stream) != stream or not 0 <= stream < 2 ** 32:
        raise shape_violation(f"random_uniform's stream is an int in [0, 2^32), not {stream!r}")
    return (tuple(int(n) for n in shape), int(stream))


RANDOM_UNIFORM = Op("random_uniform", 2, ("shape", "stream"), lambda args, shape, stream: shape,
                    lambda args, shape, stream: np.dtype(np.float32), RANDOM, _normalize,
                    evaluate=lambda xs, shape, stream: uniform(xs[0], xs[1], shape, stream))

FAMILY = (RANDOM_UNIFORM,)
