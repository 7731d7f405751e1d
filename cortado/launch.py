"""``python -m cortado.launch --gpus N script.py [args]``: run ``script.py`` as N processes, one a GPU.

Each process gets ``RANK`` and ``LOCAL_RANK`` (its index), ``WORLD_SIZE`` (N), ``MASTER_ADDR`` and
``MASTER_PORT`` (a free port on this machine, where rank 0 hands out NCCL's id), as torchrun sets
them, so a script that calls ``ct.distributed.init()`` runs the same under either, or under a
cluster's scheduler. NVLink multicast is kept off in every process (``NCCL_NVLS_ENABLE=0`` and its
PyTorch and NVSHMEM twins). When one process fails, the others are stopped, and the launcher exits
with the first failure's status.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environments(gpus, port, base=None):
    """The environment of each of ``gpus`` processes, from ``base`` (this one's by default)."""
    base = dict(os.environ if base is None else base)
    return [{**base, **MULTICAST_OFF, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(gpus),
             "LOCAL_WORLD_SIZE": str(gpus), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            for r in range(gpus)]


def launch(gpus, command):
    """Run ``command`` (a list: the program and its arguments) as ``gpus`` ranks; the exit status of the job."""
    processes = [subprocess.Popen(command, env=env) for env in environments(gpus, _free_port())]
    status = 0
    try:
        while processes:
            for p in list(processes):
                code = p.poll()
                if code is None:
                    continue
                processes.remove(p)
                if code != 0 and status == 0:
                    status = code
                    for other in processes:
                        other.send_signal(signal.SIGTERM)
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in processes:
            p.send_signal(signal.SIGINT)
        for p in processes:
            p.wait()
        return 130
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cortado.launch",
                                     description="Run a training script as one process a GPU (data parallel).")
    parser.add_argument("--gpus", type=int, required=True, help="how many processes (GPUs) to start")
    parser.add_argument("script", help="the Python script each process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    given = parser.parse_args(argv)
    if given.gpus < 1:
        parser.error(f"--gpus must be at least 1, not {given.gpus}")
    return launch(given.gpus, [sys.executable, given.script, *given.args])


if __name__ == "__main__":
    sys.exit(main())
