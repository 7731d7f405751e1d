"""What an NCCL all-reduce costs beside the GEMMs it is meant to hide behind: three 8192^3 bfloat16 products alone,
an all-reduce of 128 MiB of bfloat16 (one of the large MLP's weight gradients) alone, and the two at once (the
all-reduce on a second stream). One process a GPU, through torch.distributed:

    python -m torch.distributed.run --nproc_per_node 4 benchmarks/bench_allreduce_overlap_gpu.py
    NCCL_MAX_CTAS=8 TAG=ctas8 python -m torch.distributed.run --nproc_per_node 4 benchmarks/bench_allreduce_overlap_gpu.py

Each figure is the median of five timed repeats (CUDA events, every rank at a barrier first); rank 0 prints them
and how much of the all-reduce's own time the overlap hid. Needs torch with CUDA and NCCL, and two GPUs or more.
"""

import os

import torch
import torch.distributed as dist

REPEATS, WARMUP = 5, 2


def median_ms(call):
    """The median time of ``call()`` on this rank, each repeat started at a barrier of every rank."""
    times = []
    for _ in range(REPEATS + WARMUP):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[WARMUP:])[REPEATS // 2]


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b, c = torch.randn_like(a), torch.empty_like(a)
    gradient = torch.randn(64 << 20, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()

    def products():
        for _ in range(3):
            torch.matmul(a, b, out=c)

    def all_reduce():
        dist.all_reduce(gradient)

    def both():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(gradient)
        products()
        torch.cuda.current_stream().wait_stream(side)

    all_reduce()
    alone, reduced, together = median_ms(products), median_ms(all_reduce), median_ms(both)
    if dist.get_rank() == 0:
        print(f"{os.environ.get('TAG', 'default')} on {dist.get_world_size()} GPUs: three products {alone:.3f} ms, "
              f"all-reduce of 128 MiB {reduced:.3f} ms, both at once {together:.3f} ms: the all-reduce adds "
              f"{together - alone:.3f} ms beside the products ({(alone + reduced - together) / reduced:.0%} of it hidden)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
