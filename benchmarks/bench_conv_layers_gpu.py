"""Single convolution layers on the GPU, forward and backward: cortado against torch's cuDNN, NCHW and channels_last.

    python benchmarks/bench_conv_layers_gpu.py [--out benchmarks/results/conv_layers_gpu.json]

The layers are the seed's MobileNet 1x1 layers (56x56 64->128, 28x28 128->256, 28x28 256->256) at batch
1 and 32, and a 3x3 64->64 layer (padding 1) on 56x56 at batch 32, in float16 and float32 (TF32 off
everywhere). Forward is ``y = conv2d(x, w)``; backward is the data and weight gradients from a given
output gradient ``dy`` (ours: ``ct.grad(sum(conv2d(x, w) * dy), [x, w])``; torch: one
``aten.convolution_backward``).

Both sides are timed from CUDA-graph replays, so that no Python launch overhead counts: ours replays
the program's own captured step (after its first calls), torch a ``torch.cuda.CUDAGraph`` of the same
work; ``REPLAYS`` replays back to back between two events, the median of ``ROUNDS`` such rounds. Ours
runs with its defaults (``nhwc="auto"``, which keeps a lone layer fed NCHW in NCHW), and also, as torch
channels_last is, with ``channels_last_io=True`` fed channels-last CuPy arrays (``ours_channels_last_us``,
against torch's channels_last time in ``cl/cl``); backward, ``deterministic=False`` too
(``ours_nondeterministic_us``); each layer's call chosen when the program was built is named in the
results (``choice``). Results are checked against torch's before timing.
"""

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cortado as ct  # noqa: E402
from bench_fused_gpu import attempt, log, print_table, require_gpu, versions  # noqa: E402
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

LAYERS = [  # (batch, in channels, out channels, side, kernel)
    (1, 64, 128, 56, 1), (32, 64, 128, 56, 1), (1, 128, 256, 28, 1), (32, 128, 256, 28, 1),
    (1, 256, 256, 28, 1), (32, 256, 256, 28, 1), (32, 64, 64, 56, 3),
]
DTYPES = ("float16", "float32")
REPLAYS, ROUNDS = 50, 5
TOLERANCE = {"float16": 1e-2, "float32": 1e-3}  # max |ours - torch| / max |torch|


def median_us(replay, events):
    """Microseconds one ``replay()`` takes: ``REPLAYS`` back to back between ``events()``, median of ``ROUNDS``."""
    rounds = []
    for _ in range(ROUNDS):
        start, stop = events()
        start()
        for _ in range(REPLAYS):
            replay()
        rounds.append(1e3 * stop() / REPLAYS)
    return statistics.median(rounds)


def arrays(layer, dtype, rng):
    n, c, k, side, r = layer
    return {"x": rng.standard_normal((n, c, side, side)), "w": rng.standard_normal((k, c, r, r)) / np.sqrt(c * r * r),
            "dy": rng.standard_normal((n, k, side, side))}


def ours(layer, dtype, backward, values, **options):
    """Our program for the layer with backend ``options`` (fed CuPy arrays), its results, its replay time and the
    calls it chose."""
    import cupy

    n, c, k, side, r = layer
    x, w = ct.var("x", (n, c, side, side), dtype), ct.var("w", (k, c, r, r), dtype)
    y = ct.conv2d(x, w, padding=r // 2)
    dy = ct.var("dy", y.shape, dtype)
    outputs, inputs = (ct.grad(ct.sum(y * dy), [x, w]), [x, w, dy]) if backward else ([y], [x, w])
    program = ct.compile(outputs, inputs=inputs, backend="cupy", **options)
    feeds = {v.name: cupy.asarray(values[v.name].astype(dtype)) for v in inputs}
    if options.get("channels_last_io"):  # fed as torch's channels_last tensors are: NHWC memory of an NCHW shape
        feeds = {name: cupy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) for name, a in feeds.items()}
    for _ in range(3):  # the third call captures the step's graph
        results = [out.get().astype(np.float64) for out in program(**feeds)]
    graph, stream = next(iter(program._executor.graphs.values())), program._executor.stream

    def events():
        start, end = cupy.cuda.Event(), cupy.cuda.Event()

        def stop():
            end.record(stream)
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end)

        return (lambda: start.record(stream)), stop

    choices = [made.describe() for made in program._executor.choices.values()]
    return results, median_us(lambda: graph.launch(stream), events), choices


