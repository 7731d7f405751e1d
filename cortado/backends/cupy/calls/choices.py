"""The choices tuning makes, remembered by the process and, between processes, on disk.

A call's candidates (cuBLASLt's algorithms, cuDNN's plans, our int8 kernels) are timed when a program is built, and
two candidates within the timing's noise may swap places from one process to the next. They add in other orders, so
one model trained twice would take two paths (a small GPT step's loss after 113 steps was 2.8003 in one process and
2.7419 in another). So a choice is kept beside the compiled kernels (``$CORTADO_CACHE_DIR/choices``, by default
``~/.cache/cortado/choices``), one file for each kind of GPU with its driver and libraries, and a later process takes
it instead of timing again: the same bits in every process on the machine, and a shorter build. Deleting the folder
has them timed again. A choice is stored as what names it among its call's candidates (an algorithm's configuration,
a plan's name, a kernel's description), and a caller takes it only where the candidates it is offered include it.
Where the folder cannot be written (a read-only home, a full disk), the choices last for the process.
"""

import functools
import hashlib
import json
import os

from ..kernels import cache_folder, write_atomically

_remembered = {}  # (kind, the key's text) -> the value, for this process


def recall(kind, key):
    """The value remembered for the call described by ``key`` (its repr is the same in every process) among those of
    ``kind`` ("cublaslt", "cudnn", "int8"): by this process, else on disk; None where there is none."""
    name = (kind, repr(key))
    if name not in _remembered:
        stored = _read(_path()).get(_digest(name))
        if stored is None:
            return None
        _remembered[name] = stored
    return _remembered[name]


def remember(kind, key, value):
    """Keep ``value`` (numbers, strings and lists of them) as the choice for ``key`` among those of ``kind``."""
    name = (kind, repr(key))
    _remembered[name] = json.loads(json.dumps(value))  # as a later process reads it: lists, not tuples
    path = _path()
    entries = _read(path)  # again: another process may have added some since
    entries[_digest(name)] = value
    try:
        write_atomically(path, json.dumps(entries, sort_keys=True).encode())
    except OSError:
        pass


def forget():
    """Forget this process's choices (the ones on disk stay): for tests."""
    _remembered.clear()


def _digest(name):
    return hashlib.sha256(repr(name).encode()).hexdigest()


def _read(path):
    """The entries of the file at ``path``; none where it is missing or unreadable (half written by a process that
    died: ``write_atomically`` renames whole files into place, so only a damaged disk gives one)."""
    try:
        with open(path) as file:
            entries = json.load(file)
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _path():
    import cupy

    return os.path.join(cache_folder("choices"), _machine(cupy.cuda.Device().id) + ".json")


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
