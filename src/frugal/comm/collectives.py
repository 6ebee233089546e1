"""The gradient exchanges a `Plan` prices per stage, run over torch.distributed.

A plan records, per stage, the collective its cost model chose for that stage's data-parallel
group (`Plan.dp_collective`, one of `frugal.parallel.plan.DP_COLLECTIVES`). `COLLECTIVES`
holds one `DPCollectiveSpec` per name, so the runtime runs the collective the plan priced, and
never branches on its name:

- `ring`: `dist.all_reduce` (a ring under gloo and NCCL); what runs when a plan records no
  collective.
- `central_ps`: a central parameter server on the group's lowest rank: `dist.reduce` to it,
  then `dist.broadcast` from it (a plan does not record which member the planner priced as
  the server).
- `seq_peer`: the DT-FM runtime's sequential peer exchange: member i owns the i-th 1/K slice
  of the vector; every member sends each slice to its owner (`dist.all_to_all_single`), the
  owner sums the K copies in member order, and the sums are all-gathered.

Each sums a float32 vector over the group in place (the mean follows from the runtime's loss
scaling), within a timeout, and knows the directed links its messages use (for the emulated
bottleneck link) and its network seconds on that link, the planner's formulas on a uniform
link (`frugal.planner.iteration`).

Shape legend: n values of the vector, K members, c = padded n / K values per slice.

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (its runtime's data-parallel exchanges, priced by `frugal.planner`).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from frugal import FrugalError
from frugal.comm.link import LinkSpec
from frugal.registry import Registry

if TYPE_CHECKING:
    from frugal.comm.shaped import ShapedGroup

__all__ = [
    "COLLECTIVES",
    "CentralPSCollective",
    "DPCollectiveSpec",
    "DPSyncError",
    "RingCollective",
    "SeqPeerCollective",
    "bottleneck_link",
    "wait_work",
]


class DPSyncError(FrugalError):
    """A data-parallel collective failed or did not finish within the timeout."""


def wait_work(work: Any, what: str, timeout_s: float) -> None:
    """Wait for an async torch.distributed work handle, at most `timeout_s` seconds.

    Args:
        work: The handle (`async_op=True`).
        what: The operation, for the message ("step 3: gradient all-reduce").
        timeout_s: The limit, seconds.

    Raises:
        DPSyncError: If the collective fails or does not finish in time.
    """
    try:
        ok = work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise DPSyncError(f"{what} failed: {str(exc).splitlines()[0]}") from exc
    if ok is False:
        raise DPSyncError(f"{what} did not finish in {timeout_s} s")


def bottleneck_link(
    edges: Sequence[tuple[int, int]], table: dict[tuple[int, int], LinkSpec]
) -> LinkSpec | None:
    """Slowest bandwidth and largest latency over the directed links `edges` (None if none).

    Args:
        edges: (src, dst) rank pairs.
        table: The LinkSpec of every directed pair (`frugal.comm.link.link_table`).
    """
    if not edges:
        return None
    links = [table[edge] for edge in edges]
    return LinkSpec(
        bandwidth_bits_per_s=min(e.bandwidth_bits_per_s for e in links),
        latency_s=max(e.latency_s for e in links),
    )


def _check_network_args(num_bytes: int, group_size: int) -> None:
    if num_bytes < 0 or group_size < 1:
        raise ValueError(f"num_bytes={num_bytes} must be >= 0 and group_size={group_size} >= 1")


def _transfer_s(num_bytes: float, link: LinkSpec) -> float:
    if not math.isfinite(link.bandwidth_bits_per_s):
        return 0.0
    return 8.0 * num_bytes / link.bandwidth_bits_per_s


def _slice_rounds_s(num_bytes: int, group_size: int, link: LinkSpec) -> float:
    """2 (K - 1) messages of num_bytes / K in turn, each paying the latency (ring, seq_peer)."""
    _check_network_args(num_bytes, group_size)
    if group_size == 1 or not link.is_shaped:
        return 0.0
    k = group_size
    return 2.0 * (k - 1) * (_transfer_s(num_bytes / k, link) + link.latency_s)


class DPCollectiveSpec:
    """One gradient exchange of a stage's replicas: how it runs, which links, how long.

    Attributes:
        description: One line for messages and the docs.
    """

    description: str = ""

    def edges(self, members: Sequence[int]) -> list[tuple[int, int]]:
        """The directed (src, dst) rank pairs its messages use, for K = len(members) ranks.

        Args:
            members: The group's global ranks, in pipeline order.
        """
        raise NotImplementedError

    def network_s(self, num_bytes: int, group_size: int, link: LinkSpec) -> float:
        """Network seconds to sum `num_bytes` per member over `group_size` on `link`.

        0 for K = 1 or an unshaped link.

        Raises:
            ValueError: If num_bytes < 0 or group_size < 1.
        """
        raise NotImplementedError

    def sum_(self, flat: Tensor, group: dist.ProcessGroup, *, what: str, timeout_s: float) -> None:
        """Replace `flat` by its sum over the group, identical on every member.

        Args:
            flat: This member's vector, (n,) float32, contiguous.
            group: The replicas' process group.
            what: The operation, for messages.
            timeout_s: Limit of each collective.

        Raises:
            DPSyncError: If a collective fails or times out.
        """
        raise NotImplementedError

    def shaped_sum_(self, flat: Tensor, shaped: ShapedGroup, *, what: str) -> None:
        """`sum_` as messages through the emulated links (`frugal.comm.shaped.ShapedGroup`).

        Raises:
            DPSyncError: If a message fails or a round times out.
        """
        raise NotImplementedError


class RingCollective(DPCollectiveSpec):
    """`ring`: torch.distributed's all-reduce (a ring under gloo and NCCL)."""

    description = "ring all-reduce"

    def edges(self, members: Sequence[int]) -> list[tuple[int, int]]:
        """members[0] -> members[1] -> ... -> members[0] (none for one member)."""
        if len(members) < 2:
            return []
        return list(zip(members, [*members[1:], members[0]], strict=True))

    def network_s(self, num_bytes: int, group_size: int, link: LinkSpec) -> float:
        """2 (K - 1) steps of num_bytes / K and the latency: 2 (K - 1) (8 S / (K B) + latency)."""
        return _slice_rounds_s(num_bytes, group_size, link)

    def sum_(self, flat: Tensor, group: dist.ProcessGroup, *, what: str, timeout_s: float) -> None:
        """`dist.all_reduce` (sum)."""
        wait_work(dist.all_reduce(flat, group=group, async_op=True), what, timeout_s)

    def shaped_sum_(self, flat: Tensor, shaped: ShapedGroup, *, what: str) -> None:
        """Reduce-scatter then all-gather around the ring, 2 (K - 1) shaped rounds."""
        shaped.ring_sum_(flat, what)


