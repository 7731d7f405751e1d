"""float8 GEMMs and a float8 linear layer on the GPU: cortado's float8 call against torch._scaled_mm and the
bfloat16 GEMM of the same shape; the whole layer (casts, product, bias, gelu) against its bfloat16 program.

    python benchmarks/bench_float8_gpu.py [--repeats 7] [--out benchmarks/results/float8_gpu.json]

GEMMs, ``M x N x K``: the GPT large step's (8192 rows; the attention's input and output projections, the MLP's
two layers), 4096^3, and the GPT's weight gradients (K = 8192: the batch's rows). ``a`` (M x K) float8_e4m3fn,
``b`` (N x K) float8_e4m3fn (a linear layer's weight as stored, K contiguous: cuBLASLt's float8 form), a float32
scale on the device, bfloat16 out.

- cortado float8: the call a program makes for ``cast(a @ b^T * s, bfloat16)`` (``Float8Gemm``, tuned as a
  program tunes it), replayed.
- torch._scaled_mm: PyTorch's float8 product (cuBLASLt underneath), per-tensor scales, bfloat16 out; where torch
  or its float8 is not installed the row says so.
- cortado bfloat16: the ``gemm`` call of the same shape in bfloat16, what the bfloat16 model runs.
- cortado float8 + bias + gelu: the float8 call with its bias and gelu epilogue (a linear layer's forward).
- cortado e5m2 x e4m3: the float8 call with ``a`` in float8_e5m2, as a gradient is (the backward's products).

Each is captured ``calls`` times in one CUDA graph and replayed ``--repeats`` times between CuPy events; the median
time per call is kept. Every contestant's result is checked against the float32 product of the same values.

The layer, 8192 x 768 -> 3072 (the GPT large MLP's first): ``gelu(cast(x8 @ w8^T / (sx sw), bf16) + bias)`` with
``x8 = cast(x * sx, e4m3)`` and ``w8 = cast(w * sw, e4m3)`` computed in the step from bfloat16 ``x`` and float32
``w``, against ``gelu(x @ cast(w, bf16)^T + bias)``: the device time per step of each compiled program.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_fused_gpu import attempt, log, print_table, require_gpu, versions  # noqa: E402
from bench_int8_gpu import float_gemm, replayed, step_time  # noqa: E402
from machine import describe  # noqa: E402
from reporting import command_line, write_results  # noqa: E402

import cortado as ct  # noqa: E402
from cortado.exprgraph.dtypes import BFLOAT16, FLOAT8  # noqa: E402

SHAPES = [(8192, 2304, 768), (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (4096, 4096, 4096),
          (2304, 768, 8192), (768, 768, 8192), (3072, 768, 8192), (768, 3072, 8192)]  # the GPT's weight gradients
LAYER = (8192, 768, 3072)
E4M3 = FLOAT8[0]


def _calls(m, n, k):
    return 20 if m * n * k > 1 << 30 else 100


def _operands(cupy, m, n, k):
    """float8 values (as bytes on the device) of a and b, and their float32 product, the reference."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(E4M3)
    b = rng.standard_normal((n, k)).astype(E4M3)
    expected = cupy.asarray(a.astype(np.float32)) @ cupy.asarray(b.astype(np.float32)).T
    return cupy.asarray(a.view(np.uint8)), cupy.asarray(b.view(np.uint8)), expected


def _check(name, result, expected, scale):
    import cupy

    error = float(cupy.abs(result.astype(cupy.float32) - expected * scale).max() / cupy.abs(expected * scale).max())
    if not error < 1e-2:  # bfloat16's rounding of the result
        raise AssertionError(f"{name}: {error:.3g} relative error against the float32 product")
    return error


SCALE = 0.5


