"""int8 GEMMs and a quantized MLP on the GPU: cortado's int8 kernels against cuBLASLt int8, torch._int_mm and
cuBLASLt float16; the int8 MLP's inference step against its bfloat16 and float32 programs.

    python benchmarks/bench_int8_gpu.py [--repeats 7] [--out benchmarks/results/int8_gpu.json]

GEMMs, ``M x N x K`` (the seed's 512x{64,32,16}x512, MobileNet's 1x1 layers as GEMMs, 4096^3, and two layers of
the MLP below): int8
``A`` (M x K) times int8 ``B`` (K x N, stored N x K, K contiguous: the layout the tensor cores and
cuBLASLt's int8 kernels read) into int32 sums; float16 into float16.

- cortado: the call a program makes for ``matmul(cast(a, int32), cast(b, int32))`` (``Int8Gemm`` of the
  product's ``Int8Call``, tuned as a program tunes it), ``b`` a constant of the program as a quantized layer's
  weights are (so its tiles are read before the kernel waits for the one before it,
  ``cortado/backends/cupy/calls/int8/staging.py``), ``a`` an input: the call it chose (our kernel or cuBLASLt's,
  timed when it is built), replayed; and apart, the fastest of our own kernels among the candidates it timed
  ("own kernel"). On sm_90 our kernels are launched to overlap the kernel before them (programmatic dependent
  launch, ``cortado/backends/cupy/launch.py``), in a model's step as here; the fastest is also timed launched
  plainly, as CuPy launches ("own, plain launch"), unless it is the warp-specialised kernel, which only the
  driver's launch can give its tensor maps.
- cuBLASLt int8: nvmath's bindings, int32 sums, each of its first 3 heuristic algorithms, the fastest.
- torch._int_mm: PyTorch's int8 product (cuBLASLt underneath), int32 sums.
- cuBLASLt float16: cortado's ``gemm`` call of the same shape in float16 (cuBLASLt, its algorithm timed as
  a program's is), which is what a float16 model would run.

Each is captured ``calls`` times in one CUDA graph on one stream; the graph is replayed ``--repeats``
times between CuPy events and the median time per call is kept (a kernel of 3 us is mostly launch
latency, which replays in a graph amortise as a program's step does). Every contestant's result is
checked against NumPy's integer product first. The products of 2^30 multiply-adds or more hold a card at its power
limit, where its clocks fall as it heats: on the H100 the same cuBLASLt kernel at 4096^3 measured 15% apart timed
first and timed after the others. So each contestant is first made ready (built, tuned, its fastest variant
chosen), then all are timed in turns, ``TURNS`` rounds in an order rotated each round, and each one's median round
is kept.

A quantized layer's product, ``REQUANTIZED`` shapes: the int32 sums times a per-column scale, plus a bias, a relu,
requantized to int8, as one call: ours as a program builds and tunes it (its choice, and the fastest of its own
kernels, which compute the epilogue as they store), against cuBLASLt's int8 GEMM into int32 sums followed by the
epilogue as a kernel over them (the fastest of its algorithms), each checked against NumPy's float32 formula bit for
bit, timed in turns as above.

The quantized MLP (784-1024-1024-10, relu) at batch 128, 512 and 2048: int8 activations and weights
(per-output-channel scales, requantized to int8 between layers in the gemm's epilogue), against the same
MLP's float32 and bfloat16 programs (cuBLASLt GEMMs with bias and relu epilogues). A step's CUDA graph is
launched ``steps`` times back to back and the device time per step is kept.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, log, print_table, require_gpu, versions  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, write_results  # noqa: E402

import cortado as ct  # noqa: E402
from cortado.exprgraph.dtypes import BFLOAT16  # noqa: E402

SHAPES = [(512, 64, 512), (512, 32, 512), (512, 16, 512), (3136, 128, 64), (784, 256, 128), (784, 256, 256),
          (4096, 4096, 4096), (512, 1024, 784), (2048, 1024, 1024)]
REQUANTIZED = [(4096, 4096, 4096), (2048, 1024, 1024)]
MLP_SIZES = (784, 1024, 1024, 10)
MLP_BATCHES = (128, 512, 2048)
LARGE = 1 << 30  # multiply-adds from which a product is timed in turns with the others, as few calls a graph
TURNS = 3


def replayed(call, repeats, calls):
    """Median milliseconds of one ``call()`` (launching on CuPy's current stream), ``calls`` of them captured in
    one graph, the graph replayed ``repeats`` times."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    call()
    stream.begin_capture()
    for _ in range(calls):
        call()
    graph = stream.end_capture()
    graph.launch(stream)
    times = []
    for _ in range(repeats):
        start = stream.record()
        graph.launch(stream)
        end = stream.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return float(np.median(times))


def _calls(m, n, k):
    return 20 if m * n * k >= LARGE else 200


def _operands(cupy, m, n, k):
    a = cupy.random.randint(-128, 128, (m, k)).astype(cupy.int8)
    b_stored = cupy.random.randint(-128, 128, (n, k)).astype(cupy.int8)  # B is its transpose
    return a, b_stored


def _check(name, result, expected):
    if expected is not None and not bool((result == expected).all()):
        raise AssertionError(f"{name}: its int32 sums differ from NumPy's")


def ours(m, n, k, repeats, operands, expected):
    """Our int8 call, as a program builds it (``Int8Gemm`` of the product's description, ``b`` a constant) and
    tunes it: timers of the call it chose (``ms``), of the fastest of our own kernels among its candidates as its
    tuning timed them (``kernel_ms``), and of that kernel launched plainly."""
    import cupy

    from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm
    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.kernels import compiled
    from cortado.exprgraph.ops import parameter

    a, b_stored = operands
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    call = Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)), sums,
                    (), (n, 1), constant_b=True)
    runner = Int8Gemm(call)
    scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
    result = cupy.empty((m, n), np.int32)
    stream = cupy.cuda.Stream(non_blocking=True)

    def pointers():  # of the buffers, which the timers hold alive by calling this
        return a.data.ptr, b_stored.data.ptr, (), result.data.ptr, scratch.data.ptr

    with stream:
        runner.tune(pointers(), stream)

    def time(candidate):
        with stream:
            ms = replayed(lambda: candidate.call(*pointers(), stream.ptr), repeats, _calls(m, n, k))
        _check(f"cortado ({candidate.describe()})", result, expected)
        return ms

    def plainly(candidate):
        """``candidate`` launched as CuPy launches, not overlapping the kernel before it (not the warp-specialised
        kernel, whose tensor maps, structures passed by value, CuPy's launch cannot pass)."""
        source = candidate.source
        args = tuple(np.uint64(p) for p in (a.data.ptr, b_stored.data.ptr, result.data.ptr, scratch.data.ptr,
                                             candidate.counters.data.ptr))
        with stream:
            return replayed(lambda: compiled(source)(source.blocks, source.block, args, shared_mem=source.shared),
                            repeats, _calls(m, n, k))

    own = fastest(runner, own=True)
    timers = {"ms": lambda: time(runner), "kernel_ms": lambda: time(own)}
    if own.tiling.instruction != "tma":
        timers["kernel_plain_launch_ms"] = lambda: plainly(own)
    return {"choice": runner.describe(), "kernel": own.describe(), "timers": timers}