class CentralPSCollective(DPCollectiveSpec):
    """`central_ps`: reduce to the group's lowest rank, then broadcast from it."""

    description = "central parameter server on the group's lowest rank"

    def edges(self, members: Sequence[int]) -> list[tuple[int, int]]:
        """Every member to the server (the lowest rank) and back."""
        server = min(members)
        return [edge for m in members if m != server for edge in ((m, server), (server, m))]

    def network_s(self, num_bytes: int, group_size: int, link: LinkSpec) -> float:
        """Up and down, each the slower of one message and the server's K - 1 shared ones.

        2 max(8 S / B + latency, (K - 1) 8 S / B), the planner's `central_ps` on one link.
        """
        _check_network_args(num_bytes, group_size)
        if group_size == 1 or not link.is_shaped:
            return 0.0
        one = _transfer_s(num_bytes, link)
        return 2.0 * max(one + link.latency_s, (group_size - 1) * one)

    def sum_(self, flat: Tensor, group: dist.ProcessGroup, *, what: str, timeout_s: float) -> None:
        """`dist.reduce` to the lowest rank, `dist.broadcast` from it."""
        server = dist.get_global_rank(group, 0)  # new_group sorts: group rank 0 is the lowest
        work = dist.reduce(flat, dst=server, group=group, async_op=True)
        wait_work(work, f"{what} (reduce to rank {server})", timeout_s)
        work = dist.broadcast(flat, src=server, group=group, async_op=True)
        wait_work(work, f"{what} (broadcast from rank {server})", timeout_s)

    def shaped_sum_(self, flat: Tensor, shaped: ShapedGroup, *, what: str) -> None:
        """Every vector to the lowest rank over its link, the sum back over each."""
        shaped.reduce_broadcast_(flat, what)


class SeqPeerCollective(DPCollectiveSpec):
    """`seq_peer`: each 1/K slice to its owner, summed there, then all-gathered."""

    description = "sequential peer exchange (slices to their owners, then all-gather)"

    def edges(self, members: Sequence[int]) -> list[tuple[int, int]]:
        """Every ordered pair of distinct members."""
        return [(a, b) for a in members for b in members if a != b]

    def network_s(self, num_bytes: int, group_size: int, link: LinkSpec) -> float:
        """K - 1 slices of num_bytes / K out, as many back: 2 (K - 1) (8 S / (K B) + latency)."""
        return _slice_rounds_s(num_bytes, group_size, link)

    def sum_(self, flat: Tensor, group: dist.ProcessGroup, *, what: str, timeout_s: float) -> None:
        """All-to-all of the slices, the owner's sum in member order, all-gather of the sums."""
        from frugal.comm.shaped import DirectGroup

        direct = DirectGroup(group, timeout_s=timeout_s)
        _seq_peer(flat, direct.size, direct.all_to_all_single, direct.all_gather, what)

    def shaped_sum_(self, flat: Tensor, shaped: ShapedGroup, *, what: str) -> None:
        """The same exchange, every slice a message over its own link."""
        _seq_peer(flat, shaped.size, shaped.all_to_all_single, shaped.all_gather, what)


def _seq_peer(
    flat: Tensor,
    k: int,
    all_to_all: Callable[[Tensor, Tensor, str], None],
    all_gather: Callable[[Sequence[Tensor], Tensor, str], None],
    what: str,
) -> None:
    n = flat.numel()
    c = max(1, math.ceil(n / k))
    padded = torch.zeros(k * c, dtype=flat.dtype)
    padded[:n] = flat
    incoming = torch.empty_like(padded)
    all_to_all(incoming, padded, f"{what} (slices to their owners)")
    pieces = incoming.view(k, c)
    total = pieces[0].clone()
    for j in range(1, k):
        total += pieces[j]
    gathered = [torch.empty_like(total) for _ in range(k)]
    all_gather(gathered, total, f"{what} (all-gather of the sums)")
    flat.copy_(torch.cat(gathered)[:n])


COLLECTIVES: Registry[DPCollectiveSpec] = Registry("DP collective", field="dp_collective")
"""The runtime of every collective a plan may name (`frugal.parallel.plan.DP_COLLECTIVES`)."""

COLLECTIVES.register("seq_peer", SeqPeerCollective())
COLLECTIVES.register("ring", RingCollective())
COLLECTIVES.register("central_ps", CentralPSCollective())
