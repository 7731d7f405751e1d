"""torch's SDPA backends on the GPT's attention shape, forward and forward+backward, q/k/v views of one (B,T,3,H,d)."""
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, T, H, d = 8, 1024, 12, 64
qkv = torch.randn(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
def views():
    return [qkv[:, :, i].transpose(1, 2) for i in range(3)]
go = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
def timed(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        a.record()
        for _ in range(n): fn()
        b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / n)
    return sorted(ts)[2] * 1e3
for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    try:
        with sdpa_kernel(backend):
            q, k, v = views()
            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            def both():
                q, k, v = views()
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, qkv, go)
            total = timed(both)
        print(f"torch {backend.name}: forward {fwd:.1f} us, forward+backward {total:.1f} us, backward ~{total - fwd:.1f} us", flush=True)
    except Exception as e:
        print(f"torch {backend.name}: failed {str(e)[:200]}")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(5):
            q, k, v = views(); out = F.scaled_dot_product_attention(q, k, v, is_causal=True); torch.autograd.grad(out, qkv, go)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
