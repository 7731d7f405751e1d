"""torch's scaled_dot_product_attention backends at the GPT's attention shape: q, k and v views of one
(batch, time, 3, heads, size) projection, the forward pass and the forward and backward passes, then a profile of
the flash attention backend's kernels."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, T, H, D = 8, 1024, 12, 64
qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
grad_out = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)


def views():
    return [qkv[:, :, i].transpose(1, 2) for i in range(3)]


def timed(fn, n=20):
    """Microseconds a call: the middle of five rounds of ``n`` calls between two events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    return sorted(times)[2] * 1e3


def forward():
    q, k, v = views()
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def both():
    torch.autograd.grad(forward(), qkv, grad_out)


for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    try:
        with sdpa_kernel(backend):
            fwd, total = timed(forward), timed(both)
        print(f"torch {backend.name}: forward {fwd:.1f} us, forward+backward {total:.1f} us, "
              f"backward ~{total - fwd:.1f} us", flush=True)
    except RuntimeError as error:
        print(f"torch {backend.name}: failed {str(error)[:200]}")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(5):
            both()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
