"""The large GPT step of bench_float8_gpt_gpu.py, bfloat16 and float8 (or those named on the command line): its time
(step_ms, three repeats), explain() and two profiles, written to $OUT (explain_<dtype>.txt, profile_<dtype>.txt).
explain's kN lines and profile's kN labels name the same kernels. Run from the repository root, with the cortado to
time first on PYTHONPATH:

    PYTHONPATH=<tree>:$PWD python3 benchmarks/results/h200/experiments/row_kernels/explain_and_profile.py [dtype ...]
"""
import os
import sys

sys.path[:0] = ["benchmarks", "examples"]
import numpy as np  # noqa: E402

import bench_float8_gpt_gpu as bench  # noqa: E402
from gpt import windows  # noqa: E402

out = os.environ.get("OUT", ".")
text = open(bench.TEXT, encoding="utf-8").read()
alphabet = sorted(set(text))
data = np.array([alphabet.index(c) for c in text], np.int32)
for dtype in sys.argv[1:] or ("bfloat16", "float8"):
    step, compile_s = bench.program("large", dtype, "cupy", data)
    x, y = windows(data, bench.SIZES["large"]["batch"], bench.SIZES["large"]["context"], np.random.default_rng(0))
    x, y = bench._device(x, "cupy"), bench._device(y, "cupy")
    ms = bench.step_ms(step, x, y, 3)
    profiles = [step.profile(tokens_in=x, labels=y) for _ in range(2)]
    with open(f"{out}/explain_{dtype}.txt", "w") as f:
        f.write(step.explain())
    with open(f"{out}/profile_{dtype}.txt", "w") as f:
        f.write(f"step {ms:.3f} ms, compiled in {compile_s:.1f} s\n" + "\n\n".join(profiles))
    print(dtype, ms, profiles[-1].splitlines()[0], flush=True)
    del step
