"""A weight gradient's bias gradient as more columns (rows) of its product, x padded with 8, 16, 32 or 64 columns of
ones, against cuBLASLt's BGRAD epilogue and the product alone: the GPT's four weight gradients (K = 8192 rows,
bfloat16), in both orientations, two rounds; each program one cuBLASLt call on operands held as state, 50 calls
back to back between two events, the median of 5. On the GPU machine, from the repository root:
``python3 benchmarks/results/h200/experiments/bias_gradient_ones/ones.py``."""
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import cortado as ct

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bias_gradient_epilogue_cost"))
from bgrad import timed  # noqa: E402


rng = np.random.default_rng(0)
for rnd in range(2):
  for rows, width_in, width_out in [(8192, 768, 2304), (8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768)]:
    dyv = rng.standard_normal((rows, width_out)).astype(ml_dtypes.bfloat16)
    xv = rng.standard_normal((rows, width_in)).astype(ml_dtypes.bfloat16)
    dy, x = ct.var("dy", (rows, width_out), "bfloat16"), ct.var("x", (rows, width_in), "bfloat16")
    forms = {"(in,out) alone": ([ct.matmul(ct.transpose(x), dy)], {dy: dyv, x: xv}),
             "(in,out) + bgrad": ([ct.matmul(ct.transpose(x), dy), ct.sum(dy, axis=0)], {dy: dyv, x: xv}),
             "(out,in) alone": ([ct.matmul(ct.transpose(dy), x)], {dy: dyv, x: xv}),
             "(out,in) + bgrad": ([ct.matmul(ct.transpose(dy), x), ct.sum(dy, axis=0)], {dy: dyv, x: xv})}
    for pad in (8, 16, 32, 64):
        xa = ct.var("xa", (rows, width_in + pad), "bfloat16")
        xav = np.zeros((rows, width_in + pad), ml_dtypes.bfloat16)
        xav[:, :width_in] = xv
        xav[:, width_in] = 1
        forms[f"(in+{pad},out) ones"] = ([ct.matmul(ct.transpose(xa), dy)], {dy: dyv, xa: xav})
        forms[f"(out,in+{pad}) ones"] = ([ct.matmul(ct.transpose(dy), xa)], {dy: dyv, xa: xav})
    for name, (outs, state) in forms.items():
        step = ct.compile(outs, state=state, backend="cupy")
        kernels = [k.term for k in step.kernels if k.term.op.name not in ("var", "reshape", "transpose")]
        epilogues = [getattr(t.attrs, "epilogue", t.op.name) for t in kernels]
        line = f"r{rnd} K{rows} in{width_in} out{width_out} {name:22s} {timed(step):7.1f} us  {epilogues}"
        if "ones" in name and rnd == 0:
            out = step()
            out = out[0] if isinstance(out, (list, tuple)) else out
            got = (out.get() if hasattr(out, 'get') else np.asarray(out)).astype(np.float32)
            db = dyv.astype(np.float32).sum(axis=0)
            row = got[width_in] if name.startswith("(in") else got[:, width_in]
            line += f"  bias row max err {float(np.abs(row - db).max()):.3g} (|db| max {float(np.abs(db).max()):.3g})"
        print(line, flush=True)
