"""Fused elementwise work on the GPU: cortado against CuPy, cupy.fuse, torch, torch.compile and the bandwidth floor.

    python benchmarks/bench_fused_gpu.py [--repeats 50] [--skip torch.compile] [--out benchmarks/results/fused_gpu.json]

Two cases, both bound by memory bandwidth, on 2**26 float32 elements:

- chain: ``tanh(0.5*x + y) * sigmoid(x) + y*y``, x and y fed as CuPy arrays, one output;
- adam: one Adam update in place of state p, m, v from a fed gradient g, its bias corrections folded
  into a constant step size (cortado: ``ct.compile([], inputs=[g], state=..., updates=...)``).

The floor of a case is the bytes it must move (every input read once, every output written once) over
the bandwidth: the nominal 4.16 TB/s (the copy rate measured on the H200 before) and the copy rate
measured in this run (a device-to-device memcpy of 1 GiB, bytes read plus written). Every contestant's
result after its first call is checked against plain CuPy's before it is timed; then, after a warm-up
of 5 calls, each of ``repeats`` calls is timed alone between two CUDA events recorded on the current
stream: CuPy's events for CuPy and cortado, torch's for torch (both libraries work on the legacy
default stream, so both see the same work). The wall time of each call, until the whole device is
idle, is stored beside it: far above the event time, it would mean work that ran off the stream.
"""

import argparse
import functools
import importlib
import os
import re
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cortado as ct  # noqa: E402
from machine import describe  # noqa: E402
from reporting import write_results  # noqa: E402

ELEMENTS = 2**26
COPY_ELEMENTS = 2**28  # float32: 1 GiB a buffer
NOMINAL_BANDWIDTH = 4.16e12  # bytes per second
WARMUP = 5
TOLERANCE = 1e-5  # float32
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8  # LR: the step size with the bias corrections of one fixed step folded in
STARTED = time.perf_counter()


def log(message):
    """A progress line, flushed at once: the output is read remotely while the run goes on."""
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", flush=True)


def require_gpu():
    """CuPy and the name of its GPU, or exit with one line that says what is missing."""
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]  # raises where there is no driver or no device
    except Exception as error:
        script = os.path.basename(sys.argv[0])
        raise SystemExit(f"{script}: needs CuPy and an NVIDIA GPU ({type(error).__name__}: {error})") from None
    return cupy, name.decode() if isinstance(name, bytes) else name


def chain_cupy(x, y):
    """The chain as a CuPy user writes it (CuPy has no sigmoid); under cupy.fuse, one kernel."""
    import cupy

    return cupy.tanh(0.5 * x + y) * (1 / (1 + cupy.exp(-x))) + y * y


def chain_torch(x, y):
    """The chain in torch, in tensor methods only (so torch.compile traces it as it is)."""
    return (0.5 * x + y).tanh() * x.sigmoid() + y * y


def adam_cupy(p, m, v, g):
    """One Adam update with CuPy's in-place operators: each its own kernel as written, one kernel under cupy.fuse
    (which writes an operand updated in place straight back to its array)."""
    import cupy

    m *= B1
    m += (1 - B1) * g
    v *= B2
    v += (1 - B2) * g * g
    p -= LR * m / (cupy.sqrt(v) + EPS)


def adam_torch(p, m, v, g):
    """One Adam update in place as torch.optim.Adam's single-tensor path writes it (bias corrections in LR)."""
    m.mul_(B1).add_(g, alpha=1 - B1)
    v.mul_(B2).addcmul_(g, g, value=1 - B2)
    p.addcdiv_(m, v.sqrt().add_(EPS), value=-LR)


