"""A stream held until the host lets go of it.

``Program.profile`` puts an event before and after each of a step's calls. Launched one by one from Python, the
calls reach an idle GPU a few microseconds apart, and each pair of events would time the Python between them as
well as the kernel. Behind a hold, the calls queue up while the host launches them and then run back to back, so
the events time the kernels. A hold is a one-thread kernel that waits until a counter in pinned host memory (read
by the GPU where the host writes it) reaches its turn, and gives up after ``LIMIT_NS`` whatever happens: a host
that never lets go costs a profile that long, never a hang. Loading a kernel's module waits for the GPU, so only
kernels launched before (a step's second run) may be queued behind a hold.
"""

import numpy as np

LIMIT_NS = 2_000_000_000
_SOURCE = r"""
extern "C" __global__ void ct_hold(const volatile unsigned int* released, unsigned int turn,
                                   unsigned long long limit_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    if (*released >= turn) return;
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < limit_ns);
}
"""


class Hold:
    """Holds of one stream, let go in turn."""

    def __init__(self, stream):
        import cupy

        self.stream = stream
        self.memory = cupy.cuda.alloc_pinned_memory(4)  # mapped: the GPU reads it at the host's address
        self.released = np.frombuffer(self.memory, np.uint32, 1)
        self.released[0] = self.turn = 0
        self.kernel = cupy.RawKernel(_SOURCE, "ct_hold")

    def hold(self):
        """Make the stream wait, from here, for the next ``release``."""
        self.turn += 1
        with self.stream:
            self.kernel((1,), (1,), (self.memory.ptr, np.uint32(self.turn), np.uint64(LIMIT_NS)))

    def release(self):
        """Let the stream run what was queued behind the last hold."""
        self.released[0] = self.turn
