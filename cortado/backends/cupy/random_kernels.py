"""CUDA C for ``random_uniform``: one thread per element (``window_kernels.gather``), each running Philox-4x32-10 on
its flat index under the key its two operands hold, with the constants ``exprgraph.ops.random`` defines, so the GPU
draws the numbers the reference draws, bit for bit."""

from ...exprgraph.ops.random import MULTIPLIERS, ROUNDS, SCALE, WEYL
from .window_kernels import gather


def random_source(seed, counter, out, stream):
    """``out`` (float32, written in C order) = the uniform numbers of stream ``stream`` under the key
    ``(in0[0], in1[0])``, each key word its operand's integer value taken modulo 2^32, as the reference takes it."""
    m0, m1 = MULTIPLIERS
    w0, w1 = WEYL
    # the words are x0..x3 (the coordinates c0, c1, ... are gather's)
    statements = [
        "    unsigned int x0 = (unsigned int)i, x1 = (unsigned int)((unsigned long long)i >> 32), x3 = 0u;",
        f"    unsigned int x2 = {int(stream)}u;",
        "    unsigned int k0 = (unsigned int)in0[0], k1 = (unsigned int)in1[0];",
        "    #pragma unroll",
        f"    for (int round = 0; round < {ROUNDS}; ++round) {{",
        f"      if (round) {{ k0 += {w0:#x}u; k1 += {w1:#x}u; }}",
        f"      const unsigned int h0 = __umulhi({m0:#x}u, x0), l0 = {m0:#x}u * x0;",
        f"      const unsigned int h1 = __umulhi({m1:#x}u, x2), l1 = {m1:#x}u * x2;",
        "      x0 = h1 ^ x1 ^ k0; x1 = l1; x2 = h0 ^ x3 ^ k1; x3 = l0;",
        "    }",
        f"    out0[i] = (float)(x0 >> 8) * (1.0f / {round(1 / SCALE)}.0f);",
    ]
    return gather("random_uniform", [seed, counter], out, statements)