def ours(m, n, k, repeats, operands, epilogue="none", a_dtype=E4M3):
    import cupy

    from cortado.backends.cupy.calls.float8_gemm import Float8Gemm, Float8GemmCall

    a, b, expected = operands
    gemm = Float8Gemm(Float8GemmCall(m, n, k, a_dtype, E4M3, BFLOAT16, epilogue, True))
    out = cupy.empty((m, n), np.uint16)
    scale = cupy.asarray(np.float32(SCALE))
    bias = cupy.zeros(n, np.uint16)  # bfloat16 zeros
    workspace = cupy.empty(max(gemm.workspace_bytes, 1), np.uint8)
    pointers = (a.data.ptr, b.data.ptr, out.data.ptr, workspace.data.ptr, scale.data.ptr,
                bias.data.ptr if "bias" in epilogue else None, None, None, None, None)  # no c, no aux, bfloat16 D:
    # no D scale, no amax
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        gemm.tune(pointers, stream)
        gemm.call(*pointers, stream.ptr)
        stream.synchronize()
        checked = epilogue == "none" and a_dtype == E4M3
        error = _check("cortado float8", _bfloat16_as_float32(cupy, out), expected, SCALE) if checked else None
        ms = replayed(lambda: gemm.call(*pointers, stream.ptr), repeats, _calls(m, n, k))
    return {"ms": ms, "max_rel_error": error}


def ours_bias_gelu(m, n, k, repeats, operands):
    """The same call with the bias and gelu epilogue (a linear layer's forward), not checked against the product."""
    return ours(m, n, k, repeats, operands, "bias_gelu")


def ours_e5m2(m, n, k, repeats, operands):
    """The call with ``a`` read as float8_e5m2 (a gradient's format; its bytes are e4m3's, so not checked)."""
    return ours(m, n, k, repeats, operands, a_dtype=FLOAT8[1])


def _bfloat16_as_float32(cupy, bits):
    return (bits.astype(cupy.uint32) << 16).view(cupy.float32)


def torch_scaled_mm(m, n, k, repeats, operands):
    import cupy
    import torch

    a, b, expected = operands
    ta = torch.as_tensor(a, device="cuda").view(torch.float8_e4m3fn)
    tb = torch.as_tensor(b, device="cuda").view(torch.float8_e4m3fn)
    one, scale = torch.ones((), device="cuda"), torch.full((), SCALE, device="cuda")
    stream = cupy.cuda.Stream(non_blocking=True)
    holder = {}

    def call():
        out = torch._scaled_mm(ta, tb.t(), scale_a=scale, scale_b=one, out_dtype=torch.bfloat16)
        holder["out"] = out[0] if isinstance(out, tuple) else out  # (a tuple with the amax before torch 2.4)

    with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
        ms = replayed(call, repeats, _calls(m, n, k))
        stream.synchronize()
    error = _check("torch._scaled_mm", cupy.asarray(holder["out"].float()), expected, SCALE)
    return {"ms": ms, "max_rel_error": error}


def cublaslt_bfloat16(m, n, k, repeats, operands):
    """The bfloat16 product of the same shape as a program calls cuBLASLt (its operands' values do not matter)."""
    import cupy

    a = cupy.random.standard_normal((m, k), np.float32).astype(cupy.float16).view(cupy.uint16)
    b = cupy.random.standard_normal((n, k), np.float32).astype(cupy.float16).view(cupy.uint16)
    return {"ms": float_gemm(a, b, BFLOAT16, repeats, _calls(m, n, k))()}


CONTESTANTS = (("cortado_float8", ours), ("torch_scaled_mm", torch_scaled_mm), ("cortado_bfloat16", cublaslt_bfloat16),
               ("cortado_float8_bias_gelu", ours_bias_gelu), ("cortado_e5m2", ours_e5m2))


def gemm_rows(repeats):
    cupy, _ = require_gpu()
    rows = []
    for m, n, k in SHAPES:
        operands = _operands(cupy, m, n, k)
        row = {"shape": f"{m}x{n}x{k}"}
        for name, contestant in CONTESTANTS:
            row[name] = attempt(f"{m}x{n}x{k} {name}", contestant, m, n, k, repeats, operands)
            if row[name].get("ms"):
                row[name]["tflops"] = 2 * m * n * k / row[name]["ms"] / 1e9
        ours_ms = row["cortado_float8"].get("ms")
        for peer in ("torch_scaled_mm", "cortado_bfloat16"):
            if ours_ms and row[peer].get("ms"):
                row[f"over_{peer}"] = row[peer]["ms"] / ours_ms
        rows.append(row)
    return rows