def chain_contestants(x, y):
    """``name: build`` for the chain; ``build()`` gives ``(call, outputs, clock)``: ``outputs(call())`` are the
    CuPy arrays to check, ``clock`` the library whose events time the call. Ours comes last: a fault in a new
    backend can take the CUDA context down with it, and the peers are measured by then."""
    import cupy

    def plain_cupy(function):
        return lambda: (functools.partial(function, x, y), lambda out: [out], "cupy")

    def torch_peer(compiled):
        def build():
            import torch

            xt, yt = torch.from_dlpack(x), torch.from_dlpack(y)
            function = torch.compile(chain_torch) if compiled else chain_torch
            return functools.partial(function, xt, yt), lambda out: [cupy.from_dlpack(out)], "torch"

        return build

    def ours(fed):
        def build():
            xv, yv = ct.var("x", x.shape, "float32"), ct.var("y", y.shape, "float32")
            chain = ct.tanh(0.5 * xv + yv) * ct.sigmoid(xv) + yv * yv
            if fed:
                step = ct.compile(chain, inputs=[xv, yv], backend="cupy")
                return (lambda: step(x=x, y=y)), lambda out: [out], "cupy"
            step = ct.compile(chain, state={xv: x.get(), yv: y.get()}, backend="cupy")
            return step, lambda out: [out], "cupy"

        return build

    return {"cupy": plain_cupy(chain_cupy), "cupy.fuse": plain_cupy(cupy.fuse(chain_cupy)),
            "torch": torch_peer(False), "torch.compile": torch_peer(True), "cortado": ours(True),
            "cortado (state)": ours(False)}


def adam_contestants(p0, m0, v0, g):
    """As ``chain_contestants``, for Adam: every contestant updates its own copy of the initial state, and its
    outputs are that state after the call."""
    import cupy

    def plain_cupy(function):
        def build():
            p, m, v = p0.copy(), m0.copy(), v0.copy()
            return functools.partial(function, p, m, v, g), lambda _: [p, m, v], "cupy"

        return build

    def torch_peer(compiled):
        def build():
            import torch

            p, m, v = (torch.from_dlpack(a.copy()) for a in (p0, m0, v0))
            function = torch.compile(adam_torch) if compiled else adam_torch
            return functools.partial(function, p, m, v, torch.from_dlpack(g)), \
                lambda _: [cupy.from_dlpack(t) for t in (p, m, v)], "torch"

        return build

    def ours(fed):
        def build():
            p, m, v, grad = (ct.var(name, p0.shape, "float32") for name in ("p", "m", "v", "g"))
            m_new = B1 * m + (1 - B1) * grad
            v_new = B2 * v + (1 - B2) * grad * grad
            p_new = p - LR * m_new / (ct.sqrt(v_new) + EPS)
            state = {p: p0.get(), m: m0.get(), v: v0.get()}
            if not fed:
                state[grad] = g.get()
            step = ct.compile([], inputs=[grad] if fed else [], state=state,
                              updates={p: p_new, m: m_new, v: v_new}, backend="cupy")
            call = (lambda: step(g=g)) if fed else step
            return call, lambda _: [step.state[name] for name in ("p", "m", "v")], "cupy"

        return build

    return {"cupy": plain_cupy(adam_cupy), "cupy.fuse": plain_cupy(cupy.fuse(adam_cupy)),
            "torch": torch_peer(False), "torch.compile": torch_peer(True), "cortado": ours(True),
            "cortado (state)": ours(False)}


def normal(rng):
    """``ELEMENTS`` standard normal float32 values on the GPU (drawn by NumPy: no cuRAND needed)."""
    import cupy

    return cupy.asarray(rng.standard_normal(ELEMENTS, dtype=np.float32))


def chain_case(rng):
    """The chain's contestants, the reference result (plain CuPy's) and the bytes the chain must move."""
    x, y = normal(rng), normal(rng)
    return chain_contestants(x, y), [chain_cupy(x, y)], 3 * 4 * ELEMENTS


def adam_case(rng):
    """Adam's contestants, the reference state after one plain CuPy update and the bytes Adam must move."""
    p, m, v, g = normal(rng), normal(rng), normal(rng) ** 2, normal(rng)  # a second moment is never negative
    reference = [p.copy(), m.copy(), v.copy()]
    adam_cupy(*reference, g)
    return adam_contestants(p, m, v, g), reference, 7 * 4 * ELEMENTS


def max_relative_error(result, reference):
    """max |result - reference| / max(|reference|, 1): relative where values are large, absolute near zero,
    where a value that cancels to almost nothing would make any relative error meaningless."""
    import cupy

    return float(cupy.max(cupy.abs(result - reference) / cupy.maximum(cupy.abs(reference), 1)))


def clock(library):
    """Two CUDA events of ``library`` ("cupy" or "torch"), the milliseconds between them, and a device-wide sync."""
    if library == "torch":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return start, end, lambda: start.elapsed_time(end), torch.cuda.synchronize
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    return start, end, lambda: cupy.cuda.get_elapsed_time(start, end), cupy.cuda.Device().synchronize