def fastest(runner, own):
    """Of ``runner``'s candidates, our own kernels' (``own``) or cuBLASLt's, the one its tuning timed fastest: what
    the program would keep among them (timed alone once more, a large product's kernels change places: on the H200
    at 4096^3 the clocks of a short replay and of a long one differ)."""
    from cortado.backends.cupy.calls.int8.runner import _Kernel

    timed = [(t, i) for i, (c, t) in enumerate(zip(runner.candidates, runner.times)) if isinstance(c, _Kernel) == own]
    return runner.candidates[min(timed)[1]]


def cublaslt_int8(m, n, k, repeats, operands, expected):
    """nvmath's cuBLASLt int8 GEMM: a timer of the fastest of its first heuristic algorithms, each replayed once to
    find it."""
    import cupy

    from cortado.backends.cupy.codegen import Operand
    from cortado.backends.cupy.calls.int8.runner import LIBRARY_WORKSPACE, _Library
    from cortado.backends.cupy.calls.int8.product import Product
    from cortado.exprgraph.ops import parameter

    a, b_stored = operands
    product = Product(m, n, k, (k, 1), (1, k), np.dtype(np.int8), np.dtype(np.int8), True, True)
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    first = _Library(product, sums, [], (n, 1), None, 0)
    out = cupy.empty((m, n), np.int32)
    workspace = cupy.empty(LIBRARY_WORKSPACE, np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def time(library):
        with stream:
            ms = replayed(lambda: library.call(a.data.ptr, b_stored.data.ptr, (), out.data.ptr, workspace.data.ptr,
                                               stream.ptr), repeats, _calls(m, n, k))
        _check("cuBLASLt int8", out, expected)
        return ms

    times = {}
    for choice in range(len(first.algorithms)):
        library = _Library(product, sums, [], (n, 1), first.algorithms, choice)
        try:
            times[library] = time(library)
        except Exception as error:  # an algorithm the heuristic offered may refuse at run time
            log(f"cuBLASLt int8 algorithm {choice}: {type(error).__name__}")
    best = min(times, key=times.get)
    return {"algorithm": best.choice, "timers": {"ms": lambda: time(best)}}


def torch_int_mm(m, n, k, repeats, operands, expected):
    import cupy
    import torch

    a, b_stored = (torch.as_tensor(x, device="cuda") for x in operands)
    stream = cupy.cuda.Stream(non_blocking=True)
    holder = {}

    def time():
        with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
            ms = replayed(lambda: holder.__setitem__("out", torch._int_mm(a, b_stored.t())), repeats, _calls(m, n, k))
            stream.synchronize()
        _check("torch._int_mm", cupy.asarray(holder["out"]), expected)
        return ms

    return {"timers": {"ms": time}}


def float_gemm(a, b_stored, dtype, repeats, calls):
    """A timer of ``a @ b_stored^T`` in ``dtype`` (float16, bfloat16: ``a`` and ``b_stored`` hold its bytes) as a
    program calls cuBLASLt: its algorithm timed among the heuristic's first choices, then replayed."""
    import cupy

    from cortado.backends.cupy.calls.cublaslt import Gemm, GemmCall
    from cortado.backends.cupy.codegen import Operand

    (m, k), n = a.shape, b_stored.shape[0]
    gemm = Gemm(GemmCall.product(Operand((m, k), dtype, (k, 1)), Operand((n, k), dtype, (k, 1)), transpose_b=True))
    out = cupy.empty((m, n), np.uint16)
    workspace = cupy.empty(max(gemm.workspace_bytes, 1), np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def pointers():  # of the buffers, which the timer holds alive by calling this
        return a.data.ptr, b_stored.data.ptr, out.data.ptr, out.data.ptr, workspace.data.ptr, None, None

    with stream:
        gemm.tune(pointers(), stream)

    def time():
        with stream:
            return replayed(lambda: gemm.call(*pointers(), stream.ptr), repeats, calls)

    return time


def cublaslt_float16(m, n, k, repeats, operands, expected):
    """The float16 product as a program calls cuBLASLt."""
    a, b_stored = (x.astype(np.float16) for x in operands)
    return {"timers": {"ms": float_gemm(a, b_stored, np.dtype(np.float16), repeats, _calls(m, n, k))}}


def in_turns(row, rounds):
    """Each timer of the row's contestants called ``rounds`` times, every one once a round in an order rotated from
    round to round (so none gains from running first on a cool card); each one's median kept in its place, and with
    more than one round the rounds beside it. A timer that fails records its error and runs no more."""
    timers = [(name, key, timer) for name, result in row.items() if isinstance(result, dict)
              for key, timer in result.pop("timers", {}).items()]
    times = {(name, key): [] for name, key, _ in timers}
    for turn in range(rounds if timers else 0):
        for name, key, timer in timers[turn % len(timers):] + timers[:turn % len(timers)]:
            if "error" in row[name] or (name, key) not in times:
                continue
            result = attempt(f"{row['shape']} {name} {key} (round {turn + 1})", lambda timer=timer: {"ms": timer()})
            if "error" in result:
                row[name].setdefault("error", result["error"])
                del times[name, key]
            else:
                times[name, key].append(result["ms"])
    for (name, key), values in times.items():
        if values:
            row[name][key] = float(np.median(values))
            if rounds > 1:
                row[name][key.replace("ms", "rounds_ms")] = values


def gemm_rows(repeats):
    cupy, _ = require_gpu()
    rows = []
    for m, n, k in SHAPES:
        operands = _operands(cupy, m, n, k)
        expected = None
        if m * n * k <= 1 << 28:  # NumPy's exact product, in float64 on the GPU (exact below 2^53)
            expected = (operands[0].astype(cupy.float64) @ operands[1].T.astype(cupy.float64)).astype(cupy.int32)
        row = {"shape": f"{m}x{n}x{k}"}
        for name, contestant in (("cortado", ours), ("cublaslt_int8", cublaslt_int8), ("torch_int_mm", torch_int_mm),
                                 ("cublaslt_f16", cublaslt_float16)):
            row[name] = attempt(f"{m}x{n}x{k} {name}", contestant, m, n, k, repeats, operands, expected)
        in_turns(row, TURNS if m * n * k >= LARGE else 1)
        ms = {name: row[name].get("ms") for name in ("cortado", "cublaslt_int8", "torch_int_mm", "cublaslt_f16")}
        own = row["cortado"].get("kernel_ms")
        for peer in ("cublaslt_int8", "torch_int_mm", "cublaslt_f16"):
            if ms[peer] and ms["cortado"]:
                row[f"over_{peer}"] = ms[peer] / ms["cortado"]
            if ms[peer] and own:
                row[f"own_over_{peer}"] = ms[peer] / own
        rows.append(row)
    return rows


# -- a quantized layer's product, requantized in its epilogue ----------------------------------


def requantized(m, n, k, repeats, operands):
    """Timers of the requantized product's call as a program tunes it (``ms``), of the fastest of our own kernels
    among its candidates (``kernel_ms``) and of the fastest cuBLASLt int8 GEMM followed by the epilogue kernel
    (``library_ms``), as its tuning timed them; every one's int8 results checked against NumPy's formula."""
    import cupy

    from cortado.backends.cupy.calls.int8.runner import Int8Call, Int8Gemm
    from cortado.backends.cupy.codegen import Operand
    from cortado.exprgraph.ops import parameter

    a, b_stored = operands
    rng = np.random.default_rng(1)
    scale = cupy.asarray((rng.random(n) * 1e-4 + 1e-6).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(n).astype(np.float32))
    sums = parameter(0, Operand((m, n), np.dtype(np.int32), (n, 1)))
    extras = (Operand((n,), np.dtype(np.float32), (1,)),) * 2
    y = ct.relu(ct.cast(sums, "float32") * parameter(1, extras[0]) + parameter(2, extras[1]))
    body = ct.cast(ct.minimum(ct.maximum(ct.rint(y * np.float32(1 / 0.05)) - 7.0, -128.0), 127.0), "int8")
    exact = (a.astype(cupy.float64) @ b_stored.T.astype(cupy.float64)).astype(cupy.int32)
    levels = cupy.rint(cupy.maximum(exact.astype(cupy.float32) * scale + bias, np.float32(0)) * np.float32(1 / 0.05))
    expected = cupy.clip(levels - np.float32(7), -128, 127).astype(cupy.int8)
    del exact, levels
    runner = Int8Gemm(Int8Call(Operand((m, k), np.dtype(np.int8), (k, 1)), Operand((k, n), np.dtype(np.int8), (1, k)),
                               body, extras, (n, 1), constant_b=True))
    scratch = cupy.zeros(max(runner.workspace_bytes, 1), np.uint8)
    result = cupy.empty((m, n), np.int8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def pointers():  # of the buffers, which the timers hold alive by calling this
        return a.data.ptr, b_stored.data.ptr, (scale.data.ptr, bias.data.ptr), result.data.ptr, scratch.data.ptr

    with stream:
        runner.tune(pointers(), stream)

    def time(candidate):
        with stream:
            ms = replayed(lambda: candidate.call(*pointers(), stream.ptr), repeats, _calls(m, n, k))
        if not bool((result == expected).all()):
            raise AssertionError(f"cortado ({candidate.describe()}): its requantized results differ from NumPy's")
        return ms

    own, library = fastest(runner, own=True), fastest(runner, own=False)
    return {"choice": runner.describe(), "kernel": own.describe(), "library": library.describe(),
            "timers": {"ms": lambda: time(runner), "kernel_ms": lambda: time(own), "library_ms": lambda: time(library)}}


def requantized_rows(repeats):
    cupy, _ = require_gpu()
    rows = []
    for m, n, k in REQUANTIZED:
        row = {"shape": f"{m}x{n}x{k}"}
        row["cortado"] = attempt(f"{m}x{n}x{k} requantized", requantized, m, n, k, repeats, _operands(cupy, m, n, k))
        in_turns(row, TURNS)
        result = row["cortado"]
        if result.get("ms") and result.get("library_ms"):
            row["over_library"] = result["library_ms"] / result["ms"]
            row["own_over_library"] = result["library_ms"] / result["kernel_ms"]
        rows.append(row)
    return rows


# -- the quantized MLP -------------------------------------------------------------------------


def _mlp_weights(rng):
    return [((rng.standard_normal((i, o)) * np.sqrt(2 / i)).astype(np.float32),
             (rng.standard_normal(o) * 0.1).astype(np.float32)) for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:])]


def _float_program(batch, weights, dtype):
    x = ct.var("x", (batch, MLP_SIZES[0]), dtype)
    h = x
    for k, (w, b) in enumerate(weights):
        h = ct.matmul(h, ct.cast(ct.const(w), dtype)) + ct.cast(ct.const(b), dtype)
        if k < len(weights) - 1:
            h = ct.relu(h)
    return ct.compile([h], inputs=[x], backend="cupy")


def _int8_program(batch, weights, scales):
    """int8 in, int8 between layers (requantized in each gemm's epilogue), float32 logits out."""
    x = ct.var("x", (batch, MLP_SIZES[0]), "int8")
    q = x
    for k, ((w, b), scale_in) in enumerate(zip(weights, scales)):
        scale_w = np.abs(w).max(axis=0) / 127
        qw = np.clip(np.rint(w / scale_w), -127, 127).astype(np.int8)
        sums = ct.matmul(ct.cast(q, "int32"), ct.cast(ct.const(qw), "int32"))
        h = ct.cast(sums, "float32") * (scale_in * scale_w).astype(np.float32) + b
        if k == len(weights) - 1:
            return ct.compile([h], inputs=[x], backend="cupy")
        q = ct.quantize(ct.relu(h), scales[k + 1])


def step_time(program, feed, steps, repeats):
    """Milliseconds of device time per step: the step's CUDA graph launched ``steps`` times back to back."""
    import cupy

    program(x=feed)
    program(x=feed)
    executor = program._executor
    (graph,) = executor.graphs.values()
    times = []
    for _ in range(repeats):
        start = executor.stream.record()
        for _ in range(steps):
            graph.launch(executor.stream)
        end = executor.stream.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / steps)
    return float(np.median(times))


