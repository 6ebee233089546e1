"""Process group and RPC rendezvous on torchrun's store, one key namespace per attempt.

When torchrun restarts a failed worker group (`--max-restarts`), its agent keeps the same
c10d store, so the new processes would read the old attempt's addresses (gloo then dials a
dead peer: "Gloo connectFullMesh failed ... Connection refused", pytorch/pytorch#135712; the
pipeline's restart failed 3 times in 3 before it used this). Every frugal worker (pipeline,
recsys) therefore starts its process group (gloo, or NCCL on GPUs) with `init_group`, and
recsys's torch.distributed.rpc with the `frugal-attempt://` rendezvous handler registered here
(torch's documented extension point): both through a `PrefixStore` named after
`TORCHELASTIC_RESTART_COUNT`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore
from torch.distributed.rendezvous import register_rendezvous_handler

__all__ = ["RENDEZVOUS_URL", "attempt_store", "init_group"]

RENDEZVOUS_URL = "frugal-attempt://"


def attempt_store(rank: int, world_size: int, timeout_s: float) -> Store:
    """Torchrun's store (MASTER_ADDR:MASTER_PORT) under a prefix of this restart attempt.

    Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent hosts the store and every
    rank is a client; otherwise rank 0 hosts it.

    Raises:
        KeyError: If MASTER_ADDR or MASTER_PORT is not set (not started by torchrun).
    """
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent and rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"frugal/attempt{attempt}", base)


def _handler(url: str, **kwargs: Any) -> Iterator[tuple[Store, int, int]]:
    query = parse_qs(urlparse(url).query)
    rank, world_size = int(query["rank"][0]), int(query["world_size"][0])
    timeout = kwargs.get("timeout", datetime.timedelta(seconds=60))
    store = PrefixStore("rpc", attempt_store(rank, world_size, timeout.total_seconds()))
    yield store, rank, world_size
    raise RuntimeError("frugal-attempt:// cannot re-rendezvous; restart the job")


register_rendezvous_handler("frugal-attempt", _handler)  # type: ignore[no-untyped-call]


def init_group(
    rank: int,
    world_size: int,
    timeout_s: float,
    *,
    backend: str = "gloo",
    device: torch.device | None = None,
) -> None:
    """Start the process group on this attempt's store, with `timeout_s` per collective.

    Args:
        rank: This process's global rank.
        world_size: Processes in the job.
        timeout_s: Limit of the rendezvous and of every collective, seconds.
        backend: "gloo" (CPU tensors) or "nccl" (GPU tensors; one GPU per rank).
        device: This rank's GPU under NCCL (`cuda:{local_rank}`), bound to the group at once
            (`device_id`); None on gloo.
    """
    # The store prefix keeps "gloo" for every backend: it only has to be one per attempt.
    store = PrefixStore("gloo", attempt_store(rank, world_size, timeout_s))
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device,
    )
