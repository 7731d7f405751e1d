"""Time each kernel ``dump.py`` pickled alone on the GPU, as generated and in variants of its text (same inputs,
outputs compared bit for bit with the generated kernel's; ``NOVARIANTS=1``: as given only), 100 calls between two
events, the median of 3: ``python3 bench.py kernels.pkl out.json`` from the repository root."""

import json
import os
import pickle
import re
import sys
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

SIGNATURE = re.compile(r"(__global__ void )(\w+)(\((.*?)\)\s*\{)", re.S)


def renamed(source, text, tag):
    name = source.name + "_" + tag
    return replace(source, name=name, text=text.replace(source.name + "(", name + "("))


def restrict(text):
    """Every output pointer ``__restrict__``."""
    m = SIGNATURE.search(text)
    params = re.sub(r"\* (out\d+|partials)", r"* __restrict__ \1", m.group(4))
    return text[:m.start(4)] + params + text[m.end(4):]


def unroll(text):
    """A row kernel's loop over its row unrolled 4 times, its loop over groups of rows unrolled."""
    text = re.sub(r"(\n(\s*)for \(unsigned int c = lane; c < \d+; c \+= 32\) \{)", r"\n\2#pragma unroll 4\1", text)
    return re.sub(r"(\n(\s*)for \(unsigned int g = 0; g < \d+u; \+\+g\) \{)", r"\n\2#pragma unroll\1", text)


def reciprocal(text):
    """Divisions of 1 by a value as the correctly rounded reciprocal (the same bits)."""
    return re.sub(r"= \((e\d+) / (e\d+)\);",
                  lambda m: f"= ({m.group(1)} == 1.0f ? __frcp_rn({m.group(2)}) : {m.group(1)} / {m.group(2)});", text)


VARIANTS = {} if os.environ.get("NOVARIANTS") else {
    "restrict": restrict, "restrict_unroll": lambda t: unroll(restrict(t)),
    "restrict_unroll_rcp": lambda t: reciprocal(unroll(restrict(t)))}


def _dtype(name):
    return np.dtype(getattr(ml_dtypes, name) if name.startswith(("bfloat16", "float8")) else name)


def nbytes(shape, dtype):
    return int(np.prod(shape)) * _dtype(dtype).itemsize


def data(shape, dtype, rng):
    """Device bytes of an operand: ones for a scalar, small integers, float8 bytes that are neither NaN nor
    infinite, normal values."""
    import cupy

    n, dt = int(np.prod(shape)), _dtype(dtype)
    if shape in ((), (1,)):
        values = np.ones(n, np.float32).astype(dt)
    elif dt.kind in "iu":
        values = rng.integers(0, 60, n).astype(dt)
    elif dt.itemsize == 1:
        values = (rng.integers(0, 256, n, dtype=np.uint8) & 0x77).view(dt)
    else:
        values = (rng.standard_normal(n) * 0.5).astype(np.float32).astype(dt)
    return cupy.asarray(values.view(np.uint8))


def timed(call, repeats=3, n=100):
    import cupy

    for _ in range(10):
        call()
    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(n):
            call()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / n)
    return float(np.median(times))


def run(entry, ins, tag, text, grid=None):
    """``(us a call, the outputs' bytes)`` of ``entry``'s kernel with ``text`` (on ``grid`` blocks, where given)."""
    import cupy

    from cortado.backends.cupy.kernels import launcher

    source = entry["source"] if tag == "base" else renamed(entry["source"], text, tag)
    outs = [cupy.zeros(nbytes(shape, dtype), np.uint8) for shape, dtype in entry["outs"]]
    scratch = cupy.zeros(64 << 20, np.uint8)
    pointers = [ins[int(p[2:])].data.ptr if p.startswith("in") else outs[int(p[3:])].data.ptr
                if p.startswith("out") else scratch.data.ptr
                for p in (q.strip().split()[-1] for q in SIGNATURE.search(text).group(4).split(","))]
    call = launcher(source, pointers, grid=grid)
    call()
    cupy.cuda.Device().synchronize()
    return timed(call), [o.get() for o in outs]


def cases(path, wanted=lambda entry: True):
    """``(dtype, name, entry, its operands on the device)`` of each kernel pickled at ``path`` that is ``wanted``."""
    with open(path, "rb") as file:
        kernels = pickle.load(file)
    rng = np.random.default_rng(0)
    for dtype, found in kernels.items():
        for name, entry in found.items():
            if wanted(entry):
                yield dtype, name, entry, [data(shape, d, rng) for shape, d in entry["ins"]]


def main():
    results = []
    for dtype, name, entry, ins in cases(sys.argv[1]):
        row = {"dtype": dtype, "name": name, "kind": entry["kind"], "ins": entry["ins"], "outs": entry["outs"],
               "bytes": sum(nbytes(shape, d) for shape, d in entry["ins"] + entry["outs"])}
        row["base"], expected = run(entry, ins, "base", entry["source"].text)
        for tag, change in VARIANTS.items():
            text = change(entry["source"].text)
            if text != entry["source"].text:
                row[tag], got = run(entry, ins, tag, text)
                row[tag + "_same"] = all(np.array_equal(a, b) for a, b in zip(got, expected))
        results.append(row)
        print(dtype, name, entry["kind"][:20], {k: v for k, v in row.items() if k == "base" or k in VARIANTS
                                                  or k.endswith("_same")}, flush=True)
    with open(sys.argv[2], "w") as file:
        json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