def mlp_rows(repeats):
    cupy, _ = require_gpu()
    rng = np.random.default_rng(0)
    weights = _mlp_weights(rng)
    scales = [np.float32(4.0 / 127), np.float32(8.0 / 127), np.float32(8.0 / 127)]
    rows = []
    for batch in MLP_BATCHES:
        xf = rng.standard_normal((batch, MLP_SIZES[0])).astype(np.float32)
        xq = np.clip(np.rint(xf / scales[0]), -128, 127).astype(np.int8)
        row = {"batch": batch}
        for name, build, feed in (("int8", lambda b: _int8_program(b, weights, scales), xq),
                                  ("bfloat16", lambda b: _float_program(b, weights, "bfloat16"), xf.astype(BFLOAT16)),
                                  ("float32", lambda b: _float_program(b, weights, "float32"), xf)):
            def measure(build=build, feed=feed, batch=batch):
                program = build(batch)
                ms = step_time(program, cupy.asarray(feed), 200, repeats)
                return {"ms": ms, "calls": [made.describe() for made in program._executor.choices.values()]}
            row[name] = attempt(f"MLP batch {batch} {name}", measure)
        if row["int8"].get("ms") and row["bfloat16"].get("ms"):
            row["int8_over_bfloat16"] = row["bfloat16"]["ms"] / row["int8"]["ms"]
        rows.append(row)
    return rows


