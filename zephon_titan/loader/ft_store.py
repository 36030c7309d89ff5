"""The store a replica group meets in: a fresh one for each life of the group under torchrun.

torchft's Manager finds its group's rank 0 (the address of the ManagerServer rank 0 starts) in a TCPStore, by
default torchrun's (MASTER_ADDR:MASTER_PORT), and so does the group's own process group (env://). With one node
(static rendezvous) torchrun's store outlives a restart of the group (--max-restarts), keys and all: a restarted
rank 1 read the dead Manager's address there before the new rank 0 wrote its own (connection refused, the
group's new life over before it began), and gloo's rendezvous read the dead ranks' addresses and waited for them
(a hang, until its timeout). So rank 0 serves a fresh store for the group's life and tells where it is in
torchrun's store under a key of this restart (TORCHELASTIC_RESTART_COUNT), which no earlier life wrote.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore


def under_torchrun() -> bool:
    return "TORCHELASTIC_RESTART_COUNT" in os.environ and "MASTER_PORT" in os.environ


def fresh_group_store(rank: int, timeout: timedelta = timedelta(seconds=60)) -> tuple[str, int, TCPStore | None]:
    """(host, port) of this life's store for the Manager of the group's `rank`, and on rank 0 the store it serves
    (keep it for the group's life: the store closes with it)."""
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    told = PrefixStore(f"zephon_ft/{restarts}", agent)
    served = None
    if rank == 0:  # on rank 0's host, named as torchft's ManagerServer names it
        served = TCPStore(socket.gethostname(), 0, is_master=True, wait_for_workers=False, timeout=timeout)
        told.set("store", f"{socket.gethostname()}:{served.port}")
    host, _, port = told.get("store").decode().rpartition(":")
    return host, int(port), served
