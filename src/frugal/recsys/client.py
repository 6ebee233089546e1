"""The embedding worker: dedup, shard, look up, pool; later unpool gradients and push.

Per batch: each feature's ids are deduplicated (`np.unique`), every unique (table, id) goes to
the owner of its virtual shard, rows come back in fp16 with their versions and become one
fp32 leaf tensor `rows[g]` (U_g, E_g) per embedding width (one for most models);
`F.embedding_bag` pools every (feature, sample) bag from it, so `rows[g].grad` is already
summed over duplicates. The push sends `grad * scale /
world_size` in fp16 (the wire scale halves on overflow), with the versions read.

References:
    Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to 100
    Trillion Parameters, KDD 2022, arXiv 2111.05897 (section 4.2: embedding worker; fp16
    embeddings and gradients on the wire).

Shape legend: U unique (table, id) pairs of a batch, E embedding_dim, B samples, F features,
U_g and E_g the pairs and the width of the g-th smallest embedding width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal._typing import I64
from frugal.recsys.batch import KJTBatch
from frugal.recsys.ps import hash_raw_ids, virtual_shard
from frugal.recsys.transport import Handle, Transport

__all__ = ["EmbeddingClient", "LookupResult", "PendingLookup", "WireDtype"]

WireDtype = Literal["float16", "bfloat16", "float32"]
_WIRE = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(slots=True)
class PendingLookup:
    """A batch's lookups in flight: one handle per owner shard, and the routing."""

    batch: KJTBatch
    handles: dict[int, Handle]
    unique_tables: I64  # (U,) table of each unique pair, table-major order
    unique_ids: I64  # (U,) id of each unique pair
    inverse: Tensor  # (N,) for each value of the batch, its unique pair's position
    owner_order: I64  # (U,) unique pairs sorted by owner (stable)
    owner_counts: dict[int, I64]  # per owner, ids per table (T,)
    owner_slices: dict[int, tuple[int, int]]  # per owner, its range in owner_order
    unique_groups: I64  # (U,) width group of each unique pair
    unique_positions: I64  # (U,) each unique pair's row in its group's rows


@dataclass(slots=True)
class LookupResult:
    """Rows of a batch as leaf tensors (gradients accumulate here), with their versions."""

    pending: PendingLookup
    rows: list[Tensor]  # per width group, (U_g, E_g) float32 leaf
    versions: Tensor  # (U,) int64


