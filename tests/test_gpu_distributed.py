"""Data parallelism on GPUs: a step on two ranks equals the one-GPU step on the concatenated batch (to float32
rounding), for an MLP and a CNN, through the launcher, NCCL and CUDA graphs; so does a world of one on one GPU.
Skipped where there are too few GPUs. The CPU side is tests/test_distributed.py's."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cortado.backends import gpu_visible

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import distributed_job as job  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU is visible")]


def gpu_count():
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def one_gpu_run(kind, global_batch, **options):
    """The plain step on the whole of each global batch: its losses and final state."""
    import cupy

    step, data, params = job.program(kind, global_batch, global_batch, **options)
    losses = [float(step(x=cupy.asarray(x), y=cupy.asarray(y))) for x, y in data]
    return np.array(losses), {v.name: cupy.asnumpy(step.state[v.name]) for v in params}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_a_world_of_one_on_the_gpu_is_the_plain_program_to_float32_rounding(kind):
    """Not bit for bit: the plain program folds an SGD step into its GEMM's epilogue (``W - lr * x^T dy``, one
    cuBLASLt call, one rounding), and the average now stands between the two."""
    losses, state = one_gpu_run(kind, 32)
    parallel_losses, parallel_state = one_gpu_run(kind, 32, data_parallel=job.CAPS)
    np.testing.assert_allclose(parallel_losses, losses, rtol=1e-6)
    for name, value in state.items():
        np.testing.assert_allclose(parallel_state[name], value, rtol=1e-5, atol=1e-6)


LAUNCHERS = {"cortado": ["-m", "cortado.launch", "--gpus", "2"],
             "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]}


@pytest.mark.skipif(not gpu_visible() or gpu_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("kind, launcher", [("mlp", "cortado"), ("cnn", "cortado"), ("mlp", "torchrun")])
def test_two_ranks_equal_one_gpu_on_the_concatenated_batch(kind, launcher, tmp_path):
    if launcher == "torchrun":
        pytest.importorskip("torch")
    run = subprocess.run([sys.executable, *LAUNCHERS[launcher], str(HERE / "distributed_job.py"), str(tmp_path), kind,
                          "64"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert int(ranks[0]["buckets"]) >= 2
    losses, state = one_gpu_run(kind, 64)
    np.testing.assert_allclose((ranks[0]["losses"] + ranks[1]["losses"]) / 2, losses, rtol=1e-5)
    for name, value in state.items():
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])  # the ranks hold the same parameters
        np.testing.assert_allclose(ranks[0][name], value, rtol=1e-4, atol=1e-6)
