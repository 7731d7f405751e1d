"""Row kernels of a warp a row, timed alone as generated (a block of 8 warps for each 8 rows, one row a warp: 1024
blocks for the GPT's 8192 rows, about 1.3 waves of the blocks an H200 holds at once) and with the same body in a loop
over rows, ``o += gridDim.x * 8``, over fewer blocks (a whole number of blocks a multiprocessor: no last partial
wave). ``python3 waves.py kernels.pkl out.json`` from the repository root, ``kernels.pkl`` from
``../kernels_alone/dump.py``; outputs compared bit for bit with the generated kernel's; each call timed by
``../kernels_alone/bench.py``'s ``run`` (tidied into it after the run below, which timed the same calls)."""

import json
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[4]), str(HERE.parent / "kernels_alone")]

from bench import cases, run  # noqa: E402

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


def main():
    import cupy

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    results = []
    for dtype, name, entry, ins in cases(sys.argv[1], lambda e: looped(e["source"].text) and e["source"].blocks >= 4 * sms):
        text = looped(entry["source"].text)
        row = {"dtype": dtype, "name": name, "ins": entry["ins"], "outs": entry["outs"],
               "blocks": entry["source"].blocks, "count": entry["count"]}
        row["base"], expected = run(entry, ins, "base", entry["source"].text)
        for per_sm in (2, 3, 4, 5, 6, 7, 8):
            blocks = per_sm * sms
            if blocks >= entry["source"].blocks:
                continue
            row[f"looped_{per_sm}"], got = run(entry, ins, "looped", text, grid=blocks)
            row[f"looped_{per_sm}_same"] = all(np.array_equal(a, b) for a, b in zip(got, expected))
        results.append(row)
        print(dtype, name, entry["source"].blocks, {k: (round(v, 2) if isinstance(v, float) else v)
                                                     for k, v in row.items() if k == "base" or k.startswith("looped")},
              flush=True)
    with open(sys.argv[2], "w") as file:
        json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