def torch_layer(layer, dtype, backward, values, channels_last):
    """torch's results for the layer and the replay time of a CUDA graph of it."""
    import torch

    n, c, k, side, r = layer
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x, w, dy = (torch.tensor(values[name], dtype=getattr(torch, dtype), device="cuda").contiguous(memory_format=layout)
                for name in ("x", "w", "dy"))
    padding = [r // 2] * 2
    if backward:
        def work():
            return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], padding, [1, 1], False, [0, 0], 1,
                                                       [True, True, False])[:2]
    else:
        def work():
            return (torch.nn.functional.conv2d(x, w, padding=padding),)
    side_stream = torch.cuda.Stream()
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):
        for _ in range(3):
            work()
    torch.cuda.current_stream().wait_stream(side_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = work()
    graph.replay()
    results = [t.double().cpu().numpy() for t in captured]

    def events():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def stop():
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        return start.record, stop

    return results, median_us(graph.replay, events)


def run_case(layer, dtype, backward):
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    values = arrays(layer, dtype, np.random.default_rng(0))
    reference, torch_us = torch_layer(layer, dtype, backward, values, channels_last=False)
    _, torch_cl_us = torch_layer(layer, dtype, backward, values, channels_last=True)
    results, us, choices = ours(layer, dtype, backward, values)  # nhwc="auto": a lone layer stays NCHW
    _, last_us, last_choices = ours(layer, dtype, backward, values, channels_last_io=True)
    error = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(results, reference))
    case = {"ours_us": us, "ours_channels_last_us": last_us, "torch_nchw_us": torch_us,
            "torch_channels_last_us": torch_cl_us, "torch_nchw_over_ours": torch_us / us,
            "torch_channels_last_over_ours_channels_last": torch_cl_us / last_us,
            "best_torch_over_best_ours": min(torch_us, torch_cl_us) / min(us, last_us),
            "rel_error": error, "mismatch": not error <= TOLERANCE[dtype], "choice": choices,
            "choice_channels_last": last_choices}
    if backward:  # weight gradients: cuDNN's plans that add partial sums in any order, as torch's default allows
        _, loose_us, loose_choices = ours(layer, dtype, backward, values, deterministic=False)
        case.update(ours_nondeterministic_us=loose_us, torch_nchw_over_nondeterministic=torch_us / loose_us,
                    choice_nondeterministic=loose_choices)
    return case


COLUMNS = [("layer", "layer", "24s"), ("dtype", "dtype", "8s"), ("pass", "pass", "9s"), ("ours us", "ours_us", "9.1f"),
           ("ours cl us", "ours_channels_last_us", "11.1f"), ("nondet us", "ours_nondeterministic_us", "10.1f"),
           ("torch us", "torch_nchw_us", "9.1f"),
           ("torch cl us", "torch_channels_last_us", "12.1f"), ("torch/ours", "torch_nchw_over_ours", "11.2f"),
           ("cl/cl", "torch_channels_last_over_ours_channels_last", "6.2f"),
           ("best/best", "best_torch_over_best_ours", "10.2f"), ("rel err", "rel_error", "9.1e")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "conv_layers_gpu.json"))
    args = parser.parse_args()
    _, gpu = require_gpu()
    cases = []
    for layer in LAYERS:
        n, c, k, side, r = layer
        name = f"b{n} {c}->{k} {side}x{side} {r}x{r}"
        for dtype in DTYPES:
            for backward in (False, True):
                kind = "backward" if backward else "forward"
                case = attempt(f"{name} {dtype} {kind}", run_case, layer, dtype, backward)
                cases.append({"layer": name, "dtype": dtype, "pass": kind, **case,
                              "note": "MISMATCH" if case.get("mismatch") else case.get("error", "")[:60]})
    write_results({"benchmark": "conv_layers_gpu", "machine": {**describe(), "gpu": gpu}, "versions": versions("torch"),
                   "replays": REPLAYS, "rounds": ROUNDS, "cases": cases,
                   "notes": {"ours": "ct.compile(..., backend='cupy') with its defaults: the replay of its captured "
                                     "step; ours_channels_last_us with channels_last_io=True, fed channels-last "
                                     "CuPy arrays, ours_nondeterministic_us with deterministic=False",
                             "torch": "a torch.cuda.CUDAGraph of F.conv2d (forward) or "
                                     "aten.convolution_backward (backward), NCHW and channels_last; TF32 off",
                             "ratios": "torch's time over ours: above 1, ours is faster; best: torch's faster layout"}},
                  args.out)
    print_table(cases, COLUMNS)
    for case in cases:
        log(f"{case['layer']} {case['dtype']} {case['pass']}: {case.get('choice')}; channels last: "
            f"{case.get('choice_channels_last')}")


if __name__ == "__main__":
    main()
