"""Time every cuDNN plan of the GPT's attention calls (forward, backward deterministic or not), in place."""
import sys, os, time
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, os.path.join(tree, "benchmarks")); sys.path.insert(0, os.path.join(tree, "examples"))
import numpy as np, cupy as cp
from bench_float8_gpt_gpu import program, TEXT

import dataclasses
from cortado.backends.cupy.calls import cudnn_attention as ca
from cortado.backends.cupy.calls.cudnn_conv import cudnn_module, handle, DATA_TYPES

data = np.frombuffer(open(TEXT, "rb").read(), dtype=np.uint8)
_, data = np.unique(data, return_inverse=True)
step, seconds = program("large", "bfloat16", "cupy", data.astype(np.int32))
print(f"compiled in {seconds:.1f} s; attention calls: {len(ca._graphs)}", flush=True)
cudnn = cudnn_module()
stream = cp.cuda.Stream(non_blocking=True)

def buffer(x):
    count = sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + 1
    values = cp.random.standard_normal(count, dtype=cp.float32) * 0.5
    if np.dtype(x.dtype) == np.float32:
        return values
    return (values.view(cp.uint32) >> 16).astype(cp.uint16)

def graph_of(call, described):
    dtype = np.dtype(call.operands[0].dtype)
    io = getattr(cudnn.data_type, DATA_TYPES[dtype.name])
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT, handle=handle())
    inputs = [g.tensor(dim=d, stride=s, data_type=io if x.dtype == dtype else cudnn.data_type.FLOAT) for x, (d, s) in zip(call.operands, described)]
    if call.forward:
        results = g.sdpa(q=inputs[0], k=inputs[1], v=inputs[2], attn_scale=call.scale, generate_stats=True, use_causal_mask=call.causal)
    else:
        q, k, v, o, dout, stats = inputs
        results = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=dout, stats=stats, attn_scale=call.scale, use_causal_mask=call.causal,
                                  use_deterministic_algorithm=call.deterministic)
    for t, x, (d, s) in zip(results, call.results, described[len(call.operands):]):
        t.set_output(True).set_dim(d).set_stride(s).set_data_type(io if x.dtype == dtype else cudnn.data_type.FLOAT)
    g.validate(); g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    return g, tuple(inputs) + tuple(results)

calls = set()
for key in ca._graphs:
    calls.add(key)
    if not key.forward:
        calls.add(dataclasses.replace(key, deterministic=not key.deterministic))
for call in sorted(calls, key=lambda c: (not c.forward, not c.deterministic)):
    print(("forward" if call.forward else f"backward deterministic={call.deterministic}"),
          [(x.shape, x.strides) for x in call.operands + call.results], flush=True)
    described = [ca.four_dims(x.shape, x.strides) for x in call.operands + call.results]
    try:
        g, tensors = graph_of(call, described)
    except Exception as e:
        print("  build failed:", e); continue
    arrays = [buffer(x) for x in call.operands + call.results]
    pack = dict(zip(tensors, [a.data.ptr for a in arrays]))
    n = g.get_execution_plan_count()
    for i in range(n):
        try:
            name = g.get_plan_name_at_index(i)
            ws = g.get_workspace_size_plan_at_index(i)
            w = cp.empty(max(ws, 1), dtype=cp.uint8)
            with stream:
                cudnn.set_stream(handle(), stream.ptr)
                for _ in range(3):
                    g.execute_plan_at_index(pack, w.data.ptr, i, handle=handle())
                times = []
                for _ in range(5):
                    a = stream.record()
                    for _ in range(10):
                        g.execute_plan_at_index(pack, w.data.ptr, i, handle=handle())
                    b = stream.record(); b.synchronize()
                    times.append(cp.cuda.get_elapsed_time(a, b) / 10)
            print(f"  plan {i}: {name}: {1e3*np.median(times):.1f} us (min {1e3*min(times):.1f}), workspace {ws} B", flush=True)
        except Exception as e:
            print(f"  plan {i}: failed: {str(e)[:200]}", flush=True)