def _layer(dtype):
    m, k, n = LAYER
    x, w, bias = ct.var("x", (m, k), "bfloat16"), ct.var("w", (n, k)), ct.var("bias", (n,), "bfloat16")
    if dtype == "float8":
        sx, sw = ct.const(np.float32(16.0)), ct.const(np.float32(256.0))
        x8 = ct.cast(ct.cast(x, "float32") * sx, "float8_e4m3fn")
        y = ct.cast(ct.matmul(x8, ct.transpose(ct.cast(w * sw, "float8_e4m3fn"))) * (1 / (sx * sw)), "bfloat16")
    else:
        y = ct.matmul(x, ct.transpose(ct.cast(w, "bfloat16")))
    rng = np.random.default_rng(1)
    state = {w: (rng.standard_normal((n, k)) * 0.02).astype(np.float32), bias: np.zeros(n, BFLOAT16)}
    return ct.compile([ct.gelu(y + bias)], inputs=[x], state=state, backend="cupy")


def layer_rows(repeats):
    cupy, _ = require_gpu()
    feed = cupy.asarray(np.random.default_rng(2).standard_normal(LAYER[:2]).astype(BFLOAT16))
    row = {"shape": "x".join(map(str, LAYER))}
    for dtype in ("float8", "bfloat16"):
        def measure(dtype=dtype):
            program = _layer(dtype)
            return {"ms": step_time(program, feed, 100, repeats), "profile": program.profile(x=feed)}
        row[dtype] = attempt(f"layer {dtype}", measure)
    if row["float8"].get("ms") and row["bfloat16"].get("ms"):
        row["float8_over_bfloat16"] = row["bfloat16"]["ms"] / row["float8"]["ms"]
    return [row]


def main():
    args = command_line(__doc__, "float8_gpu.json", 7)
    _, name = require_gpu()
    log(f"float8 benchmarks on {name}")
    gemms = gemm_rows(args.repeats)
    table = [{"shape": r["shape"], **{f"{c}_us": r[c]["ms"] * 1e3 if r[c].get("ms") else None for c, _ in CONTESTANTS},
              **{f"{c}_tf": r[c].get("tflops") for c, _ in CONTESTANTS}, "vs_torch": r.get("over_torch_scaled_mm"),
              "vs_bf16": r.get("over_cortado_bfloat16")} for r in gemms]
    print_table(table, [("shape", "shape", "16s"), ("f8 us", "cortado_float8_us", "9.1f"),
                        ("f8 TF/s", "cortado_float8_tf", "9.0f"), ("torch us", "torch_scaled_mm_us", "9.1f"),
                        ("torch TF", "torch_scaled_mm_tf", "9.0f"), ("bf16 us", "cortado_bfloat16_us", "9.1f"),
                        ("bf16 TF", "cortado_bfloat16_tf", "9.0f"), ("f8+bg us", "cortado_float8_bias_gelu_us", "9.1f"),
                        ("e5m2 us", "cortado_e5m2_us", "9.1f"), ("f8/torch", "vs_torch", "9.2f"),
                        ("f8/bf16", "vs_bf16", "9.2f")])
    layer = layer_rows(args.repeats)
    for row in layer:
        print(f"layer {row['shape']}: float8 {row['float8'].get('ms')} ms, bfloat16 {row['bfloat16'].get('ms')} ms, "
              f"bfloat16 / float8 {row.get('float8_over_bfloat16')}")
        for dtype in ("float8", "bfloat16"):
            print(f"  {dtype}: {row[dtype].get('profile')}")
    write_results({"machine": describe(), "versions": versions("torch", "nvmath"), "gemms": gemms, "layer": layer},
                  args.out)


if __name__ == "__main__":
    main()
