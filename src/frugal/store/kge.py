"""Knowledge-graph embedding (KGE) training with the entity table in a store: MLKV's KGE workload.

The DGL-KE recipe (Zheng et al., "DGL-KE: Training Knowledge Graph Embeddings at Scale",
SIGIR 2020, arXiv 2004.08532), which MLKV (He et al., ICDE 2025, arXiv 2504.01506) runs on its
store: batches of positive triples; each chunk of `neg_chunk_size` positives shares
`neg_sample_size` uniformly drawn negative entities that corrupt the tails (even steps) or the
heads (odd steps); the logistic loss `-(mean log sigma(pos) + mean log sigma(-neg)) / 2`;
row-wise Adagrad whose accumulator lives in the row (`[w | a]`, store kind
`rowwise_adagrad`). Entity rows live in any table with the store bench's `get` /
`apply_gradients` / `lookahead` interface (`EmbeddingStore`, `RamTable`, the KV-offload and
hybrid-log baselines); relation rows are few and stay in a `RamTable`.

Score functions (`KGE_MODELS`, a registry; `register_kge_model` adds one):
- DistMult (Yang et al., ICLR 2015, arXiv 1412.6575): `<h, r, t>`;
- ComplEx (Trouillon et al., ICML 2016, arXiv 1606.06357): `Re(<h, r, conj(t)>)`, rows hold
  the real half then the imaginary half;
- TransE (Bordes et al., NeurIPS 2013): `gamma - ||h + r - t||_p`.

`KGESampler` makes every batch from (seed, step) alone, so the batches S steps ahead are known:
`LookaheadLoader` hints them to the store (MLKV's KGE-async path). Evaluation
(`evaluate_kge`) is the filtered ranking protocol of Bordes et al.: every test triple's head
and tail are ranked against all entities (or a seeded sample), other known true triples
removed; ties count half (PyKEEN's "realistic" rank).

Shape legend: B positive triples per batch, C chunks, n = B / C positives per chunk, K
negatives per chunk, U unique entities of a batch, D row width (embedding_dim), E entities.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from frugal._typing import F32, I64
from frugal.config import check_types
from frugal.data.triples import FreebaseLikeStream, KnowledgeGraph
from frugal.registry import Registry
from frugal.store.lookahead import Batch, LookaheadLoader
from frugal.store.optimizers import OptimizerConfig
from frugal.store.rows import RowSpec

__all__ = [
    "KGE_MODELS",
    "KGEBatch",
    "KGEConfig",
    "KGEModel",
    "KGEResult",
    "KGESampler",
    "KGETable",
    "assign_buckets",
    "beta_buffer_states",
    "evaluate_kge",
    "kge_row_spec",
    "kge_step",
    "register_kge_model",
    "train_kge",
]


class KGETable(Protocol):
    """What training needs of a table: the store bench's interface (`EmbeddingStore` adapts)."""

    def get(self, ids: I64, step: int) -> F32:
        """Vectors of unique sorted `ids`, (U,) -> (U, D), opening reads an update closes."""
        ...

    def apply_gradients(self, ids: I64, grads: F32, step: int) -> None:
        """Apply the rows' optimizer to gradients (U, D) of the ids of the last `get`."""
        ...

    def lookahead(self, ids: Any, step: int) -> None:
        """Hint that `ids` are read at `step` (a prefetch; never changes values)."""
        ...


# --- score functions ------------------------------------------------------------------------


