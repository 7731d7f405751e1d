"""How long a library call takes on the GPU, for choosing among a call's candidates when a program is built.

A short call launched one by one from Python would time the launches, so the calls are replayed as a
CUDA graph, as many as make about ``TIMED_MS`` of work (at most ``TIMED_CALLS``): a large call is then
timed under sustained load, at the clocks a step holds it to (the H200 is power-limited).
"""

import numpy as np

TIMED_CALLS = 20
TIMED_MS = 30.0


def time_graph(call, stream):
    """Milliseconds one ``call()`` takes on ``stream`` (a CuPy stream), replayed in a CUDA graph. The first call
    runs eagerly, so a candidate the library refuses raises before anything is captured."""
    import cupy

    start = stream.record()
    call()
    end = stream.record()
    end.synchronize()
    calls = int(np.clip(TIMED_MS / max(cupy.cuda.get_elapsed_time(start, end), 1e-3), 1, TIMED_CALLS))
    stream.begin_capture()
    try:
        for _ in range(calls):
            call()
    finally:
        graph = stream.end_capture()
    graph.launch(stream)
    start = stream.record()
    graph.launch(stream)
    end = stream.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / calls