class EmbeddingClient:
    """Persia's embedding worker, running inside the trainer."""

    def __init__(
        self,
        transport: Transport,
        owners: I64,
        num_tables: int,
        embedding_dim: int | tuple[int, ...],
        wire_dtype: WireDtype = "float16",
        *,
        raw_ids: bool = False,
        pooling: tuple[str, ...] = ("sum",),
        sequence_features: tuple[int, ...] = (),
    ) -> None:
        """Route through `transport` with `owners` (vshard -> shard).

        With `raw_ids` the batches' ids are raw 64-bit hashes, hashed into the PS id space
        (`hash_raw_ids`) before routing: shards, checkpoints and exports see hashed ids.
        `pooling`: "sum", "mean" or "max" for every table (one entry) or per table.
        `embedding_dim`: one width for every table, or one per table (the shards then hold
        one store per width, see `EmbeddingShard`). `sequence_features`: the features
        (indices) `forward` hands the model unpooled (`sequences`) instead of pooled.

        Raises:
            ValueError: If `pooling` or a per-table `embedding_dim` has neither 1 nor
                `num_tables` entries, or `pooling` names another mode.
        """
        dims = (embedding_dim,) if isinstance(embedding_dim, int) else tuple(embedding_dim)
        if len(dims) not in (1, num_tables):
            raise ValueError(
                f"embedding_dim has {len(dims)} widths for {num_tables} tables; give one width "
                f"for every table or one per table ({num_tables})"
            )
        self.table_dims = dims * (num_tables if len(dims) == 1 else 1)
        widths = sorted(set(self.table_dims))
        self.group_dims = tuple(widths)
        """Width of each group of rows, ascending (the shards' store order)."""
        self._group_of_table = np.array(
            [widths.index(dim) for dim in self.table_dims], dtype=np.int64
        )
        if len(pooling) not in (1, num_tables):
            raise ValueError(
                f"pooling has {len(pooling)} modes for {num_tables} tables; give one mode for "
                f"every table or one per table ({num_tables})"
            )
        unknown = sorted(set(pooling) - {"sum", "mean", "max"})
        if unknown:
            raise ValueError(f"pooling mode {unknown[0]!r}; choose sum, mean or max")
        self.pooling = tuple(pooling) * (num_tables if len(pooling) == 1 else 1)
        if any(not 0 <= f < num_tables for f in sequence_features):
            raise ValueError(
                f"sequence_features={list(sequence_features)} must be feature indices in "
                f"[0, {num_tables})"
            )
        self.sequence_features = tuple(sequence_features)
        self.raw_ids = raw_ids
        self.transport = transport
        self.owners = owners
        self.num_shards = int(owners.max()) + 1
        self.num_tables = num_tables
        self.wire_dtype = _WIRE[wire_dtype]
        self.wire_scale = 1024.0 if wire_dtype == "float16" else 1.0
        self._clean_pushes = 0

    def route(self, batch: KJTBatch) -> PendingLookup:
        """Deduplicate and shard a batch's ids (no transport call); see `lookup`."""
        tables, ids, inverses = [], [], []
        offset = 0
        for t, values in enumerate(batch.feature_values()):
            if self.raw_ids:
                values = hash_raw_ids(values)
            unique, inverse = np.unique(values, return_inverse=True)
            tables.append(np.full(len(unique), t, dtype=np.int64))
            ids.append(unique)
            inverses.append(inverse.astype(np.int64) + offset)
            offset += len(unique)
        table_U = np.concatenate(tables) if tables else np.empty(0, np.int64)
        ids_U = np.concatenate(ids) if ids else np.empty(0, np.int64)
        owner_U = np.empty(len(ids_U), dtype=np.int64)
        start = 0
        for t, unique in enumerate(ids):
            owner_U[start : start + len(unique)] = self.owners[virtual_shard(t, unique)]
            start += len(unique)
        order_U = np.argsort(owner_U, kind="stable")  # keeps table-major order per owner
        num_shards = self.num_shards
        per_owner = np.bincount(owner_U, minlength=num_shards)
        bounds = np.concatenate([[0], np.cumsum(per_owner)])
        counts_PT = np.bincount(
            owner_U * self.num_tables + table_U, minlength=num_shards * self.num_tables
        ).reshape(num_shards, self.num_tables)
        slices = {
            p: (int(bounds[p]), int(bounds[p + 1])) for p in range(num_shards) if per_owner[p]
        }
        unique_groups = self._group_of_table[table_U]
        unique_positions = np.empty(len(ids_U), dtype=np.int64)
        for g in range(len(self.group_dims)):
            mine = unique_groups == g
            unique_positions[mine] = np.arange(int(np.count_nonzero(mine)))
        return PendingLookup(
            batch=batch,
            handles={},
            unique_tables=table_U,
            unique_ids=ids_U,
            inverse=torch.from_numpy(np.concatenate(inverses) if inverses else ids_U),
            owner_order=order_U,
            owner_counts={p: counts_PT[p] for p in slices},
            owner_slices=slices,
            unique_groups=unique_groups,
            unique_positions=unique_positions,
        )

    def lookup(self, batch: KJTBatch, step: int | None = None) -> PendingLookup:
        """Start the lookups of a batch: one call per owner shard holding any of its ids.

        `step`: the training step reading them (the step a `hint` named), or None for an
        evaluation read (see `EmbeddingShard.lookup`).
        """
        pending = self.route(batch)
        for p, (lo, hi) in pending.owner_slices.items():
            ids = torch.from_numpy(pending.unique_ids[pending.owner_order[lo:hi]])
            counts = torch.from_numpy(pending.owner_counts[p])
            pending.handles[p] = self.transport.call(
                p, "lookup", ids, counts, self.wire_dtype, step
            )
        return pending

    def hint(self, batch: KJTBatch, step: int) -> list[Handle]:
        """Tell each owner shard which of its rows the lookup of `step` will read.

        The shards' stores prefetch those rows from disk meanwhile (MLKV's lookahead on
        Persia's PS). Fire and forget: the handles only report a failed hint.
        """
        pending = self.route(batch)
        handles = []
        for p, (lo, hi) in pending.owner_slices.items():
            ids = torch.from_numpy(pending.unique_ids[pending.owner_order[lo:hi]])
            counts = torch.from_numpy(pending.owner_counts[p])
            handles.append(self.transport.call(p, "lookahead", ids, counts, step))
        return handles

    def wait(self, pending: PendingLookup) -> LookupResult:
        """Wait for a batch's rows; return them as fp32 leaves with `requires_grad`.

        Raises:
            PSUnavailableError: If a shard does not answer within the timeout.
        """
        sizes = np.bincount(pending.unique_groups, minlength=len(self.group_dims))
        rows_G = [
            torch.empty(int(size), dim, dtype=torch.float32)
            for size, dim in zip(sizes, self.group_dims, strict=True)
        ]
        versions_U = torch.empty(len(pending.unique_ids), dtype=torch.int64)
        for p, (lo, hi) in pending.owner_slices.items():
            rows, versions = pending.handles[p].wait()
            if isinstance(rows, Tensor):  # a shard of one width
                rows = [rows]
            pairs = pending.owner_order[lo:hi]
            versions_U[torch.from_numpy(pairs)] = versions
            for g, rows_g in enumerate(rows):
                mine = pairs[pending.unique_groups[pairs] == g]
                rows_G[g][torch.from_numpy(pending.unique_positions[mine])] = rows_g.to(
                    torch.float32
                )
        for rows_g in rows_G:
            rows_g.requires_grad_(True)
        return LookupResult(pending, rows_G, versions_U)

    def pool(self, result: LookupResult) -> Tensor:
        """Pool every (feature, sample) bag by its table's mode; empty bags give zeros.

        Shapes:
            returns: (B, F, E) when every table has width E, else (B, sum of the features'
            widths) with the features side by side in order.
        """
        pooled = self.pooled_features(result)
        return self.assemble([bag for bag in pooled if bag is not None])

    def assemble(self, features: list[Tensor]) -> Tensor:
        """Per-feature vectors (B, E_f) as the dense model takes them (see `pool`)."""
        if len(self.group_dims) == 1:
            return torch.stack(features, dim=1)
        return torch.cat(features, dim=1)

    def forward(self, model: nn.Module, result: LookupResult, dense_BD: Tensor) -> Tensor:
        """The dense model's logits (B,) for a batch's rows.

        Without sequence features: `model(pool(result), dense)`. With them:
        `model(pooled_features(result), sequences(result), dense)`, the features' slots of
        the sequence features left None (`frugal.recsys.models.SequenceFeatures` fills them).
        """
        if not self.sequence_features:
            logits: Tensor = model(self.pool(result), dense_BD)
        else:
            logits = model(self.pooled_features(result), self.sequences(result), dense_BD)
        return logits

    def _value_ranges(self, result: LookupResult) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Lengths (F, B), each feature's first and end value, and each value's group row."""
        batch = result.pending.batch
        lengths_FB = torch.from_numpy(batch.lengths.astype(np.int64)).reshape(
            len(batch.keys), batch.batch_size
        )
        value_ends = torch.cumsum(lengths_FB.sum(1), 0)
        position_N = torch.from_numpy(result.pending.unique_positions)[result.pending.inverse]
        return lengths_FB, value_ends - lengths_FB.sum(1), value_ends, position_N

    def sequences(self, result: LookupResult) -> list[tuple[Tensor, Tensor]]:
        """The rows of each sequence feature's bags, unpooled, in order, padded.

        Returns:
            Per sequence feature f (in `sequence_features` order): (rows (B, L, E_f), mask
            (B, L) bool), L the feature's longest bag in the batch (at least 1); padding
            rows are zeros with mask False. Gradients flow to `result.rows`.
        """
        lengths_FB, starts, ends, position_N = self._value_ranges(result)
        batch_size = lengths_FB.shape[1]
        out = []
        for f in self.sequence_features:
            g = int(self._group_of_table[f])
            lengths = lengths_FB[f]
            longest = max(int(lengths.max()) if batch_size else 0, 1)
            rows = result.rows[g][position_N[int(starts[f]) : int(ends[f])]]
            bag_starts = torch.cumsum(lengths, 0) - lengths
            sample = torch.repeat_interleave(torch.arange(batch_size), lengths)
            slot = torch.arange(len(rows)) - torch.repeat_interleave(bag_starts, lengths)
            padded = rows.new_zeros(batch_size, longest, rows.shape[1])
            padded = padded.index_put((sample, slot), rows)
            mask = torch.arange(longest) < lengths[:, None]
            out.append((padded, mask))
        return out

    def pooled_features(self, result: LookupResult) -> list[Tensor | None]:
        """Each feature's bags pooled by its table's mode, (B, E_f); empty bags give zeros.

        A sequence feature's entry is None: see `sequences`.
        """
        batch = result.pending.batch
        num_features, batch_size = len(batch.keys), batch.batch_size
        lengths_FB, value_starts, value_ends, position_N = self._value_ranges(result)
        pooled_F: list[Tensor | None] = [None] * num_features
        for g in range(len(self.group_dims)):  # one embedding_bag per (width, mode)
            for mode in sorted(set(self.pooling)):
                features = [
                    f
                    for f in range(num_features)
                    if self._group_of_table[f] == g
                    and self.pooling[f] == mode
                    and f not in self.sequence_features
                ]
                if not features:
                    continue
                values = torch.cat(
                    [position_N[int(value_starts[f]) : int(value_ends[f])] for f in features]
                )
                lengths = lengths_FB[features].reshape(-1)
                offsets = torch.cumsum(lengths, 0) - lengths
                bags = F.embedding_bag(
                    values, result.rows[g], offsets, mode=mode, include_last_offset=False
                ).reshape(len(features), batch_size, -1)
                for i, f in enumerate(features):
                    pooled_F[f] = bags[i]
        return pooled_F

    def push(
        self, result: LookupResult, step: int, world_size: int, seq: int | None = None
    ) -> list[Handle]:
        """Send `rows[g].grad / world_size` to the owners (fire and forget); return the handles.

        Encodes with the wire scale (fp16: starts at 2^10, halves and re-encodes on overflow,
        doubles after 1000 clean pushes); the shard divides it out in fp32. With `seq` (sync
        mode) every shard gets a push, empty if it owns none of the batch's rows, numbered
        `seq`, and shards apply pushes in sequence order.
        """
        grads = [
            (rows.grad if rows.grad is not None else torch.zeros_like(rows)) / world_size
            for rows in result.rows
        ]
        while True:
            wires = [(grad * self.wire_scale).to(self.wire_dtype) for grad in grads]
            finite = all(bool(torch.isfinite(wire).all()) for wire in wires)
            if finite or self.wire_scale <= 2.0**-24:
                break
            self.wire_scale /= 2.0
            self._clean_pushes = 0
        scale = self.wire_scale
        self._clean_pushes += 1
        if self.wire_dtype == torch.float16 and self._clean_pushes >= 1000:
            self.wire_scale = min(self.wire_scale * 2.0, 2.0**15)
            self._clean_pushes = 0
        pending = result.pending
        handles = []
        shards = range(self.num_shards) if seq is not None else pending.owner_slices
        for p in shards:
            lo, hi = pending.owner_slices.get(p, (0, 0))
            pairs = pending.owner_order[lo:hi]
            counts = pending.owner_counts.get(p, np.zeros(self.num_tables, dtype=np.int64))
            wire_G = [
                wire[
                    torch.from_numpy(
                        pending.unique_positions[pairs[pending.unique_groups[pairs] == g]]
                    )
                ]
                for g, wire in enumerate(wires)
            ]
            handles.append(
                self.transport.call(
                    p,
                    "push",
                    torch.from_numpy(pending.unique_ids[pairs]),
                    torch.from_numpy(counts),
                    wire_G,
                    result.versions[torch.from_numpy(pairs)].contiguous(),
                    scale,
                    step,
                    seq,
                )
            )
        return handles