class KGEModel(Protocol):
    """A KGE score function over rows of width D (torch, differentiable).

    `score(h, r, t)` scores aligned triples, (..., D) -> (...). `score_tails(h, r, cand)` scores
    each of n (head, relation) pairs against K candidate tails: h, r (C, n, D), cand (C, K, D)
    -> (C, n, K); `score_heads(cand, r, t)` the same for candidate heads.
    """

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """Scores of aligned triples, (..., D) x 3 -> (...)."""
        ...

    def score_tails(self, h: Tensor, r: Tensor, cand: Tensor) -> Tensor:
        """Scores of (h, r, cand_k): h, r (C, n, D), cand (C, K, D) -> (C, n, K)."""
        ...

    def score_heads(self, cand: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """Scores of (cand_k, r, t): cand (C, K, D), r, t (C, n, D) -> (C, n, K)."""
        ...


@dataclass(frozen=True, slots=True)
class DistMult:
    """`sum(h * r * t)` (Yang et al., arXiv 1412.6575)."""

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        return (h * r * t).sum(-1)

    def score_tails(self, h: Tensor, r: Tensor, cand: Tensor) -> Tensor:
        return torch.bmm(h * r, cand.transpose(1, 2))

    def score_heads(self, cand: Tensor, r: Tensor, t: Tensor) -> Tensor:
        return torch.bmm(r * t, cand.transpose(1, 2))


@dataclass(frozen=True, slots=True)
class ComplEx:
    """`Re(<h, r, conj(t)>)` with rows `[real | imaginary]` (Trouillon et al., arXiv 1606.06357)."""

    @staticmethod
    def _tail_query(h: Tensor, r: Tensor) -> Tensor:
        """Query q with Re(<h, r, conj(t)>) = <q, t> for t = [t_re | t_im]."""
        hr, hi = h.chunk(2, dim=-1)
        rr, ri = r.chunk(2, dim=-1)
        return torch.cat([hr * rr - hi * ri, hr * ri + hi * rr], dim=-1)

    @staticmethod
    def _head_query(r: Tensor, t: Tensor) -> Tensor:
        """Query q with Re(<h, r, conj(t)>) = <q, h> for h = [h_re | h_im]."""
        rr, ri = r.chunk(2, dim=-1)
        tr, ti = t.chunk(2, dim=-1)
        return torch.cat([rr * tr + ri * ti, rr * ti - ri * tr], dim=-1)

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        return (self._tail_query(h, r) * t).sum(-1)

    def score_tails(self, h: Tensor, r: Tensor, cand: Tensor) -> Tensor:
        return torch.bmm(self._tail_query(h, r), cand.transpose(1, 2))

    def score_heads(self, cand: Tensor, r: Tensor, t: Tensor) -> Tensor:
        return torch.bmm(self._head_query(r, t), cand.transpose(1, 2))


_EXACT = "donot_use_mm_for_euclid_dist"  # cdist as the plain norm, equal to `score`'s


@dataclass(frozen=True, slots=True)
class TransE:
    """`gamma - ||h + r - t||_p` (Bordes et al., NeurIPS 2013), as DGL-KE's TransE_l1 / _l2."""

    gamma: float
    p: int

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        distance: Tensor = torch.linalg.vector_norm(h + r - t, ord=self.p, dim=-1)
        return self.gamma - distance

    def score_tails(self, h: Tensor, r: Tensor, cand: Tensor) -> Tensor:
        return self.gamma - torch.cdist(h + r, cand, p=float(self.p), compute_mode=_EXACT)

    def score_heads(self, cand: Tensor, r: Tensor, t: Tensor) -> Tensor:
        return self.gamma - torch.cdist(t - r, cand, p=float(self.p), compute_mode=_EXACT)


KGE_MODELS: Registry[Callable[[KGEConfig], KGEModel]] = Registry("KGE model", field="model")
"""Score functions by name: a factory from the `KGEConfig` (for gamma, p) to a `KGEModel`."""


def register_kge_model(name: str, factory: Callable[[KGEConfig], KGEModel]) -> None:
    """Add a score function under `name` (then `KGEConfig(model=name)` trains it).

    Raises:
        ValueError: If `name` is taken or empty.
    """
    KGE_MODELS.register(name, factory)


KGE_MODELS.register("distmult", lambda config: DistMult())
KGE_MODELS.register("complex", lambda config: ComplEx())
KGE_MODELS.register("transe", lambda config: TransE(gamma=config.gamma, p=config.p_norm))


# --- settings -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class KGEConfig:
    """Training settings: by default DGL-KE's FB15k DistMult recipe that MLKV runs.

    That is dimension 400, batch 1024, 256 shared negatives, row-wise Adagrad at lr 0.1.
    """

    model: str = "distmult"
    """Score function, a name in `KGE_MODELS` (`distmult`, `complex`, `transe`)."""
    embedding_dim: int = 400
    """D, floats per entity and relation vector (ComplEx: real then imaginary half; even)."""
    batch_size: int = 1024
    """Positive triples per step, a multiple of `neg_chunk_size`."""
    neg_sample_size: int = 256
    """Negative entities shared by each chunk of positives (K), >= 1."""
    neg_chunk_size: int = 256
    """Positives per chunk sharing one set of negatives, >= 1 (DGL-KE: = neg_sample_size)."""
    lr: float = 0.1
    """Row-wise Adagrad learning rate (entities and relations), > 0."""
    eps: float = 1e-10
    """Row-wise Adagrad epsilon, > 0 (DGL-KE: 1e-10)."""
    gamma: float = 12.0
    """TransE's margin (DGL-KE's default 12), > 0."""
    p_norm: Literal[1, 2] = 2
    """TransE's norm (DGL-KE's TransE_l1 or TransE_l2)."""
    seed: int = 0
    """Seeds the initial rows, the batch order and the negatives, >= 0."""
    ordering: Literal["random", "beta"] = "random"
    """Order of the training triples of a `KnowledgeGraph`: a seeded permutation per epoch
    (DGL-KE), or Marius's BETA order of edge buckets (`beta_buffer_states`), where negatives
    come from the partitions in the buffer. A `FreebaseLikeStream` is read in order."""
    num_partitions: int = 16
    """Entity partitions p of the BETA order (contiguous id ranges), >= 2."""
    buffer_capacity: int = 4
    """Partitions c held in the BETA buffer at once, in [2, num_partitions]."""

    def __post_init__(self) -> None:
        check_types(self)
        KGE_MODELS.check(self.model)
        if not 2 <= self.buffer_capacity <= self.num_partitions:
            raise ValueError(
                f"buffer_capacity={self.buffer_capacity} must be in [2, num_partitions="
                f"{self.num_partitions}]"
            )
        for name in ("embedding_dim", "batch_size", "neg_sample_size", "neg_chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.batch_size % self.neg_chunk_size:
            raise ValueError(
                f"batch_size={self.batch_size} must be a multiple of neg_chunk_size="
                f"{self.neg_chunk_size}; e.g. batch_size="
                f"{max(1, self.batch_size // self.neg_chunk_size) * self.neg_chunk_size}"
            )
        if self.model == "complex" and self.embedding_dim % 2:
            raise ValueError(
                f"embedding_dim={self.embedding_dim} must be even for ComplEx (real and "
                f"imaginary halves); e.g. embedding_dim={self.embedding_dim + 1}"
            )
        for name in ("lr", "eps", "gamma"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.p_norm not in (1, 2):
            raise ValueError(f"p_norm={self.p_norm} must be 1 or 2")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")


def kge_row_spec(config: KGEConfig) -> RowSpec:
    """The store row of an entity or relation: `[w (D) | Adagrad accumulator (1)]`."""
    return RowSpec(
        embedding_dim=config.embedding_dim,
        optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=config.lr, eps=config.eps),
    )


# --- Marius's BETA ordering -----------------------------------------------------------------


def beta_buffer_states(num_partitions: int, buffer_capacity: int, seed: int) -> list[I64]:
    """The buffer states of Marius's BETA ordering: one partition swap between states.

    Marius (Mohoney et al., "Marius: Learning Massive Graph Embeddings on a Single Machine",
    OSDI 2021, arXiv 2101.08358) splits entities into p partitions and edges into p x p
    buckets, and keeps c partitions in a buffer. BETA fills the buffer, then keeps c - 1
    partitions fixed while the last slot cycles through every partition on disk; then the
    fixed ones, having met every partition, leave for good (up to c - 1 partitions on disk
    replace them, one swap each), and the cycle repeats until no partition is left on disk.
    Every pair of partitions shares the buffer in some state, with few swaps (the paper's
    lower bound is about p^2 / c); shuffles are seeded, as Marius's are random.

    Args:
        num_partitions: p, >= 2.
        buffer_capacity: c, in [2, p].
        seed: Seed of the shuffles.

    Returns:
        The buffer states in order, each an int64 array of c partition ids.

    Raises:
        ValueError: If c is not in [2, p].
    """
    if not 2 <= buffer_capacity <= num_partitions:
        raise ValueError(
            f"buffer_capacity={buffer_capacity} must be in [2, num_partitions={num_partitions}]"
        )
    rng = np.random.default_rng([seed, 0xBE7A])
    order = rng.permutation(num_partitions)
    in_buffer = order[:buffer_capacity].copy()
    on_disk = order[buffer_capacity:].copy()
    states = [in_buffer.copy()]
    while len(on_disk):
        in_buffer = in_buffer[rng.permutation(len(in_buffer))]
        on_disk = on_disk[rng.permutation(len(on_disk))]
        for i in range(len(on_disk)):  # the last slot cycles through the disk
            in_buffer[-1], on_disk[i] = on_disk[i], in_buffer[-1]
            states.append(in_buffer.copy())
        on_disk = on_disk[rng.permutation(len(on_disk))]
        replaced = min(buffer_capacity - 1, len(on_disk))
        for i in range(replaced):  # the fixed ones met everyone: replace them
            in_buffer[i] = on_disk[i]
            states.append(in_buffer.copy())
        on_disk = on_disk[replaced:]
    return states


def assign_buckets(states: list[I64], num_partitions: int) -> list[list[tuple[int, int]]]:
    """Put each edge bucket (i, j) in the first buffer state holding both i and j.

    This is Marius's greedy assignment: every bucket is trained exactly once per epoch.

    Returns:
        Per state, its buckets (head partition, tail partition).
    """
    done = np.zeros((num_partitions, num_partitions), dtype=bool)
    out: list[list[tuple[int, int]]] = []
    for state in states:
        buckets = []
        for i in state.tolist():
            for j in state.tolist():
                if not done[i, j]:
                    done[i, j] = True
                    buckets.append((i, j))
        out.append(buckets)
    return out


# --- batches --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class KGEBatch(Batch):
    """One step: positives, which side is corrupted, the chunk negatives, the entities read.

    `ids` (the `Batch` field the lookahead loader hints) are the batch's unique entity ids,
    sorted, (U,); `triples` (B, 3); `negatives` (C, K) entity ids; `corrupt` "tail" or "head".
    """

    triples: I64 = field(default_factory=lambda: np.empty((0, 3), dtype=np.int64))
    negatives: I64 = field(default_factory=lambda: np.empty((0, 0), dtype=np.int64))
    corrupt: Literal["head", "tail"] = "tail"


class KGESampler:
    """Seeded positive batches with chunked shared negatives, each a function of its step.

    From a `KnowledgeGraph`: epoch e visits the training triples in a seeded permutation,
    `batch_size` at a time (the last partial batch of an epoch is dropped, as DGL-KE's
    sampler does), or in Marius's BETA order (`KGEConfig.ordering`). From a
    `FreebaseLikeStream`: step t takes triples
    [t * batch_size, (t + 1) * batch_size) of the stream. Tails are corrupted on even steps,
    heads on odd steps; negatives are uniform over the entities (BETA: over the entities of the
    partitions in the buffer), seeded by (seed, step).

    Raises:
        ValueError: If the graph has fewer training triples than one batch.
    """

    def __init__(self, source: KnowledgeGraph | FreebaseLikeStream, config: KGEConfig) -> None:
        self.source = source
        self.config = config
        self.num_entities = source.num_entities
        if isinstance(source, KnowledgeGraph):
            self.batches_per_epoch = len(source.train) // config.batch_size
            if self.batches_per_epoch < 1:
                raise ValueError(
                    f"{source.name or 'the graph'} has {len(source.train)} training triples, "
                    f"fewer than batch_size={config.batch_size}; lower batch_size"
                )
        else:
            self.batches_per_epoch = 0  # a stream has no epochs
        if config.num_partitions > self.num_entities and config.ordering == "beta":
            raise ValueError(
                f"num_partitions={config.num_partitions} exceeds the {self.num_entities} "
                "entities; lower num_partitions"
            )
        # per epoch: the order of the training rows and, for BETA, each row's buffer state
        self._epoch_order: tuple[int, I64, I64 | None, list[I64]] | None = None

    def partition_of(self, entities: I64) -> I64:
        """BETA partition of entity ids: contiguous ranges, floor(e * p / E)."""
        out: I64 = entities * self.config.num_partitions // self.num_entities
        return out

    def _order(self, epoch: int) -> tuple[int, I64, I64 | None, list[I64]]:
        c = self.config
        assert isinstance(self.source, KnowledgeGraph)
        rng = np.random.default_rng([c.seed, 0x5EED, epoch])
        if c.ordering == "random":
            return epoch, rng.permutation(len(self.source.train)), None, []
        train = self.source.train
        p = c.num_partitions
        states = beta_buffer_states(p, c.buffer_capacity, c.seed * 1_000_003 + epoch)
        bucket = self.partition_of(train[:, 0]) * p + self.partition_of(train[:, 2])
        by_bucket = np.argsort(bucket, kind="stable")
        starts = np.searchsorted(bucket[by_bucket], np.arange(p * p + 1))
        rows: list[I64] = []
        row_state: list[I64] = []
        for index, buckets in enumerate(assign_buckets(states, p)):
            part = np.concatenate(
                [by_bucket[starts[i * p + j] : starts[i * p + j + 1]] for i, j in buckets]
                or [np.empty(0, dtype=np.int64)]
            )
            rows.append(part[rng.permutation(len(part))])
            row_state.append(np.full(len(part), index, dtype=np.int64))
        return epoch, np.concatenate(rows), np.concatenate(row_state), states

    def _positives(self, step: int) -> tuple[I64, I64 | None]:
        """The batch's triples and, for BETA, the partitions in the buffer."""
        c = self.config
        if isinstance(self.source, FreebaseLikeStream):
            return self.source.triples(step * c.batch_size, (step + 1) * c.batch_size), None
        epoch, index = divmod(step, self.batches_per_epoch)
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            self._epoch_order = self._order(epoch)
        _, order, row_state, states = self._epoch_order
        rows = order[index * c.batch_size : (index + 1) * c.batch_size]
        buffer = None if row_state is None else states[int(row_state[index * c.batch_size])]
        return self.source.train[rows], buffer

    def _negatives(
        self, rng: np.random.Generator, shape: tuple[int, int], buffer: I64 | None
    ) -> I64:
        """Uniform entities, or uniform over the entities of the buffer's partitions (BETA)."""
        if buffer is None:
            out: I64 = rng.integers(0, self.num_entities, size=shape)
            return out
        p, n = self.config.num_partitions, self.num_entities
        parts = np.sort(buffer)
        lo = (parts * n + p - 1) // p  # partition k holds ids [ceil(k n / p), ceil((k+1) n / p))
        hi = ((parts + 1) * n + p - 1) // p
        sizes = hi - lo
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        draw = rng.integers(0, int(offsets[-1]), size=shape)
        which = np.searchsorted(offsets, draw, side="right") - 1
        local: I64 = lo[which] + draw - offsets[which]
        return local

    def batch(self, step: int) -> KGEBatch:
        """The batch of `step` (>= 0)."""
        c = self.config
        triples, buffer = self._positives(step)
        rng = np.random.default_rng([c.seed, 0x4E6, step])
        chunks = c.batch_size // c.neg_chunk_size
        negatives = self._negatives(rng, (chunks, c.neg_sample_size), buffer)
        ids = np.unique(np.concatenate([triples[:, 0], triples[:, 2], negatives.ravel()]))
        corrupt: Literal["head", "tail"] = "tail" if step % 2 == 0 else "head"
        return KGEBatch(step=step, ids=ids, triples=triples, negatives=negatives, corrupt=corrupt)

    def batches(self, num_steps: int, start: int = 0) -> Iterator[KGEBatch]:
        """Batches of steps [start, start + num_steps)."""
        for step in range(start, start + num_steps):
            yield self.batch(step)


# --- one step -------------------------------------------------------------------------------


def kge_step(model: KGEModel, batch: KGEBatch, entities: KGETable, relations: KGETable) -> float:
    """Read the batch's rows, compute the loss and its gradients, update the rows.

    Args:
        model: The score function.
        batch: From `KGESampler.batch`.
        entities: The entity table (rows read with `get`, updated with `apply_gradients`).
        relations: The relation table (same interface).

    Returns:
        The batch's loss, `-(mean log sigma(pos) + mean log sigma(-neg)) / 2`.
    """
    step = batch.step
    ent_ids = batch.ids
    rel_ids, rel_local = np.unique(batch.triples[:, 1], return_inverse=True)
    ent_rows = entities.get(ent_ids, step)
    try:
        rel_rows = relations.get(rel_ids, step)
    except BaseException:
        _release(entities, ent_ids, step)
        raise
    try:
        return _loss_and_update(
            model, batch, entities, relations, ent_rows, rel_rows, rel_ids, rel_local
        )
    except BaseException:  # nothing was updated: close the reads, keep the rows
        _release(entities, ent_ids, step)
        _release(relations, rel_ids, step)
        raise


def _release(table: Any, ids: I64, step: int) -> None:
    release = getattr(table, "release", None)
    if release is not None:
        release(ids, step)


def _loss_and_update(
    model: KGEModel,
    batch: KGEBatch,
    entities: KGETable,
    relations: KGETable,
    ent_rows: F32,
    rel_rows: F32,
    rel_ids: I64,
    rel_local: I64,
) -> float:
    step = batch.step
    ent_ids = batch.ids
    if ent_rows.shape[1] != rel_rows.shape[1]:
        raise ValueError(
            f"entity rows have {ent_rows.shape[1]} floats but relation rows "
            f"{rel_rows.shape[1]}; create both tables with kge_row_spec(config)"
        )
    ent = torch.from_numpy(np.ascontiguousarray(ent_rows)).requires_grad_()
    rel = torch.from_numpy(np.ascontiguousarray(rel_rows)).requires_grad_()
    heads = torch.from_numpy(np.searchsorted(ent_ids, batch.triples[:, 0]))
    tails = torch.from_numpy(np.searchsorted(ent_ids, batch.triples[:, 2]))
    negs = torch.from_numpy(np.searchsorted(ent_ids, batch.negatives))
    h, r, t = ent[heads], rel[torch.from_numpy(rel_local)], ent[tails]
    pos = model.score(h, r, t)
    chunks, _ = batch.negatives.shape
    dim = ent.shape[1]
    cand = ent[negs]  # (C, K, D)
    if batch.corrupt == "tail":
        neg = model.score_tails(h.view(chunks, -1, dim), r.view(chunks, -1, dim), cand)
    else:
        neg = model.score_heads(cand, r.view(chunks, -1, dim), t.view(chunks, -1, dim))
    loss = -(F.logsigmoid(pos).mean() + F.logsigmoid(-neg).mean()) / 2
    loss.backward()  # type: ignore[no-untyped-call]  # torch stub gap
    assert ent.grad is not None  # a leaf the loss used
    assert rel.grad is not None
    entities.apply_gradients(ent_ids, ent.grad.numpy(), step)
    relations.apply_gradients(rel_ids, rel.grad.numpy(), step)
    return float(loss.detach())


# --- evaluation -----------------------------------------------------------------------------


def _known_answers(
    known: I64, key_cols: tuple[int, int], answer_col: int, num_relations: int
) -> tuple[I64, I64]:
    """Sorted (key, answer) pairs for the filtered rank: key = first * R + relation."""
    first, rel = key_cols
    keys = known[:, first] * num_relations + known[:, rel]
    order = np.lexsort((known[:, answer_col], keys))
    return keys[order], known[order, answer_col]


def evaluate_kge(
    model: KGEModel,
    read_entities: Callable[[I64], F32],
    read_relations: Callable[[I64], F32],
    test: I64,
    *,
    num_entities: int,
    num_relations: int,
    known: I64 | None = None,
    num_candidates: int | None = None,
    seed: int = 0,
    query_batch: int = 256,
) -> dict[str, float]:
    """Filtered MRR and Hits@1/3/10 over head and tail prediction of `test`.

    Each test triple (h, r, t) is ranked twice: t among the candidate tails of (h, r, ?), and
    h among the candidate heads of (?, r, t). Candidates are all E entities, or, with
    `num_candidates`, a seeded uniform sample of that many shared by all queries plus the true
    answer (the sampled protocol of the largest graphs). Known true triples other than the
    test triple (`known`, e.g. train + valid + test) are removed from the candidates
    ("filtered" setting, Bordes et al. 2013). Rank = 1 + #higher + #equal / 2.

    Args:
        model: The score function.
        read_entities: Entity vectors of ids, (n,) -> (n, D), without side effects.
        read_relations: Relation vectors of ids.
        test: (T, 3) triples to rank.
        num_entities: E.
        num_relations: R.
        known: (T', 3) true triples to filter out, or None for the raw (unfiltered) setting.
        num_candidates: Sample size, or None for all entities.
        seed: Seed of the candidate sample.
        query_batch: Test triples scored at once.

    Returns:
        `mrr`, `hits@1`, `hits@3`, `hits@10` (means over 2T rankings) and `num_rankings`.

    Raises:
        ValueError: If `test` is empty or `num_candidates` is not in [1, E).
    """
    if not len(test):
        raise ValueError("test holds no triples; give at least one (T, 3) triple")
    if num_candidates is None:
        candidates = np.arange(num_entities, dtype=np.int64)
    else:
        if not 1 <= num_candidates < num_entities:
            raise ValueError(
                f"num_candidates={num_candidates} must be in [1, {num_entities}) (E="
                f"{num_entities}); or None to rank against all entities"
            )
        rng = np.random.default_rng([seed, 0xE7A1])
        candidates = np.sort(rng.choice(num_entities, size=num_candidates, replace=False))
    cand = torch.from_numpy(np.ascontiguousarray(read_entities(candidates)))
    ranks: list[F32] = []
    sides = (("tail", (0, 1), 2), ("head", (2, 1), 0))
    filters = {}
    if known is not None:
        for side, key_cols, answer_col in sides:
            filters[side] = _known_answers(known, key_cols, answer_col, num_relations)
    with torch.no_grad():
        for start in range(0, len(test), query_batch):
            part = test[start : start + query_batch]
            n = len(part)
            ent_ids, local = np.unique(part[:, [0, 2]], return_inverse=True)
            ent = torch.from_numpy(np.ascontiguousarray(read_entities(ent_ids)))
            rel = torch.from_numpy(np.ascontiguousarray(read_relations(part[:, 1])))
            local = local.reshape(n, 2)
            h = ent[torch.from_numpy(local[:, 0])]
            t = ent[torch.from_numpy(local[:, 1])]
            true = model.score(h, rel, t).numpy()
            for side, key_cols, answer_col in sides:
                if side == "tail":
                    scores = model.score_tails(h[None], rel[None], cand[None])[0]
                else:
                    scores = model.score_heads(cand[None], rel[None], t[None])[0]
                s = scores.numpy().astype(np.float64)
                if side in filters:
                    keys, answers = filters[side]
                    query = part[:, key_cols[0]] * num_relations + part[:, key_cols[1]]
                    lo = np.searchsorted(keys, query, side="left")
                    hi = np.searchsorted(keys, query, side="right")
                    rows = np.repeat(np.arange(n), hi - lo)
                    idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)])
                    answer = answers[idx] if len(idx) else np.empty(0, dtype=np.int64)
                    pos = np.searchsorted(candidates, answer)
                    pos = np.minimum(pos, len(candidates) - 1)
                    hit = candidates[pos] == answer
                    s[rows[hit], pos[hit]] = -np.inf  # every true answer, the test one too
                # the test answer itself is scored separately (`true`), so drop it from s too
                answer_ids = part[:, answer_col]
                pos = np.minimum(np.searchsorted(candidates, answer_ids), len(candidates) - 1)
                in_cand = candidates[pos] == answer_ids
                s[np.flatnonzero(in_cand), pos[in_cand]] = -np.inf
                higher = (s > true[:, None]).sum(axis=1)
                equal = (s == true[:, None]).sum(axis=1)
                ranks.append((1.0 + higher + equal / 2.0).astype(np.float32))
    rank = np.concatenate(ranks).astype(np.float64)
    return {
        "mrr": float(np.mean(1.0 / rank)),
        "hits@1": float(np.mean(rank <= 1)),
        "hits@3": float(np.mean(rank <= 3)),
        "hits@10": float(np.mean(rank <= 10)),
        "num_rankings": float(len(rank)),
    }


