"""Tuning's choices taken by a later process (``backends.cupy.calls.choices``) on an NVIDIA GPU: the same program
compiled in two processes computes the same bits, the second timing no candidate."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cortado.backends import gpu_visible

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]

# A convolution (cuDNN's plans beside im2col and GEMMs), products (cuBLASLt's algorithms) and their gradients: the
# program is built and run once; it prints how many candidates its build timed and saves its results.
PROGRAM = """
import sys
import numpy as np
import cortado as ct
from cortado.backends.cupy.calls import choices, cublaslt, cudnn_conv

timed = []
for kind in (cublaslt.Gemm, cudnn_conv.Conv):
    def counted(self, *arguments, _time=kind._time):
        remembered = choices.recall("cudnn" if isinstance(self, cudnn_conv.Conv) else "cublaslt",
                                    getattr(self, "tuned_key", self.key))
        timed.append(f"{type(self).__name__} {self.key}: remembered {remembered}")
        return _time(self, *arguments)
    kind._time = counted
x, w, v = ct.var("x", (8, 3, 16, 16)), ct.var("w", (8, 3, 3, 3)), ct.var("v", (8 * 16 * 16, 40))
y = ct.reshape(ct.relu(ct.conv(x, w, padding=1)), (8, 8 * 16 * 16)) @ v
outputs = [y] + ct.grad(ct.sum(y * y), [x, w, v])
program = ct.compile(outputs, inputs=[x, w, v], backend="cupy")
rng = np.random.default_rng(0)
feeds = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in (x, w, v)}
np.savez(sys.argv[1], *[r.get() for r in program(**feeds)])
for line in timed:
    print(line, file=sys.stderr)
print(len(timed))
"""


def _run(results, cache):
    """How many candidates the program's build timed, in a process of its own whose choices are kept in ``cache``;
    each timing's call and what was remembered for it are printed."""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = {**os.environ, "CORTADO_CACHE_DIR": str(cache), "CORTADO_CHOICES_DIR": str(cache / "choices"),
           "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(results)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stderr[-6000:])
    return int(done.stdout.split()[-1])


def test_a_later_process_takes_the_choices_and_computes_the_same_bits(tmp_path):
    first, second = tmp_path / "first.npz", tmp_path / "second.npz"
    assert _run(first, tmp_path / "cache") > 0
    machines = list((tmp_path / "cache" / "choices").iterdir())  # one folder for this GPU, a file a choice
    assert len(machines) == 1 and len(list(machines[0].glob("*.json"))) >= 4  # the products' and the convolutions'
    assert _run(second, tmp_path / "cache") == 0
    with np.load(first) as a, np.load(second) as b:
        assert a.files == b.files and all(np.array_equal(a[name], b[name]) for name in a.files)
    assert _run(tmp_path / "third.npz", tmp_path / "elsewhere") > 0  # another folder remembers nothing
