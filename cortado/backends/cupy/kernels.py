"""Generated kernels compiled by NVRTC through CuPy, once per source: the cache is keyed by the
source's hash, which is also the kernel's name, so two programs with the same region share it."""

_cache = {}


def compiled(source):
    """The loaded kernel function of ``source`` (a ``codegen.Source``)."""
    function = _cache.get(source.name)
    if function is None:
        import cupy

        module = cupy.RawModule(code=source.text, options=("-std=c++17",))
        function = _cache[source.name] = module.get_function(source.name)
    return function