def time_calls(call, timer, repeats, warmup=WARMUP):
    """Median seconds of ``call()`` between the two events of ``timer`` (a ``clock``), and median wall seconds
    until the device is idle, over ``repeats`` calls each timed alone after ``warmup`` calls."""
    start, end, elapsed_ms, synchronize = timer
    for _ in range(warmup):
        call()
    synchronize()
    device, wall = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        start.record()
        call()
        end.record()
        synchronize()
        wall.append(time.perf_counter() - began)
        device.append(elapsed_ms() / 1e3)
    return statistics.median(device), statistics.median(wall)


def measure(build, reference, repeats):
    """Build a contestant, check its first result against the reference, then time it."""
    call, outputs, library = build()
    error = max(max_relative_error(a, r) for a, r in zip(outputs(call()), reference))
    device, wall = time_calls(call, clock(library), repeats)
    return {"us": 1e6 * device, "wall_us": 1e6 * wall, "max_rel_error": error, "mismatch": not error <= TOLERANCE}  # NaN too


def attempt(label, function, *args):
    """``function(*args)``, or ``{"error": "<type>: <message>"}`` where it fails: one failure must not end the run."""
    log(f"{label} ...")
    try:
        result = function(*args)
    except Exception as error:  # any failure of one contestant is a result to record
        print(traceback.format_exc(limit=-4), end="", flush=True)
        result = {"error": f"{type(error).__name__}: {error}".strip()[:1000]}
        log(f"{label}: FAILED: {result['error'].splitlines()[0]}")
    else:
        log(f"{label}: done; " + ", ".join(f"{key} {value:.4g}" for key, value in result.items() if isinstance(value, float)))
    return result


def copy_rate(repeats):
    """The device's own copy bandwidth: bytes read plus written per second by a 1 GiB device-to-device memcpy."""
    import cupy

    source = cupy.full(COPY_ELEMENTS, 1.5, dtype=cupy.float32)  # what it holds is no matter to a memcpy
    target = cupy.empty_like(source)
    device, wall = time_calls(functools.partial(target.data.copy_from_device_async, source.data, source.nbytes),
                              clock("cupy"), repeats)
    return {"bytes": 2 * source.nbytes, "us": 1e6 * device, "wall_us": 1e6 * wall, "bytes_per_s": 2 * source.nbytes / device}


def run_case(name, setup, skip, repeats, measured_rate):
    """Every contestant on one case, then each set against the two floors and against ours."""
    contestants, reference, moved = setup(np.random.default_rng(0))
    results = {}
    for contestant, build in contestants.items():
        if contestant not in skip:
            results[contestant] = attempt(f"{name}: {contestant}", measure, build, reference, repeats)
            if results[contestant].get("mismatch"):
                log(f"!!! MISMATCH: {name}: {contestant} is off by {results[contestant]['max_rel_error']:.3e} relative "
                    f"to plain CuPy (tolerance {TOLERANCE:g}) !!!")
    floor = moved / NOMINAL_BANDWIDTH
    copy_floor = moved / measured_rate if measured_rate else None
    ours = results.get("cortado", {}).get("us")
    for result in results.values():
        if "us" in result:
            seconds = result["us"] / 1e6
            result.update(gb_per_s=moved / seconds / 1e9, of_floor=floor / seconds,
                          of_copy_floor=copy_floor / seconds if copy_floor else None,
                          ours_over_peer=ours / result["us"] if ours else None)
    return {"elements": ELEMENTS, "dtype": "float32", "bytes_moved": moved, "floor_us": 1e6 * floor,
            "copy_floor_us": 1e6 * copy_floor if copy_floor else None, "contestants": results}


COLUMNS = [("case", "case", "6s"), ("contestant", "contestant", "16s"), ("µs", "us", "10.1f"), ("GB/s", "gb_per_s", "7.0f"),
           ("of floor", "of_floor", "9.2f"), ("of copy floor", "of_copy_floor", "14.2f"),
           ("ours/peer", "ours_over_peer", "10.2f"), ("max rel err", "max_rel_error", "12.2e")]


