"""Data-parallel traffic through the emulated links: every collective as shaped messages.

Without emulation a stage's replicas agree on gradients by torch.distributed's collectives on
the loopback. With it, `ShapedGroup` runs the same exchanges as point-to-point messages of a
data-parallel process group, each through the `LinkShaper` of its directed link (bandwidth
and latency per pair of ranks, as the pipeline's activations), so the time a collective takes
is what its messages really took on those links, heterogeneous links included, instead of a
formula on one bottleneck link.

Exchanges (K members in group order, this member i, each message one `exchange` round: every
member posts its receives, then its sends through the shapers, then waits for all):

- `ring_sum_`: reduce-scatter then all-gather around a ring, 2 (K - 1) rounds of one 1/K
  chunk each (the ring all-reduce of gloo and NCCL). The ring is the planner's `ring`: of
  the rings through the members (up to 8), the one with the least chunk transfer over its
  slowest link plus its largest latency (`best_ring`), so the exchange runs the ring the
  plan was priced on; larger groups go in group order.
- `reduce_broadcast_`: every member's vector to the lowest rank, summed there in member
  order, the sum sent back (the planner's `central_ps`).
- `all_to_all_single`, `all_gather`: every ordered pair once (the `seq_peer` exchange and the
  sharded parameter server's two steps).

Sums are formed in a fixed order, so every member ends with the same bits.

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (the data-parallel exchanges the planner prices per stage).
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from frugal.comm.link import LinkShaper, LinkSpec

__all__ = ["DirectGroup", "ShapedGroup", "best_ring"]

_MAX_RING_SEARCH = 8  # (K - 1)! rings are scored up to K = 8, as the planner does


def best_ring(
    members: Sequence[int], links: Mapping[tuple[int, int], LinkSpec], chunk_bytes: float
) -> list[int]:
    """The order of the ring all-reduce through `members` that the planner prices.

    Rings start at members[0]; each is scored 8 chunk / (slowest link's bandwidth, window
    included) + its largest latency, and the lowest score wins (the first in permutation
    order on ties, so every member picks the same). Groups over 8 keep their order.

    Args:
        members: Global ranks of the group.
        links: LinkSpec of every directed pair.
        chunk_bytes: Bytes of one ring message (a 1/K chunk).

    Returns:
        The members in ring order (each sends to the next, the last to the first).
    """
    k = len(members)
    if k < 3 or k > _MAX_RING_SEARCH:
        return list(members)

    def score(ring: Sequence[int]) -> float:
        edges = [links[(a, b)] for a, b in zip(ring, [*ring[1:], ring[0]], strict=True)]
        bandwidth = min(e.effective_bits_per_s for e in edges)
        transfer = 8.0 * chunk_bytes / bandwidth if math.isfinite(bandwidth) else 0.0
        return transfer + max(e.latency_s for e in edges)

    rings = ([members[0], *rest] for rest in itertools.permutations(members[1:]))
    return min(rings, key=score)


class ShapedGroup:
    """One data-parallel group whose messages go through this rank's link shapers.

    Args:
        group: The replicas' process group (every member builds its own `ShapedGroup`).
        links: LinkSpec of every directed pair of global ranks (`frugal.comm.link.link_table`).
        timeout_s: Limit of each exchange round.

    Raises:
        KeyError: If `links` lacks a pair of members.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        links: Mapping[tuple[int, int], LinkSpec],
        *,
        timeout_s: float,
    ) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.index = dist.get_rank(group)
        self.members = [dist.get_global_rank(group, i) for i in range(self.size)]
        self.rank = self.members[self.index]
        self.timeout_s = timeout_s
        self._links = links
        self._shapers = {
            dst: LinkShaper(links[(self.rank, dst)], name=f"dp{self.rank}->{dst}")
            for dst in self.members
            if dst != self.rank
        }
        self._round = 0

    def exchange(
        self,
        sends: Sequence[tuple[int, Tensor]],
        recvs: Sequence[tuple[int, Tensor]],
        what: str,
    ) -> None:
        """One round: receive into each `recvs` tensor from its member, send each `sends` one.

        Every member of the group must call `exchange` the same number of times (the rounds
        pair up by a counter). Members are global ranks.

        Raises:
            DPSyncError: If a message fails or the round does not finish within the timeout.
        """
        from frugal.comm.collectives import DPSyncError, wait_work

        tag = self._round % 2**20  # rounds pair up in order; the tag separates neighbours
        self._round += 1
        works = [dist.irecv(tensor, src=src, group=self.group, tag=tag) for src, tensor in recvs]

        def sender(dst: int, tensor: Tensor) -> None:
            work = dist.isend(tensor, dst=dst, group=self.group, tag=tag)
            assert work is not None
            if not work.wait(datetime.timedelta(seconds=self.timeout_s)):
                raise DPSyncError(f"{what}: the send to rank {dst} did not finish")

        handles = [
            self._shapers[dst].submit(
                tensor.numel() * tensor.element_size(),
                lambda dst=dst, tensor=tensor: sender(dst, tensor),  # type: ignore[misc]
            )
            for dst, tensor in sends
        ]
        for (src, _), work in zip(recvs, works, strict=True):
            wait_work(work, f"{what} (from rank {src})", self.timeout_s)
        for (dst, _), handle in zip(sends, handles, strict=True):
            try:
                handle.wait(self.timeout_s)
            except Exception as exc:  # the shaper's thread re-raises the send's error here
                raise DPSyncError(f"{what} (to rank {dst}): {exc}") from exc

    def ring_sum_(self, flat: Tensor, what: str) -> None:
        """Replace `flat` (n,) by its sum over the group: a shaped ring all-reduce (`best_ring`)."""
        k = self.size
        if k == 1:
            return
        c = max(1, math.ceil(flat.numel() / k))
        padded = torch.zeros(k * c, dtype=flat.dtype)
        padded[: flat.numel()] = flat
        chunks = padded.view(k, c)
        ring = best_ring(self.members, self._links, c * flat.element_size())
        i = ring.index(self.rank)
        right, left = ring[(i + 1) % k], ring[(i - 1) % k]
        incoming = torch.empty(c, dtype=flat.dtype)
        for r in range(k - 1):  # reduce-scatter: chunk (i - r - 1) accumulates from the left
            send_chunk, recv_chunk = (i - r) % k, (i - r - 1) % k
            self.exchange(
                [(right, chunks[send_chunk].clone())], [(left, incoming)], f"{what} (ring {r})"
            )
            chunks[recv_chunk] += incoming
        for r in range(k - 1):  # all-gather: member i owns the full sum of chunk (i + 1) % k
            send_chunk, recv_chunk = (i + 1 - r) % k, (i - r) % k
            self.exchange(
                [(right, chunks[send_chunk].clone())],
                [(left, incoming)],
                f"{what} (ring {k - 1 + r})",
            )
            chunks[recv_chunk].copy_(incoming)
        flat.copy_(padded[: flat.numel()])

    def reduce_broadcast_(self, flat: Tensor, what: str) -> None:
        """Sum `flat` on the group's lowest rank (member order) and send the sum back."""
        server = min(self.members)
        others = [m for m in self.members if m != server]
        if not others:
            return
        if self.rank == server:
            received = [torch.empty_like(flat) for _ in others]
            self.exchange([], list(zip(others, received, strict=True)), f"{what} (reduce)")
            total = flat.clone()
            for value in received:  # member order: the server, then the others by rank
                total += value
            flat.copy_(total)
            self.exchange([(m, flat) for m in others], [], f"{what} (broadcast)")
        else:
            self.exchange([(server, flat.clone())], [], f"{what} (reduce)")
            self.exchange([], [(server, flat)], f"{what} (broadcast)")

    def all_to_all_single(self, incoming: Tensor, outgoing: Tensor, what: str) -> None:
        """Slice j of `outgoing` to member j, slice j of `incoming` from member j (K slices)."""
        k = self.size
        out, into = outgoing.view(k, -1), incoming.view(k, -1)
        into[self.index].copy_(out[self.index])
        peers = [j for j in range(k) if j != self.index]
        self.exchange(
            [(self.members[j], out[j].clone()) for j in peers],
            [(self.members[j], into[j]) for j in peers],
            what,
        )

    def all_gather(self, outputs: Sequence[Tensor], tensor: Tensor, what: str) -> None:
        """outputs[j] = member j's `tensor`."""
        outputs[self.index].copy_(tensor)
        peers = [j for j in range(self.size) if j != self.index]
        self.exchange(
            [(self.members[j], tensor) for j in peers],
            [(self.members[j], outputs[j]) for j in peers],
            what,
        )

    @property
    def sent_bytes(self) -> dict[int, int]:
        """Bytes this member sent to each other member so far (through its shapers)."""
        return {dst: shaper.sent_bytes for dst, shaper in self._shapers.items()}

    def close(self) -> None:
        """Stop the shaper threads."""
        for shaper in self._shapers.values():
            shaper.close()


class DirectGroup:
    """The exchanges of `ShapedGroup` by torch.distributed's collectives, unshaped.

    Args:
        group: The process group.
        timeout_s: Limit of each collective.
    """

    def __init__(self, group: dist.ProcessGroup, *, timeout_s: float) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.timeout_s = timeout_s

    def all_to_all_single(self, incoming: Tensor, outgoing: Tensor, what: str) -> None:
        """`dist.all_to_all_single` within the timeout."""
        from frugal.comm.collectives import wait_work

        work = dist.all_to_all_single(incoming, outgoing, group=self.group, async_op=True)
        wait_work(work, what, self.timeout_s)

    def all_gather(self, outputs: Sequence[Tensor], tensor: Tensor, what: str) -> None:
        """`dist.all_gather` within the timeout."""
        from frugal.comm.collectives import wait_work

        work = dist.all_gather(list(outputs), tensor, group=self.group, async_op=True)
        wait_work(work, what, self.timeout_s)
