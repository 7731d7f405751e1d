"""Training on several GPUs: one process a GPU, the gradients averaged over NCCL inside each step.

    python -m cortado.launch --gpus 4 train.py        # or torchrun, or a cluster's scheduler

    import cortado as ct
    ct.distributed.init()                             # this process's rank, its GPU, the communicator
    step = ct.compile([loss], inputs=[x, y], state=params, updates=sgd, backend="cupy",
                      data_parallel=True)             # each rank feeds its own shard of the batch

``init`` reads what the launcher (or torchrun, or a scheduler) sets: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` (the GPU of this process on its node), ``MASTER_ADDR`` and ``MASTER_PORT`` (where
rank 0 hands out NCCL's unique id). Without them the world is this process alone, and a
data-parallel program is the plain one (its all-reduces copy), on the CPU too. NVLink multicast
stays off (``NCCL_NVLS_ENABLE=0``): on shared machines a program using it can take the GPUs down.
"""

import os
from dataclasses import dataclass

from ..errors import BackendError
from . import rendezvous
from .rewrite import Bucket, data_parallel

__all__ = ["World", "init", "world", "described_size", "Bucket", "data_parallel"]


@dataclass(frozen=True)
class World:
    """The job this process is a rank of: ``size`` processes, one GPU each; ``communicator``, NCCL's (None for
    a world of one)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    communicator: object = None


_world = World()


def world():
    """The job this process belongs to: the one ``init`` joined, else this process alone."""
    return _world


def described_size():
    """How many ranks the environment says this process's job has (``WORLD_SIZE``; 1 without it)."""
    return _integer("WORLD_SIZE", 1)


def init():
    """Join the job the environment describes (see the module docstring) and return its ``World``: selects this
    process's GPU and creates the NCCL communicator, once; a second call returns the same world."""
    global _world
    size, rank = _integer("WORLD_SIZE", 1), _integer("RANK", 0)
    local_rank = _integer("LOCAL_RANK", rank)
    if size < 1 or not 0 <= rank < size or local_rank < 0:
        raise BackendError(f"cortado.distributed.init: RANK={rank}, WORLD_SIZE={size}, LOCAL_RANK={local_rank} "
                           f"describe no job: 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0")
    if _world.communicator is not None:
        if (rank, size) != (_world.rank, _world.size):
            raise BackendError(f"cortado.distributed.init: this process is already rank {_world.rank} of "
                               f"{_world.size}")
        return _world
    if size == 1:
        _world = World(rank, size, local_rank)
        return _world
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # before NCCL reads its environment
    cupy, nccl = _nccl()
    devices = cupy.cuda.runtime.getDeviceCount()
    if local_rank >= devices:
        raise BackendError(f"cortado.distributed.init: LOCAL_RANK={local_rank}, but this node has {devices} GPU(s)")
    cupy.cuda.Device(local_rank).use()
    unique_id = _as_bytes(nccl.get_unique_id()) if rank == 0 else b""
    unique_id = rendezvous.share(unique_id, rank, size, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                 _integer("MASTER_PORT", 29500))
    try:
        communicator = nccl.NcclCommunicator(size, unique_id, rank)
    except TypeError:  # CuPy versions that take the id as a tuple of 128 signed chars
        communicator = nccl.NcclCommunicator(size, tuple(b - 256 if b > 127 else b for b in unique_id), rank)
    _world = World(rank, size, local_rank, communicator)
    return _world


def _as_bytes(unique_id):
    """NCCL's unique id as 128 bytes: CuPy gives bytes, or in older versions a tuple of signed chars."""
    return unique_id if isinstance(unique_id, bytes) else bytes(c & 0xFF for c in unique_id)


def _integer(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise BackendError(f"cortado.distributed.init: {name}={value!r} is not an integer") from None


def nccl_module():
    """CuPy's NCCL bindings (``cupy.cuda.nccl``), for the constants of its calls."""
    return _nccl()[1]


def _nccl():
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as error:
        raise BackendError(f"cortado.distributed.init: a job of several processes needs CuPy and NCCL "
                           f"(pip install cupy-cuda13x nvidia-nccl-cu13): {error}") from None
    if not getattr(nccl, "available", True):
        raise BackendError("cortado.distributed.init: CuPy finds no NCCL library (pip install nvidia-nccl-cu13)")
    return cupy, nccl
