"""Launches of generated kernels that overlap the kernel before them: programmatic dependent launch (sm_90 on).

A kernel on a stream normally starts only once the one before it has ended and its writes are flushed. Launched
with the programmatic-stream-serialization attribute, its blocks are scheduled while the kernel before it ends, and
each first waits (``griddepcontrol.wait``, the ``ct_wait_prior_grids()`` every generated kernel calls before it
touches a value some kernel writes; an int8 GEMM reads its constant operands before, ``calls/int8/staging.prologue``) until
that kernel's grid has finished and its writes are visible. Reads and writes keep their order; the launch latency
overlaps: on the H100, 0.25-0.3 us of each kernel of a CUDA graph (an empty kernel went from 0.79 to 0.51 us, a
512x64x512 int8 product from 2.54 to 2.26). Library kernels (cuBLASLt, cuDNN) are launched as they are.

CuPy's launch cannot set launch attributes, so these launches call the driver's ``cuLaunchKernelEx`` through
ctypes; where there is no such driver entry or the GPU is older than sm_90, CuPy launches them plainly.
"""

import ctypes
import functools

import numpy as np

from ...errors import BackendError

WAIT_PRIOR_GRIDS = "ct_wait_prior_grids();"  # what every generated kernel runs before touching what kernels write
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
_OVERLAPPING_ARCHITECTURE = 90


class _Attribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_ubyte * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attributes", ctypes.POINTER(_Attribute)), ("count", ctypes.c_uint)]


@functools.cache
def driver():
    """The CUDA driver library with ``cuLaunchKernelEx`` typed, or None where it has none (the launches here need
    it; other entries are typed where they are used)."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
        entry = library.cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    entry.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    library.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return library


@functools.cache
def _overlaps(device):
    import cupy

    architecture = int(cupy.cuda.Device(device).compute_capability)
    return architecture >= _OVERLAPPING_ARCHITECTURE and driver() is not None


def overlapping():
    """Whether kernels launched here on the current GPU overlap the kernel before them."""
    import cupy

    return _overlaps(cupy.cuda.Device().id)


def _dimensions(value):
    value = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return tuple(int(v) for v in value) + (1,) * (3 - len(value))


class Launch:
    """One launch of a loaded kernel (a CuPy ``RawKernel``) over its arguments, ready to repeat on CuPy's current
    stream: its driver structures are built once. An argument is a pointer (an int) or a structure passed by value
    (its bytes: a tensor map), which only the driver's launch passes."""

    def __init__(self, function, grid, block, arguments, shared=0):
        self.function, self.grid, self.block, self.shared = function, _dimensions(grid), _dimensions(block), shared
        self.arguments = tuple(a if isinstance(a, bytes) else int(a) for a in arguments)
        self.config = None
        if not overlapping():
            if any(isinstance(a, bytes) for a in self.arguments):
                raise BackendError("a kernel taking a structure by value needs the CUDA driver's cuLaunchKernelEx")
            return
        values = [a if isinstance(a, bytes) else a.to_bytes(8, "little") for a in self.arguments]
        # one after another, each at a multiple of 64 bytes (a tensor map's alignment)
        offsets = [64 * sum(-(-len(v) // 64) for v in values[:i]) for i in range(len(values) + 1)]
        self.storage = ctypes.create_string_buffer(offsets[-1] + 64)
        base = -(-ctypes.addressof(self.storage) // 64) * 64
        for value, offset in zip(values, offsets):
            ctypes.memmove(base + offset, value, len(value))
        self.parameters = (ctypes.c_void_p * len(values))(*(base + offset for offset in offsets[:-1]))
        self.attribute = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attribute.value[0] = 1
        self.config = _Config(self.grid, self.block, shared, None, ctypes.pointer(self.attribute), 1)

    def __call__(self):
        import cupy

        if self.config is None:
            self.function(self.grid, self.block, tuple(np.uint64(p) for p in self.arguments), shared_mem=self.shared)
            return
        self.config.stream = cupy.cuda.get_current_stream().ptr
        library = driver()
        result = library.cuLaunchKernelEx(ctypes.byref(self.config), self.function.kernel.ptr, self.parameters, None)
        if result:
            name = ctypes.c_char_p()
            library.cuGetErrorName(result, ctypes.byref(name))
            raise BackendError(f"launching a generated kernel failed: {(name.value or b'?').decode()} "
                               f"(grid {self.grid}, block {self.block}, {self.shared} bytes of shared memory)")
