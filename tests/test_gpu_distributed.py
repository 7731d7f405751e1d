"""Data parallelism on GPUs: a step on every world size from two ranks to the machine's GPUs (odd ones too) equals
the one-GPU step on the concatenated batch (to float32 rounding), for an MLP and a CNN, through both launchers (ours
and torchrun), NCCL and CUDA graphs; so does a job started as two nodes by two launchers, and a world of one on one
GPU. Skipped where there are too few GPUs. The CPU side is tests/test_distributed.py's."""

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


def launcher_command(launcher, ranks):
    """How ``launcher`` ("cortado" or "torchrun") starts ``ranks`` processes on this machine."""
    if launcher == "torchrun":
        return ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    return ["-m", "cortado.launch", "--gpus", str(ranks)]


SHARD = 16  # each rank's rows of a global batch: the one-GPU step's mean is then the mean of the ranks' means
WORLD_SIZES = list(range(2, gpu_count() + 1)) if gpu_visible() and gpu_count() >= 2 else [2]  # odd ones too


def check_ranks(kind, ranks, folder):
    """Every rank of a finished job holds the same parameters, and they and the mean of the ranks' losses are the
    one-GPU step's on the concatenated batch."""
    saved = [np.load(folder / f"rank{r}.npz") for r in range(ranks)]
    assert int(saved[0]["buckets"]) >= 2
    losses, state = one_gpu_run(kind, SHARD * ranks)
    np.testing.assert_allclose(np.mean([r["losses"] for r in saved], axis=0), losses, rtol=1e-5)
    for name, value in state.items():
        for other in saved[1:]:
            np.testing.assert_array_equal(other[name], saved[0][name])
        np.testing.assert_allclose(saved[0][name], value, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not gpu_visible() or gpu_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("ranks", WORLD_SIZES)
@pytest.mark.parametrize("kind, launcher", [("mlp", "cortado"), ("cnn", "cortado"), ("mlp", "torchrun"),
                                            ("cnn", "torchrun")])
def test_every_world_size_equals_one_gpu_on_the_concatenated_batch(ranks, kind, launcher, tmp_path):
    if launcher == "torchrun":
        pytest.importorskip("torch")
    run = subprocess.run([sys.executable, *launcher_command(launcher, ranks), str(HERE / "distributed_job.py"),
                          str(tmp_path), kind, str(SHARD * ranks)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check_ranks(kind, ranks, tmp_path)


@pytest.mark.skipif(not gpu_visible() or gpu_count() < 2, reason="needs two GPUs")
def test_two_launchers_given_node_ranks_train_one_job(tmp_path):
    """Two launcher groups started as two nodes of one job would be (``--nodes 2 --node-rank k``), here on one machine
    with half its GPUs each: the job's ranks train as one world."""
    import os
    import socket

    per_node = gpu_count() // 2
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    groups = []
    for node in (1, 0):
        visible = ",".join(str(node * per_node + g) for g in range(per_node))
        command = [sys.executable, "-m", "cortado.launch", "--nodes", "2", "--node-rank", str(node), "--master-addr",
                   "127.0.0.1", "--master-port", port, "--gpus", str(per_node), str(HERE / "distributed_job.py"),
                   str(tmp_path), "mlp", str(SHARD * 2 * per_node)]
        groups.append(subprocess.Popen(command, env={**os.environ, "CUDA_VISIBLE_DEVICES": visible},
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for group in groups:
        out, err = group.communicate(timeout=600)
        assert group.returncode == 0, out[-3000:] + err[-3000:]
    check_ranks("mlp", 2 * per_node, tmp_path)
