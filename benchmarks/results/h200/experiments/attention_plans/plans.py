"""Every cuDNN SDPA plan for the GPT large step's attention (8 x 12 heads x 1024 x 64, bfloat16, causal, q/k/v read
from the qkv product's rows and the output written time-major, as the step stores them), each timed over 20 calls
replayed in a CUDA graph. On the GPU machine, from the repository root, with the carried wheels on PYTHONPATH:
``python3 benchmarks/results/h200/experiments/attention_plans/plans.py``."""
import cudnn
import cupy

B, H, T, D = 8, 12, 1024, 64
QKV_STRIDES = [T * 3 * H * D, D, 3 * H * D, 1]  # q, k and v: columns of the qkv product's rows
OUT_STRIDES = [T * H * D, D, H * D, 1]  # time-major: the heads of a position side by side
STATS_STRIDES = [H * T, T, 1, 1]
BF16, FLOAT = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT

handle = cudnn.create_handle()
stream = cupy.cuda.Stream(non_blocking=True)
cudnn.set_stream(handle, stream.ptr)


def bfloat16_bits(a):
    """float32 values rounded to bfloat16 (to nearest even), as uint16 bits."""
    u = a.astype(cupy.float32).view(cupy.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cupy.uint16)


qkv = bfloat16_bits(cupy.random.standard_normal((B, T, 3 * H * D), dtype=cupy.float32) * 0.5)
out = cupy.zeros((B, T, H * D), cupy.uint16)
stats = cupy.zeros((B, H, T, 1), cupy.float32)
d_out = bfloat16_bits(cupy.random.standard_normal((B, T, H * D), dtype=cupy.float32))
d_qkv = cupy.zeros_like(qkv)


def timed(call, calls=20):
    """Microseconds one ``call()`` takes, replayed ``calls`` times in a CUDA graph."""
    call()
    stream.synchronize()
    stream.begin_capture()
    for _ in range(calls):
        call()
    graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    start = stream.record()
    graph.launch(stream)
    end = stream.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / calls * 1e3


def built(forward, deterministic=True):
    """The cuDNN graph of the forward or backward pass with every plan built, and its tensors' addresses."""
    g = cudnn.pygraph(io_data_type=BF16, intermediate_data_type=FLOAT, compute_data_type=FLOAT, handle=handle)
    q, k, v = (g.tensor(dim=[B, H, T, D], stride=QKV_STRIDES, data_type=BF16) for _ in range(3))
    places = {q: qkv.data.ptr, k: qkv.data.ptr + 2 * H * D, v: qkv.data.ptr + 4 * H * D}
    if forward:
        o, st = g.sdpa(q=q, k=k, v=v, attn_scale=0.125, generate_stats=True, use_causal_mask=True, name="attention")
        o.set_output(True).set_dim([B, H, T, D]).set_stride(OUT_STRIDES).set_data_type(BF16)
        st.set_output(True).set_dim([B, H, T, 1]).set_stride(STATS_STRIDES).set_data_type(FLOAT)
        places.update({o: out.data.ptr, st: stats.data.ptr})
    else:
        o, do = (g.tensor(dim=[B, H, T, D], stride=OUT_STRIDES, data_type=BF16) for _ in range(2))
        st = g.tensor(dim=[B, H, T, 1], stride=STATS_STRIDES, data_type=FLOAT)
        grads = g.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=st, attn_scale=0.125, use_causal_mask=True,
                                use_deterministic_algorithm=deterministic, name="attention_grad")
        for grad in grads:
            grad.set_output(True).set_dim([B, H, T, D]).set_stride(QKV_STRIDES).set_data_type(BF16)
        places.update({o: out.data.ptr, do: d_out.data.ptr, st: stats.data.ptr})
        places.update({grad: d_qkv.data.ptr + 2 * H * D * j for j, grad in enumerate(grads)})
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    return g, places


for forward, deterministic in ((True, True), (False, True), (False, False)):
    graph, places = built(forward, deterministic)
    count = graph.get_execution_plan_count()
    print("forward" if forward else f"backward deterministic={deterministic}", count, "plans", flush=True)
    for index in range(count):
        try:
            workspace = cupy.zeros(max(1, graph.get_workspace_size_plan_at_index(index)), cupy.uint8)
            us = timed(lambda g=graph, p=places, w=workspace, i=index:
                       g.execute_plan_at_index(p, w.data.ptr, i, handle=handle))
            print(f"  plan {index} {graph.get_plan_name_at_index(index)}: {us:.1f} us (workspace {workspace.nbytes})",
                  flush=True)
        except Exception as error:  # a plan that refuses these operands
            print(f"  plan {index}: {type(error).__name__} {str(error)[:150]}", flush=True)
