"""The choices tuning makes, remembered by the process and, between processes, on disk.

A call's candidates (cuBLASLt's algorithms, cuDNN's plans, our int8 kernels) are timed when a program is built, and
two candidates within the timing's noise may swap places from one process to the next. They add in other orders, so
one model trained twice would take two paths (a small GPT step's loss after 113 steps was 2.8003 in one process and
2.7419 in another). So a choice is kept beside the compiled kernels (``$CORTADO_CHOICES_DIR``, by default
``$CORTADO_CACHE_DIR/choices`` or ``~/.cache/cortado/choices``), in a folder for each kind of GPU with its driver
and libraries, one small file a choice (written whole and renamed into place, so processes tuning side by side
never read half of one or lose another's), and a later process takes it instead of timing again: the same bits in
every later process on the machine, and a shorter build. Deleting the folder has them timed again. A choice is
stored as what names it among its call's candidates (an algorithm's configuration, a plan's name, a kernel's index
under a key naming every candidate), and a caller takes it only where the candidates it is offered include it.
Where the folder cannot be written (a read-only home, a full disk), the choices last for the process.
"""

import functools
import hashlib
import json
import os

from ..kernels import cache_folder, write_atomically

_remembered = {}  # (kind, key) -> the value, for this process: keys equal as values, as np.float32(0.5) and 0.5


def recall(kind, key):
    """The value remembered for the call described by ``key`` (its repr is the same in every process) among those of
    ``kind`` ("cublaslt", "cudnn", "int8"): by this process, else on disk; None where there is none. The caller checks
    it is one of the call's candidates."""
    if (kind, key) not in _remembered:
        stored = _read(_path(kind, key))
        if stored is None:
            return None
        _remembered[kind, key] = stored
    return _remembered[kind, key]


def remember(kind, key, value):
    """Keep ``value`` (numbers, strings, and lists and dicts of them) as the choice for ``key`` among those of
    ``kind``, for this process and in its own file."""
    _remembered[kind, key] = json.loads(json.dumps(value))  # as a later process reads it: lists, not tuples
    try:
        write_atomically(_path(kind, key), json.dumps(value).encode())
    except OSError:
        pass


def forget():
    """Forget this process's choices (the ones on disk stay): for tests."""
    _remembered.clear()


def folder():
    """Where the choices of this process's GPU are kept: ``$CORTADO_CHOICES_DIR``, else the cache's ``choices``."""
    import cupy

    root = os.environ.get("CORTADO_CHOICES_DIR") or cache_folder("choices")
    return os.path.join(root, _machine(cupy.cuda.Device().id))


def _path(kind, key):
    return os.path.join(folder(), hashlib.sha256(repr((kind, repr(key))).encode()).hexdigest() + ".json")


def _read(path):
    """The value in the file at ``path``; None where it is missing or unreadable (``write_atomically`` renames whole
    files into place, so only a damaged disk gives a half-written one)."""
    try:
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


@functools.cache
def _machine(device_id):
    """A name for what decides device ``device_id``'s candidates and their times: the GPU (its name, architecture
    and multiprocessors), the driver, the CUDA runtime, and the versions of CuPy, cuBLASLt and cuDNN."""
    import cupy

    device = cupy.cuda.Device(device_id)
    name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
    described = [name.decode() if isinstance(name, bytes) else name, device.compute_capability,
                 device.attributes["MultiProcessorCount"], cupy.cuda.runtime.driverGetVersion(),
                 cupy.cuda.runtime.runtimeGetVersion(), cupy.__version__, _cublaslt_version(), _cudnn_version()]
    return hashlib.sha256(repr(described).encode()).hexdigest()[:32]


def _cublaslt_version():
    import nvmath.bindings.cublasLt as lt

    return lt.get_version()


def _cudnn_version():
    """cuDNN's version, or None where its frontend is not installed (a program without convolutions or attention)."""
    try:
        import cudnn
    except (ImportError, OSError):  # OSError: the frontend is there, its library is not
        return None
    return cudnn.backend_version()