def table_rows(cases):
    """One row per contestant and one per floor, for the printed table; a failure or a mismatch as its note."""
    rows = []
    for name, case in cases.items():
        if "error" in case:
            rows.append({"case": name, "contestant": "-", "note": f"ERROR {case['error']}"})
            continue
        rows.append({"case": name, "contestant": "floor 4.16 TB/s", "us": case["floor_us"]})
        rows.append({"case": name, "contestant": "floor (copy)", "us": case["copy_floor_us"]})
        for contestant, result in case["contestants"].items():
            note = f"ERROR {result['error'].splitlines()[0]}" if "error" in result else "MISMATCH" if result["mismatch"] else ""
            rows.append({"case": name, "contestant": contestant, **result, "note": note})
    return rows


def print_table(rows, columns):
    """The rows under their headings, each column as wide as its format; a value a row lacks prints as '-'."""
    widths = [int(re.match(r"\d+", spec).group()) for _, _, spec in columns]
    print("\n" + " ".join(f"{heading:>{width}}" for (heading, _, _), width in zip(columns, widths)))
    for row in rows:
        cells = [format(row[key], ">" + spec) if row.get(key) is not None else f"{'-':>{width}}"
                 for (_, key, spec), width in zip(columns, widths)]
        print(" ".join(cells), row.get("note", ""))
    print(flush=True)


def versions(*peers):
    """The versions of what ran: cortado, CuPy and the CUDA under it, and each of ``peers`` where it imports."""
    import cupy

    found = {"cortado": ct.__version__, "cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
             "cuda_driver": cupy.cuda.runtime.driverGetVersion()}
    for name in peers:
        try:
            found[name] = importlib.import_module(name).__version__
        except Exception as error:
            found[name] = f"unavailable ({type(error).__name__}: {error})"
    return found


NOTES = {
    "cortado": "ct.compile(..., backend='cupy'), cuda_graph left at its default; fed CuPy arrays, which a call "
               "copies into the program's static input buffers first (more bytes than the floor counts)",
    "cortado (state)": "the same program with the inputs (chain: x, y; Adam: g) held as program state on the GPU: "
                       "the generated kernel alone, reading and writing exactly the floor's bytes",
    "cupy": "the same Python function as cupy.fuse's, run unfused: every op a kernel, temporaries allocated; "
            "Adam with in-place operators",
    "cupy.fuse": "chain: one fused kernel returning the output; Adam: in-place operators inside the fused function, "
                 "one kernel writing p, m and v back",
    "torch": "Adam as torch.optim.Adam's single-tensor path: mul_, add_, addcmul_, sqrt, add_, addcdiv_",
    "torch.compile": "default mode of the same functions; the first call compiles, then the warm-up",
    "max_rel_error": "max |result - reference| / max(|reference|, 1) after one call, against plain CuPy",
}


def command_line():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per contestant (the median is kept)")
    parser.add_argument("--skip", default="", help="contestants to leave out, comma-separated (e.g. torch.compile)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "fused_gpu.json"))
    return parser.parse_args()


def main():
    args = command_line()
    _, gpu = require_gpu()
    log(f"{gpu}: {ELEMENTS} float32 elements a case, {args.repeats} timed calls each after {WARMUP} of warm-up")
    skip = set(filter(None, args.skip.split(",")))
    copy = attempt("device copy", copy_rate, args.repeats)
    cases = {name: attempt(f"{name} setup and contestants", run_case, name, setup, skip, args.repeats,
                           copy.get("bytes_per_s"))
             for name, setup in (("chain", chain_case), ("adam", adam_case))}
    write_results({"benchmark": "fused_gpu", "machine": {**describe(), "gpu": gpu}, "versions": versions("torch"),
                   "elements": ELEMENTS, "warmup": WARMUP, "repeats": args.repeats, "tolerance": TOLERANCE,
                   "nominal_bandwidth_bytes_per_s": NOMINAL_BANDWIDTH, "copy": copy,
                   "adam": {"lr": LR, "b1": B1, "b2": B2, "eps": EPS}, "notes": NOTES, "cases": cases}, args.out)
    print_table(table_rows(cases), COLUMNS)
    if "bytes_per_s" in copy:
        print(f"device copy measured at {copy['bytes_per_s'] / 1e12:.2f} TB/s (the nominal floor assumes "
              f"{NOMINAL_BANDWIDTH / 1e12:.2f})", flush=True)
    print("GB/s: the bytes a case must move over the time; of floor: the floor's time over the time (1 is the floor); "
          "ours/peer: our time over its time (below 1: ours is faster)", flush=True)


if __name__ == "__main__":
    main()
