"""Library calls tuned when a program is built: each runner's candidates (cuBLASLt's algorithms, cuDNN's plans, the
int8 kernels) timed on standard normal values in the program's own buffers, since tensor cores draw more power on
random values than on zeros, and may run slower."""

import numpy as np


def tune(tuned, blocks, pointers, stream):
    """Fill ``blocks`` with standard normal values of the first runner's dtype, then let each of ``tuned``
    (``(runner, its workspace address)`` pairs) choose, at ``pointers``, on ``stream``."""
    import cupy

    dtype = tuned[0][0].dtype
    for block in blocks:
        count = block.nbytes // dtype.itemsize
        values = cupy.random.standard_normal(count, np.float64 if dtype == np.float64 else np.float32)
        cupy.ndarray((count,), dtype, memptr=block.memory.data)[...] = values.astype(dtype)
    cupy.cuda.Device().synchronize()
    with stream:  # the current stream, where a call's own kernels launch
        for made, workspace in tuned:
            made.tune([pointers[v] for v in made.values], workspace, stream)
