"""One trainer process of `frugal recsys train`: NN worker + embedding worker + PS shard.

Run by torchrun (`python -m frugal.recsys.trainer JOB_JSON`, see `frugal.recsys.launch`):
every process joins the gloo group (dense AllReduce), serves one PS shard over
torch.distributed.rpc and trains on its share of the batches (step s of rank r takes the
samples `cursor + (s * world_size + r) * B + [0, B)` of the seeded sample order).

Modes (Persia, section 3):
- `sync`: look up batch t after every push of t - 1 is acknowledged and a barrier passed;
  dense AllReduce every step. Pushes carry the sequence number `step * world_size + rank`
  and every shard applies them in that order, so a sync run is bit-reproducible. Measured
  staleness <= world_size - 1.
- `hybrid` (K): a run-ahead thread keeps lookups in flight, each holding a permit that is
  released when every shard has acknowledged applying that batch's gradients (pushes are
  fire and forget); dense AllReduce every step. At most `prefetch_depth` (default 1, capped
  by K) lookups are started ahead of the step being computed: enough to hide a PS round
  trip shorter than a step, and rows are read as late as that allows. Own missed updates
  <= K - 1; measured lag <= (K - 1) + 3K(world_size - 1) (`staleness_bound`).
- `async` (K): Persia's fully asynchronous baseline. Embeddings as hybrid but run ahead the
  whole K; the dense parameters live in world_size chunks on the PS (chunk i on rank i),
  pulled with the lookup (so up to K steps before use) under the stale-synchronous rule
  (step t is computed only once every rank's step t - K push is applied); no AllReduce.

The dense optimizer (`dense_optimizer`: sgd, adam or adamw, `frugal.recsys.dense`) steps the
whole model after the AllReduce in sync and hybrid, and each PS chunk once per push in async;
checkpoints hold its state in the model's layout (async chunks gathered by rank 0).

References:
    Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to 100
    Trillion Parameters, KDD 2022, arXiv 2111.05897 (sections 3 and 4).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import queue
import shutil
import signal
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from frugal.config import config_from_dict, config_to_dict
from frugal.disk import guard_write
from frugal.launch.group import init_group
from frugal.recsys.batch import KJTBatch, RecsysData, RecsysSplit
from frugal.recsys.checkpoint import (
    check_compat,
    commit_checkpoint,
    compat_fields,
    import_chain,
    read_chain,
    read_latest,
)
from frugal.recsys.client import EmbeddingClient, LookupResult, PendingLookup
from frugal.recsys.config import (
    Mode,
    RecsysTrainConfig,
    dense_weight_decay,
    prefetch_depth,
    sequence_indices,
    shard_budget_bytes,
    staleness_bound,
    table_dims,
)
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data
from frugal.recsys.dense import (
    DenseOptimizer,
    build_dense_optimizer,
    chunk_state,
    merge_chunk_states,
)
from frugal.recsys.errors import PSUnavailableError, RecsysError, StalenessBoundError
from frugal.recsys.loader import BatchSource, count_total_samples
from frugal.recsys.metrics import log_loss, roc_auc
from frugal.recsys.models import build_model
from frugal.recsys.permits import Permits
from frugal.recsys.ps import (
    NUM_VIRTUAL_SHARDS,
    DenseShard,
    EmbeddingShard,
    default_owners,
    shard_capacity,
)
from frugal.recsys.shard_files import write_shard_file
from frugal.recsys.transport import Handle, RpcTransport, ShardServer

__all__ = ["Mode", "RecsysTrainConfig", "staleness_bound", "train_rank"]


_DISK_FULL_FIX = "free space there or set checkpoint_dir to a folder on a larger disk"


@dataclass(slots=True)
class _Timings:
    lookup_wait_ms: list[float] = field(default_factory=list)
    permit_wait_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)
    allreduce_ms: list[float] = field(default_factory=list)
    dense_opt_ms: list[float] = field(default_factory=list)
    push_enqueue_ms: list[float] = field(default_factory=list)
    push_wait_ms: list[float] = field(default_factory=list)


@functools.lru_cache(maxsize=2)
def _load_data(config: RecsysDataConfig) -> tuple[RecsysSplit, RecsysData]:
    """The dataset of `config`, loaded once per process (a bench runs many cells on it)."""
    return load_recsys_data(config)


@functools.lru_cache(maxsize=2)
def _alpha_max(config: RecsysDataConfig) -> float:
    """Largest share of training samples that touch one row (Persia's sparsity alpha)."""
    train = _load_data(config)[0]
    if not isinstance(train, RecsysData):  # a generated stream: its first 100k samples
        train = _materialize_head(train, 100_000)
    top = 0.0
    for f, values in enumerate(train.values):
        offsets = train.offsets[f]
        sample = np.repeat(np.arange(train.num_samples), np.diff(offsets))
        pairs = np.unique(np.stack([values, sample], axis=1), axis=0)  # one per (id, sample)
        _, counts = np.unique(pairs[:, 0], return_counts=True)
        top = max(top, float(counts.max()) / train.num_samples if len(counts) else 0.0)
    return top


def _materialize_head(split: RecsysSplit, num_samples: int) -> RecsysData:
    """The first `num_samples` samples of a split as `RecsysData` (one id per feature)."""
    rows = np.arange(min(num_samples, split.num_samples), dtype=np.int64)
    batch = split.batch(rows, batch_id=-1)
    if not (batch.lengths == 1).all():
        raise ValueError("only a split with one id per (feature, sample) is materialised here")
    ids_SF = batch.values.reshape(len(split.keys), len(rows)).T
    return RecsysData.from_columns(
        split.keys, split.num_embeddings, ids_SF, batch.dense, batch.labels
    )


def _dense_optimizer(config: RecsysTrainConfig) -> functools.partial[DenseOptimizer]:
    """`build_dense_optimizer` with the config's settings: call it on the parameters."""
    return functools.partial(
        build_dense_optimizer,
        kind=config.dense_optimizer,
        lr=config.dense_lr,
        betas=config.dense_betas,
        eps=config.dense_eps,
        weight_decay=dense_weight_decay(config),
    )


def _allreduce_grads(params: list[nn.Parameter], world_size: int) -> None:
    """Average the gradients of `params` over the ranks (one flat AllReduce, as DDP does)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    for p, grad in zip(params, torch.split(flat, [p.numel() for p in params]), strict=True):
        p.grad = grad.view_as(p)  # views of this step's fresh buffer


class _Hints:
    """Send each batch's ids to the owning shards `window` steps before its lookup.

    The shards' stores prefetch the rows from disk meanwhile (MLKV's lookahead on the PS).
    Hints are fire and forget; their handles are checked (and a failed hint raised) once
    more than `_MAX_OPEN` are in flight, and all at `finish()`.
    """

    _MAX_OPEN = 256

    def __init__(self, client: EmbeddingClient, source: BatchSource, window: int) -> None:
        self.client, self.source, self.window = client, source, window
        self.next_step = 0  # the first step not hinted yet
        self.open: deque[Handle] = deque()

    def before(self, step: int) -> None:
        """Hint every step up to `step + window` not hinted yet (from `step` on)."""
        if self.window == 0:
            return
        self.next_step = max(self.next_step, step)
        last = min(step + self.window, self.source.num_steps - 1)
        while self.next_step <= last:
            batch = self.source.batch(self.next_step)
            self.open.extend(self.client.hint(batch, batch.batch_id))
            self.next_step += 1
        while len(self.open) > self._MAX_OPEN:
            self.open.popleft().wait()

    def finish(self) -> None:
        """Wait for the hints in flight (raising the first failure)."""
        while self.open:
            self.open.popleft().wait()


def _params_sha256(model: nn.Module) -> str:
    return hashlib.sha256(
        parameters_to_vector(model.parameters()).detach().numpy().tobytes()
    ).hexdigest()


def _mean_or_none(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else 0.0


class _Trainer:
    def __init__(
        self,
        config: RecsysTrainConfig,
        out_dir: Path,
        rank: int,
        world_size: int,
        transport: RpcTransport,
    ):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.train, self.test = _load_data(config.data)
        if config.features is not None and tuple(config.features) != self.train.keys:
            raise ValueError(
                f"features={list(config.features)} do not match {config.data.dataset}'s "
                f"features {list(self.train.keys)}; fix the config's features list"
            )
        torch.manual_seed(config.seed)
        dims = table_dims(config, len(self.train.keys))
        model_dims = dims[0] if len(set(dims)) == 1 else dims
        sequences, target = sequence_indices(config, self.train.keys)
        self.model = build_model(
            config.model,
            len(self.train.keys),
            model_dims,
            self.train.dense_dim,
            config.hidden,
            sequence_features=sequences,
            sequence_target=target,
        )
        capacity_rows = config.ps_capacity_rows or shard_capacity(
            self.train.num_embeddings, world_size
        )
        expire = config.ps_expire_after_steps
        shard_config = EmbeddingShard.Config(
            embedding_dim=config.embedding_dim,
            table_dims=dims,
            optimizer=config.embedding_optimizer,
            backend=config.store_backend,
            memory_budget_bytes=shard_budget_bytes(
                config, capacity_rows, self.train.num_embeddings
            ),
            seed=config.seed,
            admit_after=config.ps_admit_after,
            # A push's step is the trainer's batch id: world_size of them per training step.
            expire_after_steps=None if expire is None else expire * world_size,
            when_full=config.ps_when_full,
            timeout_s=config.timeout_s,
        )
        shard_dir = out_dir / "ps" / f"rank{rank}"
        shutil.rmtree(shard_dir, ignore_errors=True)  # rows come back from checkpoints only
        try:
            self.shard = EmbeddingShard(
                shard_dir, self.train.num_embeddings, shard_config, capacity_rows=capacity_rows
            )
        except ValueError as exc:
            if config.ps_memory_ratio is None or "memory_budget_bytes" not in str(exc):
                raise
            raise ValueError(
                f"ps_memory_ratio={config.ps_memory_ratio} gives each PS shard "
                f"{shard_config.memory_budget_bytes} bytes for its {capacity_rows:,} rows: {exc}. "
                "Raise ps_memory_ratio, or give that budget as ps_memory_budget_bytes"
            ) from exc
        self.params = list(self.model.parameters())  # walked every step: list them once
        self.optimizer = _dense_optimizer(config)(self.params)
        self.resumed_from: int | None = None
        # Names the training run in its checkpoints and exports (kept across resumes), so a
        # snapshot can refuse to pair one run's tables with another run's dense model.
        self.run_id = uuid.uuid4().hex
        # The last checkpoint this process wrote or resumed from, and the incremental ones
        # its chain holds: the shard's change tracking is relative to it.
        self.last_checkpoint: tuple[str, int] | None = None
        start_sample, total_samples = self._maybe_resume()
        self.chunks = (
            parameters_to_vector(self.model.parameters()).detach().tensor_split(world_size)
        )
        dense = None
        if config.mode == "async":
            dense = DenseShard(self.chunks[rank], world_size, optimizer=_dense_optimizer(config))
            if total_samples is not None:  # resumed: this chunk's part of the checkpoint's state
                start = sum(len(c) for c in self.chunks[:rank])
                dense.load_optimizer_state_dict(
                    chunk_state(
                        self.optimizer.state_dict(), self.params, start, start + len(dense.params)
                    )
                )
        self.server = ShardServer(self.shard, dense, config.rtt_ms)
        self.transport = transport
        self.client = EmbeddingClient(
            self.transport,
            default_owners(world_size),
            len(self.train.keys),
            dims,
            config.wire_dtype,
            raw_ids=self.train.raw_ids,
            pooling=config.pooling,
            sequence_features=sequences,
        )
        self.source = BatchSource(self.train, config, rank, world_size, start_sample, total_samples)
        self.hints = _Hints(self.client, self.source, config.ps_lookahead)
        self.bound = staleness_bound(config.mode, config.staleness, world_size)
        self.timings = _Timings()
        self.losses: list[float] = []
        self.t_warm = self.t_end = time.perf_counter()
        self.cpu_warm = self.cpu_end = time.process_time()  # CPU of every thread (PS included)
        self.step_ends: list[tuple[int, float]] = []  # (step, end time) of every step
        self.warm_step = -1
        self.max_lag_acked = 0
        self.checkpoints_written = 0
        self.gate = threading.Condition()
        self.gate_open_until = 0  # the run-ahead may read steps < this (checkpoint quiescing)

    # --- checkpoints -----------------------------------------------------------------------
    def _maybe_resume(self) -> tuple[int, int | None]:
        """Load the newest checkpoint if asked to (or restarted); return the cursor."""
        config = self.config
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        if config.checkpoint_dir is None or not (config.resume or restarted):
            return 0, None
        found = read_latest(Path(config.checkpoint_dir))
        if found is None:
            return 0, None
        folder, manifest = found
        check_compat(folder, manifest["compat"], config)
        self.run_id = str(manifest.get("run_id", self.run_id))
        chain = read_chain(folder, manifest)  # the full checkpoint, then the deltas
        resume_batch_id = int(manifest["samples_done"]) // config.batch_size
        import_chain(self.shard, default_owners(self.world_size), self.rank, chain, resume_batch_id)
        self.last_checkpoint = (folder.name, len(chain) - 1)
        dense = torch.load(folder / "dense.pt", weights_only=True)
        self.model.load_state_dict(dense["model"])
        self.optimizer.load_state_dict(dense["optimizer"])
        self.resumed_from = int(manifest["samples_done"])
        total = int(manifest["total_samples"])
        saved = manifest.get("config") or {}
        if (saved.get("max_steps"), saved.get("epochs")) != (config.max_steps, config.epochs):
            # The job asks for another length than the checkpoint's run: extend (or cut) it.
            total = count_total_samples(config, self.train.num_samples, self.world_size)
        return int(manifest["samples_done"]), total

    def is_boundary(self, step: int) -> bool:
        """Whether a checkpoint is taken before computing `step` (0 < step < num_steps)."""
        every = self.config.checkpoint_every_steps
        return every is not None and 0 < step < self.source.num_steps and step % every == 0

    def checkpoint(self, steps_done: int) -> None:
        """Write a consistent checkpoint after `steps_done` steps (all ranks, quiesced)."""
        assert self.config.checkpoint_dir is not None
        dist.barrier()  # every rank has drained its permits: no push in flight anywhere
        if self.server.dense is not None:
            final = self._pull_dense(steps_done)
            vector_to_parameters(torch.cat([c for c, _ in final]), self.model.parameters())
            # every chunk's optimizer state, in the model's layout (resumable in any mode)
            states: list[Any] = [None] * self.world_size if self.rank == 0 else []
            dist.gather_object(
                self.server.dense.optimizer_state_dict(), states if self.rank == 0 else None
            )
            if self.rank == 0:
                self.optimizer.load_state_dict(merge_chunk_states(states, self.params))
        samples = self.source.samples_done(steps_done)
        directory = Path(self.config.checkpoint_dir)
        name = f"step-{samples}"
        tmp = directory / f"{name}.tmp"
        # A delta builds on the last checkpoint, unless the chain is long enough (compaction)
        # or nothing was trained since (the new folder would replace its own base).
        last = self.last_checkpoint
        incremental = (
            last is not None and last[0] != name and last[1] + 1 < self.config.checkpoint_full_every
        )
        if self.rank == 0:
            for stale in directory.glob("step-*.tmp"):  # an earlier run's unfinished one
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        what = f"recsys checkpoint {tmp.name.removesuffix('.tmp')} (rank {self.rank})"
        latest = directory / "LATEST"
        previous = directory / latest.read_text().strip() if latest.is_file() else None
        kept = (
            f"the last checkpoint {previous.name} is intact (resume=true continues from it)"
            if previous is not None
            else "no earlier checkpoint was written"
        )
        clocks = self.shard.row_clocks(changed_only=incremental)
        deleted = self.shard.deleted_ids() if incremental else None
        # Bytes every rank's shard file takes (ids, rows, versions, last pushes, deletions),
        # plus the dense model (as large as the last one).
        row_bytes = 4 * max(self.shard.row_widths) + 24
        needed_here = torch.tensor(
            [sum(len(c[0]) for c in clocks) * row_bytes + 8 * sum(len(d) for d in deleted or [])]
        )
        dist.all_reduce(needed_here)
        dense_file = previous / "dense.pt" if previous is not None else None
        needed = int(needed_here) + (
            dense_file.stat().st_size if dense_file is not None and dense_file.is_file() else 0
        )
        # The unfinished folder goes if the disk fills; LATEST still names the last one.
        partial = [tmp / f"shard{self.rank}.npz.part", *([tmp] if self.rank == 0 else [])]
        with guard_write(
            directory, what=what, needed_bytes=needed, kept=kept, fix=_DISK_FULL_FIX,
            partial=partial,
        ):  # fmt: skip
            write_shard_file(self.shard, tmp / f"shard{self.rank}.npz", clocks, deleted)
            if self.rank == 0:
                torch.save(
                    {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                    tmp / "dense.pt",
                )
            dist.barrier()
            if self.rank == 0:
                commit_checkpoint(
                    directory,
                    tmp,
                    {
                        "run_id": self.run_id,
                        "samples_done": samples,
                        "total_samples": self.source.total_samples,
                        "world_size": self.world_size,
                        "num_virtual_shards": NUM_VIRTUAL_SHARDS,
                        "owners": default_owners(self.world_size).tolist(),
                        "compat": compat_fields(self.config),
                        "features": list(self.train.keys),
                        "dense_dim": self.train.dense_dim,
                        "raw_ids": self.train.raw_ids,
                        "config": config_to_dict(self.config),
                    },
                    base=directory / last[0] if incremental and last is not None else None,
                )
        # The files hold every change so far; no push runs before the barrier below.
        self.shard.clear_changes()
        dist.barrier()
        self.last_checkpoint = (name, last[1] + 1 if incremental and last is not None else 0)
        self.checkpoints_written += 1

    def _open_gate(self, step: int) -> None:
        with self.gate:
            self.gate_open_until = step
            self.gate.notify_all()

    def _wait_gate(self, step: int) -> None:
        with self.gate:
            if not self.gate.wait_for(
                lambda: self.gate_open_until > step, timeout=self.config.timeout_s
            ):
                raise PSUnavailableError(
                    f"step {step}: the checkpoint before it did not finish within "
                    f"{self.config.timeout_s} s"
                )

    def _maybe_fail(self, step: int) -> None:
        """Fault injection (tests): the last rank dies hard at `fail_at_step`, first attempt."""
        if (
            self.config.fail_at_step == step
            and self.rank == self.world_size - 1
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    # --- one step ------------------------------------------------------------------------
    def _forward_backward(self, result: LookupResult) -> None:
        batch = result.pending.batch
        start = time.perf_counter()
        logits = self.client.forward(self.model, result, torch.from_numpy(batch.dense))
        loss = nn.functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(batch.labels)
        )
        for param in self.params:
            param.grad = None
        torch.autograd.backward(loss)
        self.losses.append(float(loss))
        self.timings.compute_ms.append((time.perf_counter() - start) * 1e3)

    def _dense_step(self) -> None:
        start = time.perf_counter()
        _allreduce_grads(self.params, self.world_size)
        mid = time.perf_counter()
        self.optimizer.step()
        self.timings.allreduce_ms.append((mid - start) * 1e3)
        self.timings.dense_opt_ms.append((time.perf_counter() - mid) * 1e3)

    def _check_pulls(self, step: int, pulls: list[Handle]) -> list[tuple[Tensor, int]]:
        """Dense chunks pulled ahead, if they satisfy the stale-synchronous rule, else re-pull."""
        answers = [handle.wait() for handle in pulls]
        if min(a[2] for a in answers) >= step - self.config.staleness + 1:
            return [(a[0], a[1]) for a in answers]
        return self._pull_dense(step)

    def _pull_dense(self, step: int) -> list[tuple[Tensor, int]]:
        """Pull every dense chunk under the stale-synchronous rule (async mode)."""
        deadline = time.monotonic() + self.config.timeout_s
        needed = step - self.config.staleness + 1
        while True:
            handles = [self.transport.call(p, "dense_pull") for p in range(self.world_size)]
            answers = [handle.wait() for handle in handles]
            if min(a[2] for a in answers) >= needed:
                return [(a[0], a[1]) for a in answers]
            if time.monotonic() > deadline:
                raise PSUnavailableError(
                    f"step {step}: dense pushes of step {needed - 1} did not arrive within "
                    f"{self.config.timeout_s} s (a trainer is stuck or gone)"
                )
            time.sleep(0.0005)

    # --- loops ---------------------------------------------------------------------------
    def run_sync(self) -> None:
        for step in range(self.source.num_steps):
            self._maybe_fail(step)
            if self.is_boundary(step):
                self.checkpoint(step)  # every push before it is acknowledged already
            batch = self.source.batch(step)
            self.hints.before(step)
            start = time.perf_counter()
            result = self.client.wait(self.client.lookup(batch, batch.batch_id))
            self.timings.lookup_wait_ms.append((time.perf_counter() - start) * 1e3)
            self._forward_backward(result)
            self._dense_step()
            start = time.perf_counter()
            seq = step * self.world_size + self.rank  # shards apply a step's pushes by rank
            handles = self.client.push(result, batch.batch_id, self.world_size, seq=seq)
            for handle in handles:
                lag = int(handle.wait())
                if lag > self.bound:
                    raise StalenessBoundError(
                        f"sync step {step}: a row was {lag} updates stale, above {self.bound}"
                    )
            dist.barrier()
            self.timings.push_wait_ms.append((time.perf_counter() - start) * 1e3)
            self._mark(step)
        self.hints.finish()

    def run_ahead(self) -> None:
        """Hybrid and async: lookups (and dense pulls) run ahead under K permits."""
        k = self.config.staleness
        permits = Permits(k, self.bound, self.config.timeout_s)
        ready: queue.Queue[tuple[int, KJTBatch, PendingLookup, Any] | BaseException] = queue.Queue()
        stop = threading.Event()
        is_async = self.config.mode == "async"
        depth = prefetch_depth(self.config)
        slots = threading.Semaphore(depth)  # lookups started and not yet taken by compute

        def produce() -> None:
            try:
                for step in range(self.source.num_steps):
                    if self.is_boundary(step):
                        self._wait_gate(step)  # no read crosses a checkpoint
                    batch = self.source.batch(step)  # validated before taking a permit
                    start = time.perf_counter()
                    if not slots.acquire(timeout=self.config.timeout_s):
                        raise PSUnavailableError(
                            f"step {step}: compute took no batch within {self.config.timeout_s} s"
                        )
                    permits.acquire()
                    self.timings.permit_wait_ms.append((time.perf_counter() - start) * 1e3)
                    if stop.is_set():
                        return
                    self.hints.before(step)
                    pending = self.client.lookup(batch, batch.batch_id)
                    dense = (
                        [self.transport.call(p, "dense_pull") for p in range(self.world_size)]
                        if is_async
                        else None
                    )
                    ready.put((step, batch, pending, dense))
            except BaseException as exc:
                ready.put(exc)

        producer = threading.Thread(target=produce, name="recsys-run-ahead", daemon=True)
        producer.start()
        try:
            for expected in range(self.source.num_steps):
                self._maybe_fail(expected)
                if self.is_boundary(expected):
                    permits.drain()  # quiesce: every push of this rank is applied
                    self.checkpoint(expected)
                    self._open_gate(expected + 1)
                permits.check()
                start = time.perf_counter()
                try:
                    item = ready.get(timeout=self.config.timeout_s)
                except queue.Empty as exc:
                    raise PSUnavailableError(
                        f"no lookup finished within {self.config.timeout_s} s"
                    ) from exc
                if isinstance(item, BaseException):
                    raise item
                slots.release()  # the next lookup may start while this step computes
                step, batch, pending, pulls = item
                result = self.client.wait(pending)
                dense = None if pulls is None else self._check_pulls(step, pulls)
                self.timings.lookup_wait_ms.append((time.perf_counter() - start) * 1e3)
                if dense is not None:
                    vector_to_parameters(torch.cat([c for c, _ in dense]), self.model.parameters())
                self._forward_backward(result)
                start = time.perf_counter()
                if dense is None:
                    self._dense_step()
                    start = time.perf_counter()
                    handles = self.client.push(result, batch.batch_id, self.world_size)
                else:
                    grads = [
                        p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params
                    ]
                    flat = torch.cat([g.reshape(-1) for g in grads]) / self.world_size
                    handles = self.client.push(result, batch.batch_id, self.world_size)
                    sizes = [len(c) for c in self.chunks]
                    for p, (chunk, (_, version)) in enumerate(
                        zip(torch.split(flat, sizes), dense, strict=True)
                    ):
                        handles.append(
                            self.transport.call(
                                p, "dense_push", chunk.contiguous(), version, self.rank
                            )
                        )
                permits.release_when_acked(handles)
                self.timings.push_enqueue_ms.append((time.perf_counter() - start) * 1e3)
                self._mark(step)
            permits.drain()
            self._mark(self.source.num_steps)
            self.hints.finish()
        finally:
            stop.set()
            producer.join(timeout=self.config.timeout_s)
        if is_async:  # the final dense model, for evaluation
            final = self._pull_dense(self.source.num_steps)
            vector_to_parameters(torch.cat([c for c, _ in final]), self.model.parameters())
        permits.check()
        self.max_lag_acked = permits.max_lag

    def _mark(self, step: int) -> None:
        """Note the end of `step` (throughput counts the steps after the warm-up ones)."""
        if step == self.config.warmup_steps - 1 and step < self.source.num_steps - 1:
            self.t_warm = time.perf_counter()
            self.cpu_warm = time.process_time()
            self.warm_step = step
        self.t_end = time.perf_counter()
        self.cpu_end = time.process_time()
        self.step_ends.append((step, self.t_end))

    # --- evaluation ----------------------------------------------------------------------
    def evaluate(self, batch_size: int = 2048) -> dict[str, float]:
        self.model.eval()
        scores = []
        with torch.no_grad():
            for start in range(0, self.test.num_samples, batch_size):
                rows = np.arange(
                    start, min(start + batch_size, self.test.num_samples), dtype=np.int64
                )
                batch = self.test.batch(rows, batch_id=-1)
                result = self.client.wait(self.client.lookup(batch))
                logits = self.client.forward(self.model, result, torch.from_numpy(batch.dense))
                scores.append(torch.sigmoid(logits).numpy())
        probabilities = np.concatenate(scores)
        self.model.train()
        return {
            "test_auc": roc_auc(self.test.labels, probabilities),
            "test_logloss": log_loss(self.test.labels, probabilities),
        }

    def alpha_max(self) -> float:
        """Largest share of training samples that touch one row (Persia's sparsity alpha)."""
        return _alpha_max(self.config.data)

    def rank_report(self) -> dict[str, Any]:
        steps = self.source.num_steps
        timed = steps - 1 - self.warm_step
        elapsed = max(self.t_end - self.t_warm, 1e-9)
        ends = [t for step, t in self.step_ends if step >= self.warm_step]
        step_ms = np.diff(ends) * 1e3  # steps after the warm-up (the last one ends at the drain)
        step_samples = self.config.batch_size * self.world_size
        mean_samples_per_s = timed * step_samples / elapsed
        quarter = max(1, len(self.losses) // 5)
        stats = self.shard.stats()
        if self.server.dense is not None:
            stats["dense_lag_hist"] = self.server.dense.lags.hist.tolist()
            stats["dense_lag_max"] = self.server.dense.lags.maximum
        w = self.warmup_slice()
        return {
            "rank": self.rank,
            "steps": steps,
            "samples_per_s": (
                step_samples * 1e3 / float(np.median(step_ms))
                if len(step_ms)
                else mean_samples_per_s
            ),
            "samples_per_s_mean": mean_samples_per_s,
            "step_ms": float(np.median(step_ms)) if len(step_ms) else elapsed / max(timed, 1) * 1e3,
            "cpu_ms_per_step": (self.cpu_end - self.cpu_warm) / max(timed, 1) * 1e3,
            "train_loss_first": float(np.mean(self.losses[:quarter])) if self.losses else None,
            "train_loss_last": float(np.mean(self.losses[-quarter:])) if self.losses else None,
            "samples_done": self.source.samples_done(steps),
            "total_samples": self.source.total_samples,
            "resumed_from_samples": self.resumed_from,
            "checkpoints_written": self.checkpoints_written,
            "dense_params_sha256": _params_sha256(self.model),
            "lookup_wait_ms": _median(self.timings.lookup_wait_ms[w:]),
            "permit_wait_ms": _median(self.timings.permit_wait_ms[w:]),
            "compute_ms": _median(self.timings.compute_ms[w:]),
            "allreduce_ms": _median(self.timings.allreduce_ms[w:]),
            "dense_opt_ms": _median(self.timings.dense_opt_ms[w:]),
            "push_enqueue_ms": _median(self.timings.push_enqueue_ms[w:]),
            "push_wait_ms": _median(self.timings.push_wait_ms[w:]),
            "shard": stats,
        }

    def warmup_slice(self) -> int:
        return min(self.config.warmup_steps, max(len(self.timings.compute_ms) - 1, 0))


def _summarise(
    config: RecsysTrainConfig, reports: list[dict[str, Any]], metrics: dict[str, float]
) -> dict[str, Any]:
    hist = np.sum([r["shard"]["lag_hist"] for r in reports], axis=0)
    total = int(hist.sum())
    lags = np.arange(len(hist))
    mean = float((hist * lags).sum() / total) if total else 0.0
    cumulative = np.cumsum(hist)
    p99 = int(np.searchsorted(cumulative, 0.99 * total)) if total else 0
    max_seen = max(int(r["shard"]["lag_max"]) for r in reports)
    bound = staleness_bound(config.mode, config.staleness, config.nproc)
    document: dict[str, Any] = {
        "mode": config.mode,
        "dataset": config.data.dataset,
        "staleness": config.staleness,
        "rtt_ms": config.rtt_ms,
        "seed": config.seed,
        "world_size": config.nproc,
        **metrics,
        "samples_per_s": float(np.median([r["samples_per_s"] for r in reports])),
        "samples_per_s_mean": float(np.median([r["samples_per_s_mean"] for r in reports])),
        "max_staleness_seen": max_seen,
        "mean_staleness": mean,
        "staleness_p99": p99,
        "staleness_bound": bound,
        "staleness_hist": hist.tolist(),
        "share_lag_above_k_times_w": float(
            hist[config.staleness * config.nproc + 1 :].sum() / total
        )
        if total
        else 0.0,
        "train_loss_first": _mean_or_none([r["train_loss_first"] for r in reports]),
        "train_loss_last": _mean_or_none([r["train_loss_last"] for r in reports]),
        "steps": reports[0]["steps"],
        "samples_done": reports[0]["samples_done"],
        "total_samples": reports[0]["total_samples"],
        "resumed_from_samples": reports[0]["resumed_from_samples"],
        "checkpoints_written": reports[0]["checkpoints_written"],
        # the PS shards' stores (all ranks): cache hits, disk reads, waits for disk
        "ps_hit_ratio": float(np.mean([r["shard"]["store"]["hit_ratio"] for r in reports])),
        "ps_bytes_read_per_step": sum(r["shard"]["store"]["bytes_read"] for r in reports)
        / max(1, reports[0]["steps"]),
        "ps_stall_s": sum(r["shard"]["store"]["stall_s"] for r in reports),
        "rejected_updates": sum(r["shard"]["rejected_updates"] for r in reports),
        "expired_rows": sum(r["shard"]["expired_rows"] for r in reports),
        "evicted_rows": sum(r["shard"]["evicted_rows"] for r in reports),
        "live_rows": sum(r["shard"]["live_rows"] for r in reports),
    }
    for key in (
        "step_ms",
        "cpu_ms_per_step",
        "lookup_wait_ms",
        "permit_wait_ms",
        "compute_ms",
        "allreduce_ms",
        "dense_opt_ms",
        "push_enqueue_ms",
        "push_wait_ms",
    ):
        document[key] = float(np.median([r[key] for r in reports]))
    if "dense_lag_max" in reports[0]["shard"]:
        document["dense_max_staleness_seen"] = max(
            int(r["shard"]["dense_lag_max"]) for r in reports
        )
    document["ranks"] = reports
    document["config"] = config_to_dict(config)
    if max_seen > bound:
        raise StalenessBoundError(
            f"measured staleness {max_seen} exceeds the {config.mode} bound {bound}"
        )
    if document.get("dense_max_staleness_seen", 0) > bound:
        raise StalenessBoundError(
            f"measured dense staleness {document['dense_max_staleness_seen']} exceeds the "
            f"async bound {bound}"
        )
    return document


def _check_world(config: RecsysTrainConfig, world_size: int) -> None:
    if world_size != config.nproc:
        raise RecsysError(
            f"torchrun started world_size={world_size} processes but the config says nproc="
            f"{config.nproc}; launch with --nproc-per-node {config.nproc}"
        )


def _train_one(
    config: RecsysTrainConfig, out_dir: Path, transport: RpcTransport
) -> dict[str, Any] | None:
    """One training run on an initialised group and transport (every rank calls it)."""
    rank, world_size = transport.rank, transport.world_size
    _check_world(config, world_size)
    fingerprint = hashlib.sha256(
        json.dumps(config_to_dict(config), sort_keys=True).encode()
    ).hexdigest()
    seen: list[Any] = [None] * world_size
    dist.all_gather_object(seen, (fingerprint, world_size))
    if len(set(seen)) != 1:
        raise RecsysError(
            f"trainers disagree on the config or world size: {seen}; start every process "
            "with the same config file"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = _Trainer(config, out_dir, rank, world_size, transport)
    try:
        flat = parameters_to_vector(trainer.model.parameters()).detach()
        dist.broadcast(flat, src=0)
        vector_to_parameters(flat, trainer.model.parameters())
        transport.serve(trainer.server)
        dist.barrier()  # every shard is served before the first lookup
        if config.mode == "sync":
            trainer.run_sync()
        else:
            trainer.run_ahead()
        dist.barrier()  # every push of every rank is applied
        if config.checkpoint_dir is not None:  # also after 0 steps: rewrites it for this
            trainer.checkpoint(trainer.source.num_steps)  # nproc and the current format
        report = trainer.rank_report()
        reports: list[Any] = [None] * world_size
        dist.all_gather_object(reports, report)
        result = None
        if rank == 0:
            metrics = trainer.evaluate()
            metrics["alpha_max"] = trainer.alpha_max()
            result = _summarise(config, reports, metrics)
            tmp = out_dir / "result.json.tmp"
            tmp.write_text(json.dumps(result, indent=1) + "\n")
            os.replace(tmp, out_dir / "result.json")
        dist.barrier()  # rank 0's evaluation is done: no call reaches the shards any more
        return result
    finally:
        transport.serve(None)
        trainer.shard.close()
        shutil.rmtree(out_dir / "ps" / f"rank{rank}", ignore_errors=True)


def train_rank(runs: list[tuple[RecsysTrainConfig, Path]]) -> list[dict[str, Any] | None]:
    """Run this process's part of one or more training runs (inside torchrun).

    The process group and the RPC transport are started once and reused by every run (each
    run gets fresh shards, model and data order). Rank 0 writes each run's
    `OUT_DIR/result.json`: metrics, staleness histogram and per-rank reports.

    Args:
        runs: (config, out_dir) pairs, the same list on every rank.

    Returns:
        Per run, rank 0's result (None on other ranks).

    Raises:
        RecsysError: If the world size differs from `config.nproc` or between processes,
            or a staleness bound is broken.
        PSUnavailableError: If a shard, permit or collective times out.
        BadBatchError: If a batch fails validation.
    """
    if not runs:
        raise ValueError("runs is empty; give at least one (config, out_dir)")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    first = runs[0][0]
    _check_world(first, world_size)
    torch.set_num_threads(1)
    timeout_s = max(config.timeout_s for config, _ in runs)
    init_group(rank, world_size, timeout_s)
    transport = None
    try:
        transport = RpcTransport(rank, world_size, timeout_s)
        results = [_train_one(config, out_dir, transport) for config, out_dir in runs]
        transport.close()
        transport = None
        return results
    finally:
        if transport is not None:
            transport.serve(None)
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    """Entry point of each torchrun worker: `trainer.py JOB_JSON`.

    JOB_JSON holds {"runs": [{"config": {...}, "out_dir": "..."}, ...]}.
    """
    warnings.filterwarnings("ignore", message=".*as a ProcessGroup.*")
    job = json.loads(Path(argv[0]).read_text())
    runs = [
        (config_from_dict(RecsysTrainConfig, run["config"], source=argv[0]), Path(run["out_dir"]))
        for run in job["runs"]
    ]
    try:
        train_rank(runs)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
