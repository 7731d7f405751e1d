"""Row kernels of a warp a row, timed alone as generated (a block of 8 warps for each 8 rows, one row a warp: 1024
blocks for the GPT's 8192 rows, about 1.3 waves of the blocks an H200 holds at once) and with the same body in a loop
over rows, ``o += gridDim.x * 8``, over fewer blocks (a whole number of blocks a multiprocessor: no last partial
wave). ``python3 waves.py kernels.pkl out.json`` from the repository root, ``kernels.pkl`` from
``../kernels_alone/dump.py``; outputs compared bit for bit with the generated kernel's."""

import json
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[4]), str(HERE.parent / "kernels_alone")]

from bench import data, nbytes, renamed, SIGNATURE, timed  # noqa: E402

START = re.compile(r"  const unsigned int o = \(unsigned int\)blockIdx\.x \* 8 \+ threadIdx\.x / 32;\n"
                   r"(  const unsigned lane = threadIdx\.x % 32;\n)  if \(o >= (\d+)\) return;\n")


def looped(text):
    """The kernel's body in a loop over rows, a block's 8 warps taking 8 rows a turn; None where it is no kernel of a
    warp a row (or it synchronises its block)."""
    m = START.search(text)
    if m is None or "__syncthreads" in text:
        return None
    rows = m.group(2)
    head = (f"  const unsigned lane = threadIdx.x % 32;\n"
            f"  for (unsigned int o = (unsigned int)blockIdx.x * 8 + threadIdx.x / 32; o < {rows}u; o += gridDim.x * 8) {{\n")
    body = text[:m.start()] + head + text[m.end():]
    end = body.rstrip().rfind("}")
    return body[:end] + "  }\n}\n"


def run(entry, ins, source, blocks):
    import cupy

    from cortado.backends.cupy.kernels import launcher

    outs = [cupy.zeros(nbytes(shape, dtype), np.uint8) for shape, dtype in entry["outs"]]
    pointers = [ins[int(p[2:])].data.ptr if p.startswith("in") else outs[int(p[3:])].data.ptr
                for p in (q.strip().split()[-1] for q in SIGNATURE.search(source.text).group(4).split(","))]
    call = launcher(source, pointers, grid=blocks)
    call()
    cupy.cuda.Device().synchronize()
    return timed(call), [o.get() for o in outs]


def main():
    import cupy

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    with open(sys.argv[1], "rb") as file:
        import pickle
        kernels = pickle.load(file)
    rng = np.random.default_rng(0)
    results = []
    for dtype, found in kernels.items():
        for name, entry in found.items():
            text = looped(entry["source"].text)
            if text is None or entry["source"].blocks < 4 * sms:
                continue
            ins = [data(shape, d, rng) for shape, d in entry["ins"]]
            row = {"dtype": dtype, "name": name, "ins": entry["ins"], "outs": entry["outs"],
                   "blocks": entry["source"].blocks, "count": entry["count"]}
            row["base"], expected = run(entry, ins, entry["source"], None)
            source = renamed(entry["source"], text, "looped")
            for per_sm in (2, 3, 4, 5, 6, 7, 8):
                blocks = per_sm * sms
                if blocks >= entry["source"].blocks:
                    continue
                row[f"looped_{per_sm}"], got = run(entry, ins, source, blocks)
                row[f"looped_{per_sm}_same"] = all(np.array_equal(a, b) for a, b in zip(got, expected))
            results.append(row)
            print(dtype, name, entry["source"].blocks, {k: (round(v, 2) if isinstance(v, float) else v)
                                                         for k, v in row.items() if k == "base" or k.startswith("looped")},
                  flush=True)
    with open(sys.argv[2], "w") as file:
        json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
