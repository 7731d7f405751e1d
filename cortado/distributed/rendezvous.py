"""How the ranks of a job find each other: rank 0 hands a few bytes (NCCL's unique id) to every other rank
over TCP at ``MASTER_ADDR:MASTER_PORT``, as torch.distributed's TCP store does.

Under torchrun, whose agent already serves its key-value store at that address
(``TORCHELASTIC_USE_AGENT_STORE=True``), the bytes go through that store instead: torch is there, as
torchrun is torch's. Rank 0 listens on every interface: the other nodes reach it by an address its
own node may resolve otherwise (a hostname that /etc/hosts maps to 127.0.1.1, say)."""

import os
import socket
import struct
import time

from ..errors import BackendError

TIMEOUT_S = 300.0  # how long a rank waits for the others: a job's processes start within seconds, or not at all
ATTEMPT_S = 5.0  # one try to reach rank 0, whose node may still be starting


def share(payload, rank, world_size, address, port, timeout=TIMEOUT_S):
    """``payload`` (bytes) of rank 0, on every rank: rank 0 listens and sends it to the ``world_size - 1``
    others, which connect (retrying while rank 0 is not listening yet)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return _through_torch_store(payload, rank, address, port, timeout)
    if rank == 0:
        return _serve(payload, world_size - 1, port, timeout)
    return _fetch(address, port, timeout)


def _through_torch_store(payload, rank, address, port, timeout):
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(address, port, is_master=False, timeout=timedelta(seconds=timeout))
    key = f"cortado/nccl_unique_id/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if rank == 0:
        store.set(key, payload)
        return payload
    return store.get(key)


def _serve(payload, peers, port, timeout):
    message = struct.pack("!I", len(payload)) + payload
    with socket.create_server(("", port), reuse_port=False) as server:
        server.settimeout(timeout)
        for _ in range(peers):
            try:
                connection, _ = server.accept()
            except TimeoutError:
                raise BackendError(f"cortado.distributed: rank 0 waited {timeout:.0f} s on port {port} for "
                                   f"{peers} other rank(s) to connect; did every process start?") from None
            with connection:
                connection.sendall(message)
    return payload


def _fetch(address, port, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=ATTEMPT_S) as connection:
                connection.settimeout(timeout)
                (length,) = struct.unpack("!I", _exactly(connection, 4))
                return _exactly(connection, length)
        except OSError:  # refused, reset, unreachable, not resolved yet, timed out: rank 0 is not there yet
            if time.monotonic() > deadline:
                raise BackendError(f"cortado.distributed: no rank 0 answered at {address}:{port} within "
                                   f"{timeout:.0f} s (MASTER_ADDR, MASTER_PORT)") from None
            time.sleep(0.05)


def _exactly(connection, count):
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise BackendError("cortado.distributed: rank 0 closed the rendezvous before sending the NCCL id")
        data += chunk
    return data