def main():
    args = command_line(__doc__, "int8_gpu.json", 7)
    _, name = require_gpu()
    from cortado.backends.cupy.launch import overlapping

    log(f"int8 benchmarks on {name}; generated kernels overlap the kernel before them: {overlapping()}")
    gemms = gemm_rows(args.repeats)
    columns = [("shape", "shape", "16s"), ("ours us", "ours_us", "9.2f"), ("own krnl", "own_us", "9.2f"),
               ("own plain", "plain_us", "10.2f"), ("Lt int8", "lt_us", "9.2f"),
               ("_int_mm", "mm_us", "9.2f"), ("Lt f16", "f16_us", "9.2f"), ("/Lt int8", "over_cublaslt_int8", "9.2f"),
               ("/_int_mm", "over_torch_int_mm", "9.2f"), ("/Lt f16", "over_cublaslt_f16", "9.2f"),
               ("own/Lt8", "own_over_cublaslt_int8", "9.2f"), ("own/f16", "own_over_cublaslt_f16", "9.2f")]
    table = [{**row, "ours_us": _us(row["cortado"]), "own_us": _us(row["cortado"], "kernel_ms"),
              "plain_us": _us(row["cortado"], "kernel_plain_launch_ms"), "lt_us": _us(row["cublaslt_int8"]),
              "mm_us": _us(row["torch_int_mm"]), "f16_us": _us(row["cublaslt_f16"])} for row in gemms]
    print_table(table, columns)
    for row in gemms:
        print(f"{row['shape']}: chose {row['cortado'].get('choice', row['cortado'].get('error'))}; "
              f"fastest own kernel: {row['cortado'].get('kernel')}")
    requantizing = requantized_rows(args.repeats)
    print_table([{"shape": r["shape"], "ours_us": _us(r["cortado"]), "own_us": _us(r["cortado"], "kernel_ms"),
                  "lt_us": _us(r["cortado"], "library_ms"), "ratio": r.get("over_library")} for r in requantizing],
                [("requantized", "shape", "16s"), ("ours us", "ours_us", "9.2f"), ("own krnl", "own_us", "9.2f"),
                 ("Lt+epi us", "lt_us", "10.2f"), ("/Lt+epi", "ratio", "9.2f")])
    for row in requantizing:
        print(f"{row['shape']} requantized: chose {row['cortado'].get('choice', row['cortado'].get('error'))}; "
              f"fastest own kernel: {row['cortado'].get('kernel')}; cuBLASLt: {row['cortado'].get('library')}")
    mlp = mlp_rows(args.repeats)
    print_table([{"batch": r["batch"], **{f"{k}_us": _us(r[k]) for k in ("int8", "bfloat16", "float32")},
                  "ratio": r.get("int8_over_bfloat16")} for r in mlp],
                [("batch", "batch", "6d"), ("int8 us", "int8_us", "9.2f"), ("bf16 us", "bfloat16_us", "9.2f"),
                 ("f32 us", "float32_us", "9.2f"), ("bf16/int8", "ratio", "10.2f")])
    for row in mlp:
        for precision in ("int8", "bfloat16"):
            print(f"MLP batch {row['batch']} {precision}: " + "; ".join(row[precision].get("calls", [])))
    write_results({"machine": describe(), "versions": versions("torch", "nvmath"), "overlapping_launches": overlapping(),
                   "gemms": gemms, "requantized": requantizing, "mlp": mlp}, args.out)


def _us(result, key="ms"):
    return result[key] * 1e3 if result.get(key) else None


if __name__ == "__main__":
    main()
