"""A weight gradient with its bias gradient (the GPT's shapes, K = 8192 rows, bfloat16) in both orientations:
dW (in, out) = x^T dy (cuBLASLt's BGRADA) and dW^T (out, in) = dy^T x (BGRADB), against the product alone."""
import ml_dtypes
import numpy as np
import cupy as cp
import cortado as ct


def timed(step, calls=50, repeats=5):
    step()
    stream = cp.cuda.get_current_stream()
    times = []
    for _ in range(repeats):
        start = stream.record()
        for _ in range(calls):
            step()
        end = stream.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / calls * 1e3)
    return float(np.median(times))


def main():
    rng = np.random.default_rng(0)
    for rows, width_in, width_out in [(8192, 768, 2304), (8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768)]:
        dy, x = ct.var("dy", (rows, width_out), "bfloat16"), ct.var("x", (rows, width_in), "bfloat16")
        state = {dy: rng.standard_normal((rows, width_out)).astype(ml_dtypes.bfloat16),
                 x: rng.standard_normal((rows, width_in)).astype(ml_dtypes.bfloat16)}
        db = ct.sum(dy, axis=0)
        forms = {"(in,out) alone": [ct.matmul(ct.transpose(x), dy)],
                 "(in,out) + bias grad": [ct.matmul(ct.transpose(x), dy), db],
                 "(out,in) alone": [ct.matmul(ct.transpose(dy), x)],
                 "(out,in) + bias grad": [ct.matmul(ct.transpose(dy), x), db]}
        for name, outs in forms.items():
            step = ct.compile(outs, state=state, backend="cupy")
            kernels = [k.term for k in step.kernels if k.term.op.name not in ("var", "reshape", "transpose")]
            epilogues = [t.attrs.epilogue for t in kernels if t.op.name == "gemm"]
            print(f"K{rows} in{width_in} out{width_out} {name:22s} {timed(step):7.1f} us  kernels {len(kernels)} "
                  f"{epilogues}", flush=True)
            if name.endswith("bias grad"):
                print(step.profile(), flush=True)


if __name__ == "__main__":
    main()
