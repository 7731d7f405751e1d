"""Generated kernels compiled by NVRTC through CuPy, once per source: the cache is keyed by the
source's hash, which is also the kernel's name, so two programs with the same region share it. Compiled
images are kept on disk too (``$CORTADO_CACHE_DIR/kernels``, by default ``~/.cache/cortado/kernels``), keyed by
the source, the options, the GPU's architecture and NVRTC's version, so a second run starts without compiling.

Kernels keep float32 subnormals (``-ftz=false``, NVRTC's default): a product of the smallest normal
and 0.5 is the subnormal NumPy gives, not 0. CuPy's ``RawModule(code=...)`` appends ``-ftz=true``
after the caller's options, which flushes them, so the source is compiled by CuPy's NVRTC call with
the include paths ``RawModule`` would give it, and the image loaded by ``RawModule(path=...)``."""

import functools
import hashlib
import os
import tempfile

from ...errors import BackendError
from .launch import WAIT_PRIOR_GRIDS, Launch

LAUNCHES_KEPT = 4096
_cache = {}


def compiled(source):
    """The loaded kernel function of ``source`` (a ``codegen.Source``), allowed the dynamic shared memory it asks for."""
    key = (source.name, source.options)
    function = _cache.get(key)
    if function is None:
        if WAIT_PRIOR_GRIDS not in source.text:  # launches overlap the kernel before: see launch.py
            raise BackendError(f"generated kernel {source.name} does not wait for the grids before it")
        function = _function(source.text, ("-std=c++17", "-ftz=false") + tuple(source.options), source.name)
        if source.shared:  # the default allows 48 KiB less what the kernel declares itself
            function.max_dynamic_shared_size_bytes = source.shared
        _cache[key] = function
    return function


def _function(text, options, name):
    """Kernel ``name`` of ``text`` compiled by NVRTC for this GPU with ``options`` as given (nothing appended after
    them), or read from the disk cache, loaded (RawModule reads its file when a function is first asked of it). An
    image on disk that does not load is compiled again; where the cache cannot be written, the image goes through a
    temporary file."""
    import cupy
    from cupy._core.core import assemble_cupy_compiler_options
    from cupy.cuda import compiler

    options = assemble_cupy_compiler_options(options)
    arch = compiler._get_arch()
    path = _cached_image_path(text, options, arch)
    if os.path.exists(path):
        try:
            return cupy.RawModule(path=path).get_function(name)
        except cupy.cuda.driver.CUDADriverError:  # damaged (a disk full when it was written): made again
            pass
    image, _ = compiler.compile_using_nvrtc(text, options, arch=arch)
    try:
        _write_atomically(path, image)
        return cupy.RawModule(path=path).get_function(name)
    except OSError:  # no cache to write to (a read-only home, a full disk)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "kernel.cubin")
            with open(path, "wb") as file:
                file.write(image)
            return cupy.RawModule(path=path).get_function(name)


def cache_folder():
    """Where compiled kernel images are kept between runs."""
    root = os.environ.get("CORTADO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "cortado")
    return os.path.join(root, "kernels")


def _cached_image_path(text, options, arch):
    import cupy
    from cupy.cuda import nvrtc

    key = repr((text, tuple(options), arch, nvrtc.getVersion(), cupy.__version__)).encode()
    return os.path.join(cache_folder(), hashlib.sha256(key).hexdigest() + ".cubin")


def _write_atomically(path, image):
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