# --- the training loop ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class KGEResult:
    """What `train_kge` measured."""

    losses: tuple[float, ...]
    """Loss of every step."""
    step_s: tuple[float, ...]
    """Wall seconds of every step (read, forward, backward, update)."""
    read_s: float
    """Seconds spent inside `entities.get` (the data stall)."""
    triples_per_s: float
    """Positive triples per second over the steps after `warmup_steps` (median step time)."""


def train_kge(
    sampler: KGESampler,
    entities: KGETable,
    relations: KGETable,
    *,
    num_steps: int,
    lookahead: int = 0,
    warmup_steps: int = 0,
    start_step: int = 0,
) -> KGEResult:
    """Train `num_steps` steps, hinting each batch `lookahead` steps early to `entities`.

    Args:
        sampler: The batch source (its config names the model).
        entities: Entity table of `kge_row_spec(config)` rows.
        relations: Relation table of the same rows.
        num_steps: Steps to run, >= 1.
        lookahead: Window W of `LookaheadLoader`, >= 0.
        warmup_steps: Leading steps left out of `triples_per_s`.
        start_step: First step (to continue a run).

    Returns:
        Losses, step times and the throughput.

    Raises:
        ValueError: If `num_steps` < 1 or `lookahead` < 0.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be >= 1")
    model = KGE_MODELS.get(sampler.config.model)(sampler.config)
    read_s = 0.0

    class _Timed:
        def get(self, ids: I64, step: int) -> F32:
            nonlocal read_s
            t0 = time.perf_counter()
            rows = entities.get(ids, step)
            read_s += time.perf_counter() - t0
            return rows

        def apply_gradients(self, ids: I64, grads: F32, step: int) -> None:
            entities.apply_gradients(ids, grads, step)

        def lookahead(self, ids: Any, step: int) -> None:
            entities.lookahead(ids, step)

        def release(self, ids: I64, step: int) -> None:
            _release(entities, ids, step)

    timed = _Timed()
    losses: list[float] = []
    step_s: list[float] = []
    loader = LookaheadLoader(sampler.batches(num_steps, start_step), entities, lookahead)
    for batch in loader:
        assert isinstance(batch, KGEBatch)
        t0 = time.perf_counter()
        losses.append(kge_step(model, batch, timed, relations))
        step_s.append(time.perf_counter() - t0)
    timed_steps = step_s[warmup_steps:] if len(step_s) > warmup_steps else step_s
    return KGEResult(
        losses=tuple(losses),
        step_s=tuple(step_s),
        read_s=read_s,
        triples_per_s=sampler.config.batch_size / float(np.median(timed_steps)),
    )
