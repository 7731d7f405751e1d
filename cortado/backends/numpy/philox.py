"""``random_uniform`` on the CPU in C: Philox-4x32-10 of each element's counter, its first word's top 24 bits scaled
by 2^-24, written into the output where it lies (``exprgraph.ops.random`` defines the numbers, and its NumPy version,
which the reference runs, makes ten rounds of arrays of uint64 temporaries: on the 2-core development machine 121 us
for 64x64 numbers against 23 here, and an MLP step with one dropout took 148 us against 46,
``benchmarks/results/cpu/experiments/philox/``). The same bits: integer arithmetic, and a 24-bit integer times a
power of two is exact in float32. Where no C compiler builds it, the NumPy version runs."""

import ctypes
import functools

import numpy as np

from ...exprgraph.ops.random import MULTIPLIERS, ROUNDS, SCALE, WEYL
from . import native

SOURCE = f"""#include <stdint.h>
void ct_philox_uniform(float* out, int64_t n, uint32_t seed, uint32_t counter, uint32_t stream) {{
  for (int64_t i = 0; i < n; ++i) {{
    uint32_t c0 = (uint32_t)i, c1 = (uint32_t)((uint64_t)i >> 32), c2 = stream, c3 = 0, k0 = seed, k1 = counter;
    for (int r = 0; r < {ROUNDS}; ++r) {{
      if (r) {{ k0 += {WEYL[0]}u; k1 += {WEYL[1]}u; }}
      uint64_t p0 = (uint64_t){MULTIPLIERS[0]}u * c0, p1 = (uint64_t){MULTIPLIERS[1]}u * c2;
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
      c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    }}
    out[i] = (float)(c0 >> 8) * {float(SCALE)!r}f;
  }}
}}
"""


@functools.cache
def _function():
    """The C function, built once (then found in the disk cache); None where it does not build."""
    if native.toolchain() is None:
        return None
    try:
        function = native.load(SOURCE).ct_philox_uniform
    except (OSError, RuntimeError):
        return None
    function.restype = None
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32]
    return function


def uniform_into(out, seed, counter, stream):
    """Write ``random_uniform(seed, counter, out.shape, stream)`` into ``out`` (float32, C order) in C; False where it
    cannot (no compiler, another layout), for the caller to compute it otherwise."""
    function = _function()
    if function is None or out.dtype != np.float32 or not out.flags.c_contiguous:
        return False
    key = [int(np.asarray(k).astype(np.uint32)) for k in (seed, counter)]  # modulo 2^32, as the definition casts
    function(out.ctypes.data, out.size, key[0], key[1], stream)
    return True
