"""Generated kernels compiled by NVRTC through CuPy, once per source: the cache is keyed by the
source's hash, which is also the kernel's name, so two programs with the same region share it. Compiled
images are kept on disk too (``$CORTADO_CACHE_DIR/kernels``, by default ``~/.cache/cortado/kernels``), keyed by
the source, the options, the GPU's architecture and NVRTC's version, so a second run starts without compiling.

NVRTC takes up to a second a kernel for the int8 GEMM's (on the H100's host an int8 MLP's first build spent 36 of its
40 s compiling its 40 candidates one by one) and lets go of Python while it works. So a program's kernels are
compiled side by side: ``prepare`` hands a source to a pool of threads as soon as the build knows it, ``compiled``
waits for its image where it is still being made, and ``finish`` waits for all of them, so a kernel NVRTC rejects
still fails the build. That MLP's first build took 28.4 s on one thread and 4.4 s on sixteen
(``benchmarks/bench_compile_gpu.py``, ``benchmarks/results/h100/compile_gpu.json``).

Kernels keep float32 subnormals (``-ftz=false``, NVRTC's default): a product of the smallest normal
and 0.5 is the subnormal NumPy gives, not 0. CuPy's ``RawModule(code=...)`` appends ``-ftz=true``
after the caller's options, which flushes them, so the source is compiled by CuPy's NVRTC call with
the include paths ``RawModule`` would give it, and the image loaded by ``RawModule(path=...)``."""

import concurrent.futures
import functools
import hashlib
import os
import tempfile
import threading

from ...errors import BackendError
from .launch import WAIT_PRIOR_GRIDS, Launch

LAUNCHES_KEPT = 4096
COMPILING_THREADS = 16  # at most, and no more than the machine's processors, unless $CORTADO_COMPILE_THREADS says
_cache = {}  # (name, options) -> the loaded kernel function
_pending = {}  # (name, options) -> (its source, the future of its image: the cached file's path or the image)
_pool = None
_lock = threading.Lock()


def prepare(source):
    """Start compiling ``source`` (a ``codegen.Source``) on the compiling threads, unless its kernel is loaded or on its
    way already: ``compiled`` will wait for it."""
    key = (source.name, source.options)
    with _lock:
        if key in _cache or key in _pending:
            return
        if WAIT_PRIOR_GRIDS not in source.text:  # launches overlap the kernel before: see launch.py
            raise BackendError(f"generated kernel {source.name} does not wait for the grids before it")
        _pending[key] = source, _threads().submit(_image, *_compilation(source))


def compiled(source):
    """The loaded kernel function of ``source`` (a ``codegen.Source``), allowed the dynamic shared memory it asks for."""
    key = (source.name, source.options)
    function = _cache.get(key)
    if function is None:
        prepare(source)
        import cupy

        try:
            path, image = _pending[key][1].result()
        finally:
            with _lock:
                _pending.pop(key, None)
        try:
            function = _loaded(path, image, source.name)
        except cupy.cuda.driver.CUDADriverError:  # an image on disk damaged (a disk full when it was written)
            if path is None:
                raise
            os.unlink(path)
            function = _loaded(*_image(*_compilation(source)), source.name)
        if source.shared:  # the default allows 48 KiB less what the kernel declares itself
            function.max_dynamic_shared_size_bytes = source.shared
        _cache[key] = function
    return function


def finish():
    """Load every kernel still being compiled once its image is made: the first NVRTC rejected raises here."""
    with _lock:
        waiting = [source for source, _ in _pending.values()]
    for source in waiting:
        compiled(source)


def _threads():
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(compiling_threads(), thread_name_prefix="cortado-nvrtc")
    return _pool


def compiling_threads():
    """How many kernels NVRTC compiles at once: ``$CORTADO_COMPILE_THREADS``, or one a processor up to
    ``COMPILING_THREADS`` (each compile holds a few hundred MB while it runs)."""
    given = os.environ.get("CORTADO_COMPILE_THREADS", "")
    if given:
        if not given.isdigit() or int(given) < 1:
            raise BackendError(f"CORTADO_COMPILE_THREADS must be a whole number of threads, 1 or more, not {given!r}")
        return int(given)
    return min(COMPILING_THREADS, os.cpu_count() or 1)


def _forget_threads():
    """In a child forked from a process compiling, its threads are not there: start anew."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()
    _pending.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_threads)


def _compilation(source):
    """NVRTC's text, options (as given: nothing appended after them) and architecture (this thread's GPU's) of
    ``source``."""
    from cupy._core.core import assemble_cupy_compiler_options
    from cupy.cuda import compiler

    options = assemble_cupy_compiler_options(("-std=c++17", "-ftz=false") + tuple(source.options))
    return source.text, options, compiler._get_arch()


def _image(text, options, arch):
    """``(path, None)`` of the image of ``text`` in the disk cache, compiled by NVRTC where it is not there yet, or
    ``(None, image)`` where the cache cannot be written (a read-only home, a full disk). Runs on a compiling thread."""
    from cupy.cuda import compiler

    path = _cached_image_path(text, options, arch)
    if os.path.exists(path):
        return path, None
    image, _ = compiler.compile_using_nvrtc(text, options, arch=arch)
    try:
        write_atomically(path, image)
    except OSError:
        return None, image
    return path, None


def _loaded(path, image, name):
    """Kernel ``name`` loaded from the cached file at ``path`` (RawModule reads its file when a function is first asked
    of it) or from ``image`` through a temporary file."""
    import cupy

    if path is None:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "kernel.cubin")
            with open(path, "wb") as file:
                file.write(image)
            return cupy.RawModule(path=path).get_function(name)
    return cupy.RawModule(path=path).get_function(name)


def cache_folder(kind="kernels"):
    """Where compiled kernel images (``kind`` "kernels") or tuning's choices ("choices") are kept between runs."""
    root = os.environ.get("CORTADO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "cortado")
    return os.path.join(root, kind)


def _cached_image_path(text, options, arch):
    import cupy
    from cupy.cuda import nvrtc

    key = repr((text, tuple(options), arch, nvrtc.getVersion(), cupy.__version__)).encode()
    return os.path.join(cache_folder(), hashlib.sha256(key).hexdigest() + ".cubin")


def write_atomically(path, image):
    """Write ``image`` so that another process never reads half of it: into a file beside ``path``, then renamed (the
    partial file removed where writing fails)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    descriptor, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(image)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def launcher(source, arguments, grid=None, block=None):
    """A call launching ``source``'s kernel over ``arguments`` (pointers, and structures passed by value as bytes) on
    CuPy's current stream (on its own grid and block, or those given), overlapping the kernel before it where the GPU
    can. Calls made again with the same arguments (a library call's kernels, each step it runs without a CUDA graph)
    reuse one ``Launch`` and its driver structures."""
    return _launch(source, tuple(a if isinstance(a, bytes) else int(a) for a in arguments), grid, block)


@functools.lru_cache(maxsize=LAUNCHES_KEPT)
def _launch(source, arguments, grid, block):
    return Launch(compiled(source), source.blocks if grid is None else grid, source.block if block is None else block,
                  arguments, source.shared)
