"""The CNN example's step, built afresh again and again: is its state after four steps the same bits every time?

``tests/test_gpu_beside.py``'s CNN case (CUDA graphs) failed twice in whole GPU suites, its first state (conv1.weight)
differing between the step with updates beside and the same program's profile, which runs every kernel in order.
Each round here builds four programs and runs each four steps on the same feeds:

- ``beside``: updates beside the step, CUDA graphs (the test's step);
- ``in order``: every kernel in order (``overlap_updates=False``), CUDA graphs;
- ``profile``: the ``beside`` program's twin, run by ``profile`` (the test's reference);
- ``profile again``: another twin, run by ``profile``.

and names the state that differs from ``profile``'s, with the largest difference, for each of the others. With
``--garbage`` each program's arena is first filled with bytes of its own (0xFF, 0x00, 0x7F, 0x3C): a kernel that read
a place of the arena before anything wrote it this step would then give other bits.

    python3 repeat.py [rounds] [--garbage]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "tests"))
import test_gpu_beside as suite  # noqa: E402


def differences(a, b):
    found = []
    for name in a.state:
        x, y = a.state[name].get(), b.state[name].get()
        if not np.array_equal(x, y, equal_nan=True):
            found.append(f"{name} ({float(np.max(np.abs(x.astype(np.float64) - y))):.3g})")
    return found


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20
    garbage = "--garbage" in sys.argv
    failures = {"beside": 0, "in order": 0, "profile again": 0}
    for r in range(rounds):
        beside, feeds = suite._cnn(cuda_graph=True)
        in_order, _ = suite._cnn(cuda_graph=True, overlap_updates=False)
        profile, _ = suite._cnn(cuda_graph=True)
        again, _ = suite._cnn(cuda_graph=True)
        if garbage:
            for program, byte in ((beside, 0xFF), (in_order, 0x00), (profile, 0x7F), (again, 0x3C)):
                program._executor.arena.memory.fill(byte)
        for _ in range(4):
            beside(**feeds)
            in_order(**feeds)
            profile.profile(**feeds)
            again.profile(**feeds)
        for label, program in (("beside", beside), ("in order", in_order), ("profile again", again)):
            found = differences(program, profile)
            if found:
                failures[label] += 1
                print(f"round {r}: {label} differs from the profile in {len(found)} of {len(profile.state)}: "
                      f"{', '.join(found[:8])}", flush=True)
        print(f"round {r} done: {failures}", flush=True)
    print(f"{rounds} rounds; rounds whose state differed from the profile's: {failures}")


if __name__ == "__main__":
    main()
