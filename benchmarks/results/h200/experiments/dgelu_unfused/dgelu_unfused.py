"""The gelu layer's backward in the bfloat16 GPT step, three ways, on the GPU (8192 x 3072 from 768):

- as planned: the input gradient's product with cuBLASLt's DGELU epilogue (reads z), and gelu(z) made again
  by a kernel of its own for the weight gradient (``memplan.recompute``);
- the product plain, then the two elementwise kernels fusion makes (dgelu, gelu);
- the product plain, then one kernel (written here) that reads the product and z and writes both.

Each program is timed as one CUDA graph (``time_calls``, median of 200), with ``Program.profile``'s kernels;
the hand-written kernel alone, and its outputs against the planned program's. Run from the repository root:
``python3 benchmarks/results/h200/experiments/dgelu_unfused/dgelu_unfused.py``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import cupy  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from bench_fused_gpu import clock, time_calls  # noqa: E402

import cortado as ct  # noqa: E402
from cortado.backends.cupy import backend  # noqa: E402,F401
from cortado.rules.engine import RuleSet  # noqa: E402

ROWS, COLS, INNER = 8192, 3072, 768
REPEATS = 200

FUSED = r"""
#include <cuda_bf16.h>
template <typename T, int V> struct alignas(sizeof(T) * V) vec { T v[V]; };
extern "C" __global__ void dgelu_and_gelu(const __nv_bfloat16* __restrict__ g, const __nv_bfloat16* __restrict__ z,
                                          __nv_bfloat16* dh, __nv_bfloat16* a, unsigned int n) {
  const unsigned int stride = gridDim.x * blockDim.x;
  for (unsigned int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
    const vec<__nv_bfloat16, 8> gv = reinterpret_cast<const vec<__nv_bfloat16, 8>*>(g)[j];
    const vec<__nv_bfloat16, 8> zv = reinterpret_cast<const vec<__nv_bfloat16, 8>*>(z)[j];
    vec<__nv_bfloat16, 8> dv, av;
    #pragma unroll
    for (int u = 0; u < 8; ++u) {
      const float x = __bfloat162float(zv.v[u]);
      const float x2 = x * x;
      const float k = 0x1.9884540000000p+0f;
      const float t = ((x2 * 0x1.6e4e260000000p-5f + 1.0f) * x) * k;
      const float e = expf(-fabsf(t));
      const float r = 1.0f / (1.0f + e);
      const float s = t >= 0.0f ? r : e * r;
      const float slope = s + (x * (e * (r * r))) * ((x2 * 0x1.12ba9e0000000p-3f + 1.0f) * k);
      const float d = __bfloat162float(g.v[u]) * __bfloat162float(__float2bfloat16_rn(slope));
      dv.v[u] = __float2bfloat16_rn(d);
      av.v[u] = __float2bfloat16_rn(x * s);
    }
    reinterpret_cast<vec<__nv_bfloat16, 8>*>(dh)[j] = dv;
    reinterpret_cast<vec<__nv_bfloat16, 8>*>(a)[j] = av;
  }
}
""".replace("g.v[u]", "gv.v[u]")


def programs():
    dy = ct.var("dy", (ROWS, INNER), "bfloat16")
    w = ct.var("w", (INNER, COLS), "bfloat16")
    z = ct.var("z", (ROWS, COLS), "bfloat16")
    planned = ct.compile([(dy @ w) * ct.gelu_grad(z), ct.gelu(z)], inputs=[dy, w, z], backend="cupy")
    product = ct.compile([dy @ w], inputs=[dy, w], backend="cupy")
    lowering = sys.modules["cortado.backends.cupy.lowering"]
    gemm = sys.modules["cortado.backends.cupy.lowering.gemm"]
    gemm.rules = RuleSet([r for r in gemm.rules.rules if r.name != "gemm-dgelu"], name="gemm lowering")
    lowering.lowering.__init__(lowering.TARGETS)
    plain = ct.compile([(dy @ w) * ct.gelu_grad(z), ct.gelu(z)], inputs=[dy, w, z], backend="cupy")
    return planned, product, plain


def main():
    rng = np.random.default_rng(0)
    feeds = {"dy": rng.standard_normal((ROWS, INNER), np.float32) * 0.05,
             "w": rng.standard_normal((INNER, COLS), np.float32) * 0.05,
             "z": rng.standard_normal((ROWS, COLS), np.float32) * 2}
    feeds = {k: cupy.asarray(v.astype(ml_dtypes.bfloat16)) for k, v in feeds.items()}
    planned, product, plain = programs()
    timer = clock("cupy")
    times = {}
    for name, program, fed in (("planned: DGELU product + gelu kernel", planned, feeds),
                               ("product alone", product, {k: feeds[k] for k in ("dy", "w")}),
                               ("plain product + dgelu and gelu kernels", plain, feeds)):
        device, _ = time_calls(lambda program=program, fed=fed: program(**fed), timer, REPEATS)
        times[name] = 1e6 * device
        print(f"{name}: {1e6 * device:.1f} us a call")
        print(program.profile(**fed))
    kernel = cupy.RawKernel(FUSED, "dgelu_and_gelu", options=("--std=c++17",))
    g = product(dy=feeds["dy"], w=feeds["w"])[0]
    dh, a = cupy.empty_like(g), cupy.empty_like(g)
    n = ROWS * COLS // 8
    blocks = (n + 255) // 256

    def fused():
        kernel((blocks,), (256,), (g, feeds["z"], dh, a, np.uint32(n)))

    device, _ = time_calls(fused, timer, REPEATS)
    times["one kernel: dgelu and gelu"] = 1e6 * device
    print(f"one kernel writing dgelu and gelu: {1e6 * device:.1f} us a call")
    fused()
    reference = plain(**feeds)
    for name, ours, theirs in (("dgelu", dh, reference[0]), ("gelu", a, reference[1])):
        same = bool(cupy.all(ours.view(cupy.uint16) == theirs.view(cupy.uint16)))
        print(f"{name} of the one kernel equals the plain program's bit for bit: {same}")
    planned_dh = planned(**feeds)[0].astype(cupy.float32)
    rel = float(cupy.max(cupy.abs(planned_dh - dh.astype(cupy.float32))) / cupy.max(cupy.abs(planned_dh)))
    print(f"largest difference from the DGELU epilogue's, relative to its largest value: {rel:.2e}")
    print("estimate, plain product + one kernel:",
          f"{times['product alone'] + times['one kernel: dgelu and gelu']:.1f} us against planned",
          f"{times['planned: DGELU product + gelu kernel']:.1f}")


if __name__ == "__main__":
    main()
