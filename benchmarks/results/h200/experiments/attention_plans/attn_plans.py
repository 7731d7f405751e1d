"""Every cuDNN plan of the large GPT step's attention calls (forward; backward deterministic and not), timed in
place: ``python3 attn_plans.py TREE`` (a checkout of the repository, whose step is compiled first)."""

import dataclasses
import os
import sys

tree = sys.argv[1]
sys.path[:0] = [tree, os.path.join(tree, "benchmarks"), os.path.join(tree, "examples")]

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
from bench_float8_gpt_gpu import TEXT, program  # noqa: E402

from cortado.backends.cupy.calls import cudnn_attention  # noqa: E402
from cortado.backends.cupy.calls.cudnn_conv import DATA_TYPES, cudnn_module, handle  # noqa: E402


def buffer(x):
    """Random values at ``x``'s strides: float32, or bfloat16's bits as uint16."""
    count = sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + 1
    values = cp.random.standard_normal(count, dtype=cp.float32) * 0.5
    return values if np.dtype(x.dtype) == np.float32 else (values.view(cp.uint32) >> 16).astype(cp.uint16)


def graph_of(cudnn, call, described):
    """The call's cuDNN graph with every plan of heuristics A and fallback built, and its tensors."""
    dtype = np.dtype(call.operands[0].dtype)
    io = getattr(cudnn.data_type, DATA_TYPES[dtype.name])
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle())
    inputs = [graph.tensor(dim=d, stride=s, data_type=io if x.dtype == dtype else cudnn.data_type.FLOAT)
              for x, (d, s) in zip(call.operands, described)]
    if call.forward:
        results = graph.sdpa(q=inputs[0], k=inputs[1], v=inputs[2], attn_scale=call.scale, generate_stats=True,
                             use_causal_mask=call.causal)
    else:
        q, k, v, o, dout, stats = inputs
        results = graph.sdpa_backward(q=q, k=k, v=v, o=o, dO=dout, stats=stats, attn_scale=call.scale,
                                      use_causal_mask=call.causal, use_deterministic_algorithm=call.deterministic)
    for t, x, (d, s) in zip(results, call.results, described[len(call.operands):]):
        t.set_output(True).set_dim(d).set_stride(s).set_data_type(io if x.dtype == dtype else cudnn.data_type.FLOAT)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.ALL)
    return graph, tuple(inputs) + tuple(results)


def time_plan(cudnn, graph, pack, index, stream):
    """Microseconds a call of plan ``index`` (3 calls, then 5 rounds of 10: the median and the least round), and its
    workspace."""
    workspace = graph.get_workspace_size_plan_at_index(index)
    scratch = cp.empty(max(workspace, 1), dtype=cp.uint8)
    with stream:
        cudnn.set_stream(handle(), stream.ptr)
        for _ in range(3):
            graph.execute_plan_at_index(pack, scratch.data.ptr, index, handle=handle())
        times = []
        for _ in range(5):
            start = stream.record()
            for _ in range(10):
                graph.execute_plan_at_index(pack, scratch.data.ptr, index, handle=handle())
            end = stream.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 10)
    return 1e3 * float(np.median(times)), 1e3 * min(times), workspace


def main():
    _, data = np.unique(np.frombuffer(open(TEXT, "rb").read(), dtype=np.uint8), return_inverse=True)
    _, seconds = program("large", "bfloat16", "cupy", data.astype(np.int32))
    print(f"compiled in {seconds:.1f} s; attention calls: {len(cudnn_attention._graphs)}", flush=True)
    cudnn, stream = cudnn_module(), cp.cuda.Stream(non_blocking=True)
    calls = set(cudnn_attention._graphs)
    calls |= {dataclasses.replace(c, deterministic=not c.deterministic) for c in calls if not c.forward}
    for call in sorted(calls, key=lambda c: (not c.forward, not c.deterministic)):
        values = call.operands + call.results
        print("forward" if call.forward else f"backward deterministic={call.deterministic}",
              [(x.shape, x.strides) for x in values], flush=True)
        graph, tensors = graph_of(cudnn, call, [cudnn_attention.four_dims(x.shape, x.strides) for x in values])
        arrays = [buffer(x) for x in values]
        pack = dict(zip(tensors, [a.data.ptr for a in arrays]))
        for index in range(graph.get_execution_plan_count()):
            us, least, workspace = time_plan(cudnn, graph, pack, index, stream)
            print(f"  plan {index}: {graph.get_plan_name_at_index(index)}: {us:.1f} us (min {least:.1f}), "
                  f"workspace {workspace} B", flush=True)


if __name__ == "__main__":
    main()
