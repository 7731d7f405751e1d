"""The GPU a program is built for: there must be one before anything asks cuBLASLt or NVRTC for help."""

from ...errors import BackendError


def require_gpu():
    """A clear BackendError where CuPy sees no GPU, instead of a failure deep inside a CUDA library."""
    import cupy

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver: no GPU either
        count = 0
    if count < 1:
        raise BackendError("the cupy backend needs an NVIDIA GPU, and none is visible")
