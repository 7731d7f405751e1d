"""Generated kernels compiled by NVRTC through CuPy, once per source: the cache is keyed by the
source's hash, which is also the kernel's name, so two programs with the same region share it."""

_cache = {}


def compiled(source):
    """The loaded kernel function of ``source`` (a ``codegen.Source``), allowed the dynamic shared memory it asks for."""
    key = (source.name, source.options)
    function = _cache.get(key)
    if function is None:
        import cupy

        module = cupy.RawModule(code=source.text, options=("-std=c++17",) + tuple(source.options))
        function = module.get_function(source.name)
        if source.shared:  # the default allows 48 KiB less what the kernel declares itself
            function.max_dynamic_shared_size_bytes = source.shared
        _cache[key] = function
    return function
