"""`RecsysTrainConfig`: one training run, and the staleness bound each mode guarantees."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from frugal.config import check_types
from frugal.recsys.client import WireDtype
from frugal.recsys.datasets import RecsysDataConfig
from frugal.recsys.dense import DenseOptimizerName
from frugal.recsys.models import DENSE_MODELS, ModelName
from frugal.recsys.ps import split_capacity
from frugal.store import OptimizerConfig, RowSpec

__all__ = [
    "Mode",
    "RecsysTrainConfig",
    "dense_weight_decay",
    "prefetch_depth",
    "sequence_indices",
    "shard_budget_bytes",
    "shard_rows_bytes",
    "staleness_bound",
    "table_dims",
]

Mode = Literal["sync", "hybrid", "async"]
PoolingMode = Literal["sum", "mean", "max"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysTrainConfig:
    """Everything one `frugal recsys train` run needs (every rank gets the same)."""

    data: RecsysDataConfig = field(default_factory=RecsysDataConfig)
    """Dataset and split."""
    mode: Mode = "hybrid"
    """sync, hybrid (async embeddings, sync dense) or async (both async)."""
    staleness: int = 8
    """K: permits per trainer (batches read ahead of their applied gradients), >= 1. hybrid
    and async only: sync ignores it (`frugal recsys train` refuses --staleness with sync)."""
    prefetch_depth: int | None = 1
    """hybrid: lookups started ahead of the step being computed, >= 1, capped by K (None = K:
    run ahead as far as the permits allow, as Persia does). 1 = the lookup of step t + 1
    starts when step t starts computing: it hides a PS round trip shorter than a step, and
    rows are read as late as that allows (fresher rows, a smaller AUC gap to sync); raise it
    for round trips longer than a step. K still bounds reads plus unacknowledged pushes.
    async always runs ahead K (its dense pulls are meant to be up to K steps stale)."""
    nproc: int = 2
    """Trainer processes (world_size), each hosting one PS shard, in [1, 64]."""
    rtt_ms: float = 0.0
    """Simulated network round trip per PS call (a sleep on the serving side), >= 0."""
    model: ModelName = "dlrm"
    """Dense model, a name in `frugal.recsys.models.DENSE_MODELS`: dlrm, mlp (wide & deep),
    or one added by `register_dense_model`."""
    hidden: tuple[int, ...] = (64, 32)
    """Hidden widths of the MLPs, each >= 1."""
    batch_size: int = 128
    """Samples per trainer per step (B), >= 1."""
    embedding_dim: int = 8
    """Embedding width of every table `embedding_dims` leaves out, >= 1."""
    embedding_dims: tuple[int, ...] = ()
    """Embedding width of each table, each >= 1, one per table in the data's feature order
    (empty: `embedding_dim` for all). Each PS shard keeps one store per width; the dense model
    then gets the pooled features side by side, `(B, sum of the widths)`: the mlp model takes
    that, dlrm projects each narrower feature to the widest width first (mixed-dimension
    embeddings, arXiv 1909.11810)."""
    pooling: tuple[PoolingMode, ...] = ("sum",)
    """How each (feature, sample) bag of ids becomes one vector: "sum", "mean" or "max"
    (`torch.nn.EmbeddingBag`'s modes; an empty bag gives zeros). One entry for every
    table, or one per table in the data's feature order."""
    sequence_features: tuple[str, ...] = ()
    """Features the dense model gets unpooled, each bag's ids in order (a user's history:
    `movielens100k_history`'s `history`); the model pools each by DIN attention against
    `sequence_target` (`frugal.recsys.models.SequenceFeatures`, arXiv 1706.06978). Their
    `pooling` entries are unused."""
    sequence_target: str | None = None
    """The pooled feature each sequence feature's attention compares its items with (DIN's
    candidate item, e.g. movie_id), of the same width; None: a learned query per sequence
    feature."""
    dense_lr: float = 0.05
    """Learning rate of the dense optimizer, > 0 (0.05 suits sgd; adam and adamw usually want
    about 1e-3, torch's default)."""
    dense_optimizer: DenseOptimizerName = "sgd"
    """Optimizer of the dense parameters: sgd (plain, no momentum), adam or adamw
    (torch.optim.Adam / AdamW). sync and hybrid step it on the whole model after the
    AllReduce; async steps each PS chunk once per push (world_size steps per training step)."""
    dense_betas: tuple[float, float] = (0.9, 0.999)
    """adam/adamw: decays of the first and second moment estimates, each in [0, 1)."""
    dense_eps: float = 1e-8
    """adam/adamw: epsilon added to the denominator, > 0."""
    dense_weight_decay: float | None = None
    """adam: L2 penalty added to the gradient; adamw: decoupled decay (p *= 1 - lr * decay);
    >= 0. None: torch's default, 0 for adam and 0.01 for adamw. sgd has none."""
    embedding_optimizer: OptimizerConfig = field(
        default_factory=lambda: OptimizerConfig(kind="rowwise_adagrad", lr=0.05, eps=1e-10)
    )
    """Sparse optimizer of the embedding rows (applied on the PS)."""
    epochs: int = 1
    """Passes over the training split, >= 1."""
    max_steps: int | None = None
    """Stop after this many steps per trainer (None = all epochs), >= 1."""
    warmup_steps: int = 5
    """Steps excluded from throughput and timing medians, >= 0."""
    wire_dtype: WireDtype = "float16"
    """Precision of embeddings and their gradients on the wire."""
    store_backend: Literal["memory", "file"] = "memory"
    """`frugal.store` backend of the PS shards."""
    ps_memory_ratio: float | None = None
    """Memory budget of each PS shard's store as a fraction of its rows' bytes (shard
    capacity x row bytes), in (0, 1]; None holds every row in RAM. Rows then live on disk:
    needs store_backend = "file". Give this or ps_memory_budget_bytes, not both."""
    ps_memory_budget_bytes: int | None = None
    """The same budget in bytes per shard (cache, key map and I/O buffers), >= 1."""
    ps_admit_after: int = 1
    """Pushes of an id before its PS shard gives it a row, >= 1 (1: on the first push);
    until then it reads its initial value and its gradients are dropped (a count-min
    sketch's frequency filter, `EmbeddingShard.Config.admit_after`)."""
    ps_capacity_rows: int | None = None
    """Rows each PS shard can hold, >= 1 (None: its share of the tables' declared sizes,
    `shard_capacity`). Below the ids the stream brings, set ps_when_full or
    ps_expire_after_steps, else a full shard stops training with `KeySpaceFullError`; below
    the ids one batch brings to a shard (`frugal.recsys.launch.max_batch_rows`) a run is
    refused before launch."""
    ps_when_full: Literal["error", "evict_lru"] = "error"
    """What a push of new ids into a full PS shard does: "error" raises; "evict_lru" deletes
    the rows pushed least recently (`EmbeddingShard.Config.when_full`)."""
    ps_expire_after_steps: int | None = None
    """Delete rows no trainer pushed for more than this many training steps, >= 1 (None:
    never); an expired id starts again from its initial value."""
    ps_lookahead: int = 0
    """Steps ahead whose ids each trainer hints to the owning PS shards, whose stores then
    prefetch those rows from disk, >= 0 (0: no hints; useful with a memory budget)."""
    timeout_s: float = 60.0
    """Longest wait for any collective, RPC, permit or queue, > 0."""
    seed: int = 0
    """Seed of the model, the row initialisation and the shuffling, >= 0."""
    job_timeout_s: float = 3600.0
    """Wall-clock limit of the whole torchrun job (`frugal recsys train`), > 0."""
    checkpoint_dir: str | None = None
    """Folder of checkpoints (None: no checkpoints)."""
    checkpoint_every_steps: int | None = None
    """Checkpoint every N steps (and at the end when checkpoint_dir is set), >= 1."""
    checkpoint_full_every: int = 8
    """Every how many checkpoints one is full, >= 1; the others are incremental (only the
    rows written and the ids deleted since the checkpoint before). A chain holds one full
    checkpoint and at most checkpoint_full_every - 1 incremental ones; 1 writes only full
    checkpoints (each rewrites every row)."""
    resume: bool = False
    """Start from the newest checkpoint in checkpoint_dir if any (restarts always resume)."""
    max_restarts: int = 0
    """torchrun --max-restarts: restarts of the worker group after a failure, >= 0."""
    features: tuple[str, ...] | None = None
    """Expected feature (table) names of the dataset, checked at start-up (None: any)."""
    fail_at_step: int | None = None
    """Fault injection for tests: the last rank kills itself at this step (first attempt)."""

    def __post_init__(self) -> None:
        check_types(self)
        DENSE_MODELS.check(self.model)
        if self.checkpoint_every_steps is not None and (
            self.checkpoint_every_steps < 1 or self.checkpoint_dir is None
        ):
            raise ValueError(
                f"checkpoint_every_steps={self.checkpoint_every_steps} needs checkpoint_dir "
                "and a value >= 1"
            )
        if self.checkpoint_full_every < 1:
            raise ValueError(
                f"checkpoint_full_every={self.checkpoint_full_every} must be >= 1 (1: every "
                "checkpoint full; 8: a full one, then 7 incremental ones)"
            )
        if self.checkpoint_dir is not None and not self.checkpoint_dir.strip():
            raise ValueError(
                f"checkpoint_dir={self.checkpoint_dir!r} is empty; give a folder (or leave it "
                "unset for no checkpoints)"
            )
        folder = Path(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        if folder is not None and folder.exists() and not folder.is_dir():
            raise ValueError(
                f"checkpoint_dir={self.checkpoint_dir!r} is a file; give a folder (it is "
                "created if missing)"
            )
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=true needs checkpoint_dir (where the checkpoints are)")
        if self.staleness < 1:
            raise ValueError(f"staleness={self.staleness} must be >= 1 (K permits)")
        if self.prefetch_depth is not None and self.prefetch_depth < 1:
            raise ValueError(
                f"prefetch_depth={self.prefetch_depth} must be >= 1 (lookups started ahead; "
                "values above staleness K act as K); from Python, None runs ahead K"
            )
        if not 1 <= self.nproc <= 64:
            raise ValueError(f"nproc={self.nproc} must be in [1, 64]")
        if not self.pooling:
            raise ValueError(
                'pooling=() names no mode; give one for every table (e.g. ["sum"]) or one per table'
            )
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden={self.hidden} must be non-empty widths >= 1")
        for name in ("batch_size", "embedding_dim", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if any(dim < 1 for dim in self.embedding_dims):
            raise ValueError(
                f"embedding_dims={list(self.embedding_dims)} must each be >= 1 (one width per "
                "table; [] gives every table embedding_dim)"
            )
        for name in ("rtt_ms", "warmup_steps", "seed", "max_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in ("dense_lr", "timeout_s", "job_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1 or None")
        self._check_dense_optimizer()
        self._check_ps_budget()

    def _check_dense_optimizer(self) -> None:
        beta1, beta2 = self.dense_betas
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(
                f"dense_betas={self.dense_betas} must each be in [0, 1) (moment decays; "
                "torch's default is (0.9, 0.999))"
            )
        if self.dense_eps <= 0:
            raise ValueError(f"dense_eps={self.dense_eps} must be > 0 (torch's default is 1e-8)")
        if self.dense_weight_decay is not None and self.dense_weight_decay < 0:
            raise ValueError(
                f"dense_weight_decay={self.dense_weight_decay} must be >= 0 (or None: 0 for adam, "
                "0.01 for adamw)"
            )
        if self.dense_optimizer != "sgd":
            return
        defaults = RecsysTrainConfig.__dataclass_fields__
        for name in ("dense_betas", "dense_eps"):
            if getattr(self, name) != defaults[name].default:
                raise ValueError(
                    f"{name}={getattr(self, name)} applies to adam and adamw only, but "
                    "dense_optimizer='sgd'; set dense_optimizer to 'adam' or 'adamw', or drop "
                    f"{name}"
                )
        if self.dense_weight_decay:
            raise ValueError(
                f"dense_weight_decay={self.dense_weight_decay} applies to adam and adamw only "
                "(plain SGD has no weight decay), but dense_optimizer='sgd'; set "
                "dense_optimizer to 'adam' or 'adamw', or drop dense_weight_decay"
            )

    def _check_ps_budget(self) -> None:
        ratio, budget = self.ps_memory_ratio, self.ps_memory_budget_bytes
        if ratio is not None and budget is not None:
            raise ValueError(
                f"ps_memory_ratio={ratio} and ps_memory_budget_bytes={budget} name the same "
                "budget; give one of them"
            )
        if ratio is not None and not 0 < ratio <= 1:
            raise ValueError(
                f"ps_memory_ratio={ratio} must be in (0, 1] (a fraction of the shard's rows); "
                "leave it unset to hold every row in RAM"
            )
        if budget is not None and budget < 1:
            raise ValueError(f"ps_memory_budget_bytes={budget} must be >= 1")
        if (ratio is not None or budget is not None) and self.store_backend != "file":
            raise ValueError(
                'a PS memory budget keeps rows on disk: set store_backend = "file" (it is '
                f"{self.store_backend!r}, which holds every row in RAM)"
            )
        if self.ps_admit_after < 1:
            raise ValueError(
                f"ps_admit_after={self.ps_admit_after} must be >= 1 (1 admits every id)"
            )
        if self.ps_capacity_rows is not None and self.ps_capacity_rows < 1:
            raise ValueError(
                f"ps_capacity_rows={self.ps_capacity_rows} must be >= 1, or None for the "
                "tables' declared sizes"
            )
        if self.ps_expire_after_steps is not None and self.ps_expire_after_steps < 1:
            raise ValueError(
                f"ps_expire_after_steps={self.ps_expire_after_steps} must be >= 1, or None to "
                "keep rows"
            )
        if self.ps_lookahead < 0:
            raise ValueError(f"ps_lookahead={self.ps_lookahead} must be >= 0 (0: no hints)")


def shard_rows_bytes(
    config: RecsysTrainConfig, capacity_rows: int, num_embeddings: tuple[int, ...]
) -> int:
    """Bytes of a full PS shard's rows (embedding plus sparse-optimizer state), every width.

    Each width's share of `capacity_rows` (`split_capacity`) times its row's bytes.
    """
    dims = table_dims(config, len(num_embeddings))
    return sum(
        rows * RowSpec(embedding_dim=dim, optimizer=config.embedding_optimizer).row_bytes
        for dim, rows in split_capacity(num_embeddings, dims, capacity_rows).items()
    )


def shard_budget_bytes(
    config: RecsysTrainConfig, capacity_rows: int, num_embeddings: tuple[int, ...]
) -> int | None:
    """Memory budget of one PS shard's stores, bytes, or None (every row in RAM).

    `ps_memory_budget_bytes`, or `ps_memory_ratio` x the bytes of `capacity_rows` rows
    (`shard_rows_bytes`: embedding plus sparse-optimizer state, each table at its width).
    """
    if config.ps_memory_budget_bytes is not None:
        return config.ps_memory_budget_bytes
    if config.ps_memory_ratio is None:
        return None
    rows_bytes = shard_rows_bytes(config, capacity_rows, num_embeddings)
    return max(1, int(config.ps_memory_ratio * rows_bytes))


def table_dims(config: RecsysTrainConfig, num_tables: int) -> tuple[int, ...]:
    """Embedding width of each of the data's `num_tables` tables.

    Raises:
        ValueError: If `embedding_dims` is given with another length than `num_tables`.
    """
    if not config.embedding_dims:
        return (config.embedding_dim,) * num_tables
    if len(config.embedding_dims) != num_tables:
        raise ValueError(
            f"embedding_dims has {len(config.embedding_dims)} widths, {config.data.dataset} has "
            f"{num_tables} tables; give one width per table, or [] for embedding_dim on all"
        )
    return tuple(config.embedding_dims)


def sequence_indices(
    config: RecsysTrainConfig, keys: tuple[str, ...]
) -> tuple[tuple[int, ...], int | None]:
    """Indices of `sequence_features` and of `sequence_target` among the data's features.

    Raises:
        ValueError: If a name is not one of `keys`, repeats, or the target is a sequence
            feature.
    """
    unknown = [
        name
        for name in (*config.sequence_features, config.sequence_target)
        if name is not None and name not in keys
    ]
    if unknown:
        raise ValueError(
            f"sequence feature or target {unknown[0]!r} is not a feature of "
            f"{config.data.dataset} ({list(keys)}); name one of those"
        )
    if len(set(config.sequence_features)) != len(config.sequence_features):
        raise ValueError(f"sequence_features={list(config.sequence_features)} repeats a name")
    target = config.sequence_target
    if target is not None and target in config.sequence_features:
        raise ValueError(
            f"sequence_target={target!r} is a sequence feature; the target must be a pooled "
            "feature (the candidate item), or None for a learned query"
        )
    return (
        tuple(keys.index(name) for name in config.sequence_features),
        None if target is None else keys.index(target),
    )


def dense_weight_decay(config: RecsysTrainConfig) -> float:
    """The dense optimizer's weight decay: `dense_weight_decay`, or torch's default for it.

    None gives 0.0 for sgd and adam and 0.01 for adamw (torch.optim.AdamW's default).
    """
    if config.dense_weight_decay is not None:
        return config.dense_weight_decay
    return 0.01 if config.dense_optimizer == "adamw" else 0.0


def staleness_bound(mode: Mode, staleness: int, world_size: int) -> int:
    """The largest lag (updates a row got between its read and the push) a mode allows.

    sync: world_size - 1 (the other trainers' pushes of the same step). hybrid: (K - 1) own
    + 3K per other trainer (AllReduce keeps trainers in step; a read is at most K steps ahead
    and each trainer has at most K pushes in flight). async: (K - 1) own + (5K - 1) per other
    trainer. A read for step t needs step t - K acknowledged, and computing t - K needed
    (stale-synchronous rule) every other trainer's step t - 2K dense push applied, so that
    trainer's embedding pushes through t - 3K are applied (K permits): the window opens at
    t - 3K + 1. Our push of t lands while we may compute up to t + K - 1, which lets another
    trainer compute up to t + 2K - 1: the window closes there.
    """
    if mode == "sync":
        return world_size - 1
    per_other = 5 * staleness - 1 if mode == "async" else 3 * staleness
    return (staleness - 1) + per_other * (world_size - 1)


def prefetch_depth(config: RecsysTrainConfig) -> int:
    """Lookups a run-ahead trainer keeps started ahead of its compute: min(depth, K).

    async and `prefetch_depth=None` run ahead K (Persia's run-ahead); sync never prefetches (1).
    """
    if config.mode == "sync":
        return 1
    if config.mode == "async" or config.prefetch_depth is None:
        return config.staleness
    return min(config.prefetch_depth, config.staleness)
