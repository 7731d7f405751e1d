"""The kernels of each step's profile in ``float8_gpt_gpu.json`` (``Program.profile``: each kernel timed alone) by
kind, as docs/benchmarks.md's table counts them: ``python3 kernel_kinds.py float8_gpt_gpu.json``.

A kernel's kind is read off its profile line: cuBLASLt products (``gemm``, ``float8_gemm``), cuDNN attention, the
optimizer's kernels and the bias and gain sums (kernels side by side, or making a parameter's shape), the scales
(one value, or one a row), and the other elementwise and row kernels."""

import json
import re
import sys

# the GPT's parameters' shapes (large size): embeddings, products' weights, biases and gains
PARAMETER_SHAPES = {(65, 768), (63, 768), (1024, 768), (2304, 768), (768, 768), (3072, 768), (768, 3072), (768,),
                    (2304,), (3072,)}
LINE = re.compile(r"\s*([\d.]+) ms\s+[\d.]+%\s+k\d+\.(.*)")


def shape_of(line):
    m = re.search(r"\(([\d, ]*)\)\s*$", line)
    return tuple(int(x) for x in m.group(1).split(",") if x.strip()) if m else None


def kind(line):
    if ".gemm" in line or "float8_gemm" in line:
        return "products"
    if "dnn_attention" in line:
        return "attention"
    shape = shape_of(line)
    if "side by side" in line or shape in PARAMETER_SHAPES:
        return "optimizer and bias/gain sums"
    if shape == () or (shape and shape[-1] == 1):
        return "scales"
    return "other elementwise and row kernels"


def main():
    with open(sys.argv[1]) as file:
        runs = json.load(file)["runs"]
    for name, run in runs.items():
        totals = {}
        for line in run["profile"].splitlines()[1:]:
            m = LINE.match(line)
            if m:
                count, ms = totals.get(kind(line), (0, 0.0))
                totals[kind(line)] = (count + 1, ms + float(m.group(1)))
        print(name, run["profile"].splitlines()[0])
        for what, (count, ms) in sorted(totals.items()):
            print(f"  {what:40} {count:4} kernels {ms:7.2f} ms")


if __name__ == "__main__":
    main()
