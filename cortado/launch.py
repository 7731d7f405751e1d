"""``python -m cortado.launch --gpus N script.py [args]``: run ``script.py`` as N processes, one a GPU.

Each process gets ``RANK`` and ``LOCAL_RANK`` (its index), ``WORLD_SIZE`` (N), ``MASTER_ADDR`` and
``MASTER_PORT`` (a free port on this machine, where rank 0 hands out NCCL's id), as torchrun sets
them, so a script that calls ``ct.distributed.init()`` runs the same under either, or under a
cluster's scheduler. NVLink multicast is kept off in every process (``NCCL_NVLS_ENABLE=0`` and its
PyTorch and NVSHMEM twins). When one process fails, the others are stopped, and the launcher exits
with the first failure's status.

A job over several machines starts one launcher on each, all told the same ``--nodes``, ``--master-addr`` (an
address of node 0 the others reach) and ``--master-port``, each its own ``--node-rank``: node ``k``'s processes
are ranks ``k N`` to ``k N + N - 1`` of ``nodes N``, with local ranks 0 to N - 1 (docs/gpu.md, "Several machines").

    python -m cortado.launch --nodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --gpus 8 train.py
    python -m cortado.launch --nodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 --gpus 8 train.py
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


def environments(gpus, port, base=None, nodes=1, node_rank=0, address="127.0.0.1"):
    """The environment of each of the ``gpus`` processes of node ``node_rank`` of ``nodes``, from ``base`` (this
    one's by default), rank 0 at ``address:port``."""
    base = dict(os.environ if base is None else base)
    return [{**base, **MULTICAST_OFF, "RANK": str(node_rank * gpus + r), "LOCAL_RANK": str(r),
             "WORLD_SIZE": str(nodes * gpus), "LOCAL_WORLD_SIZE": str(gpus), "GROUP_RANK": str(node_rank),
             "MASTER_ADDR": address, "MASTER_PORT": str(port)}
            for r in range(gpus)]


def launch(gpus, command, nodes=1, node_rank=0, address="127.0.0.1", port=None):
    """Run ``command`` (a list: the program and its arguments) as the ``gpus`` ranks of node ``node_rank`` of
    ``nodes`` (rank 0 at ``address:port``; a free port of this machine where there is one node and no port); the
    exit status of this node's processes."""
    port = _free_port() if port is None else port
    processes = [subprocess.Popen(command, env=env) for env in environments(gpus, port, None, nodes, node_rank, address)]
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
    parser.add_argument("--gpus", type=int, required=True, help="how many processes (GPUs) to start on this node")
    parser.add_argument("--nodes", type=int, default=1, help="how many machines the job spans (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this machine's index among them, from 0")
    parser.add_argument("--master-addr", help="an address of node 0 every node reaches (needed with --nodes > 1)")
    parser.add_argument("--master-port", type=int, help="the port rank 0 listens on (needed with --nodes > 1)")
    parser.add_argument("script", help="the Python script each process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    given = parser.parse_args(argv)
    if given.gpus < 1:
        parser.error(f"--gpus must be at least 1, not {given.gpus}")
    if given.nodes < 1 or not 0 <= given.node_rank < given.nodes:
        parser.error(f"--node-rank must be from 0 to --nodes - 1, not {given.node_rank} of {given.nodes}")
    if given.nodes > 1 and (given.master_addr is None or given.master_port is None):
        parser.error("a job of several nodes needs --master-addr and --master-port, the same on every node")
    return launch(given.gpus, [sys.executable, given.script, *given.args], given.nodes, given.node_rank,
                  given.master_addr or "127.0.0.1", given.master_port)


if __name__ == "__main__":
    sys.exit(main())
