"""Generated kernels compiled by NVRTC through CuPy, once per source: the cache is keyed by the
source's hash, which is also the kernel's name, so two programs with the same region share it.

Kernels keep float32 subnormals (``-ftz=false``, NVRTC's default): a product of the smallest normal
and 0.5 is the subnormal NumPy gives, not 0. CuPy's ``RawModule(code=...)`` appends ``-ftz=true``
after the caller's options, which flushes them, so the source is compiled by CuPy's NVRTC call with
the include paths ``RawModule`` would give it, and the image loaded by ``RawModule(path=...)``."""

import functools
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
    them), loaded (RawModule loads its file when a function is first asked of it: before the file goes)."""
    import cupy
    from cupy._core.core import assemble_cupy_compiler_options
    from cupy.cuda import compiler

    image, _ = compiler.compile_using_nvrtc(text, assemble_cupy_compiler_options(options), arch=compiler._get_arch())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(image)
        return cupy.RawModule(path=path).get_function(name)


def launcher(source, pointers, grid=None, block=None):
    """A call launching ``source``'s kernel over ``pointers`` on CuPy's current stream (on its own grid and block, or
    those given), overlapping the kernel before it where the GPU can. Calls made again with the same pointers (a
    library call's kernels, each step it runs without a CUDA graph) reuse one ``Launch`` and its driver structures."""
    return _launch(source, tuple(int(p) for p in pointers), grid, block)


@functools.lru_cache(maxsize=LAUNCHES_KEPT)
def _launch(source, pointers, grid, block):
    return Launch(compiled(source), source.blocks if grid is None else grid, source.block if block is None else block,
                  pointers, source.shared)
