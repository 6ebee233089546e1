"""Drop-in torch modules over an `EmbeddingStore`: `StoreEmbedding`, `StoreEmbeddingBag`.

The table is never a `torch.nn.Parameter`. Each training forward reads the unique rows its
ids need (`EmbeddingStore.get`, which opens one read per row) into a leaf tensor on the
input's device, and `StoreSparseOptimizer.step()` sends that leaf's gradient to the store's
fused optimizer (`apply_gradients`), which writes the rows back and closes the reads. In
evaluation (`module.eval()` or `torch.no_grad()`) rows are read with `peek`, which opens
nothing. The row `padding_idx` is never read or written: it reads as zeros, as in a freshly
built `torch.nn.Embedding`.

Devices: ids go to the CPU to read the store; the rows are staged through pinned host
memory (only where CUDA is available) and copied to the input's device with
`non_blocking=True`; gradients come back to the CPU for `apply_gradients`.

`state_dict()` holds a reference to a store checkpoint, not the rows (the table may be
larger than RAM); see `StoreEmbedding.get_extra_state`.

References:
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (the Get/Put training loop over a disk-backed table,
    section on the embedding-model integration).

Shape legend: B bags, N ids in a flat input, U unique ids read, D embedding_dim, S any shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal.config import config_to_dict
from frugal.store.errors import NonFiniteError
from frugal.store.store import EmbeddingStore

__all__ = ["StoreEmbedding", "StoreEmbeddingBag", "StoreSparseOptimizer"]

STATE_FORMAT = "frugal.store.nn"
STATE_VERSION = 1
_Pending = tuple[int, npt.NDArray[np.int64], Tensor]  # (step, unique ids, leaf rows (U, D))


def _check_ids(ids: Tensor, what: str) -> None:
    if not isinstance(ids, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of int64 ids, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(
            f"{what} must be an integer tensor, got {ids.dtype}; pass torch.long ids "
            f"({what}.long() if they are whole numbers)"
        )


def _stage(rows: npt.NDArray[np.float32], device: torch.device) -> Tensor:
    """Copy host rows to `device`: through pinned memory and non-blocking where CUDA is."""
    host = torch.from_numpy(rows)
    if device.type == "cpu":
        return host
    if device.type == "cuda" and torch.cuda.is_available():
        # Pinned memory makes the copy asynchronous; torch's caching host allocator keeps the
        # pinned block alive until the copy has run, so `host` may be dropped at once.
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


class _StoreModule(nn.Module):
    """The read, the pending updates and the `state_dict()` of the store modules."""

    def __init__(self, store: EmbeddingStore, padding_idx: int | None) -> None:
        super().__init__()
        if not isinstance(store, EmbeddingStore):
            raise TypeError(f"store must be an EmbeddingStore, got {type(store).__name__}")
        self.store = store
        self.padding_idx = self._normalize_padding_idx(padding_idx)
        self.step = 0
        """The step of the next training forward's reads; `StoreSparseOptimizer.step()`
        advances it by one (set it to follow your own counter, e.g. `Batch.step`)."""
        self.pending: list[_Pending] = []
        """Training forwards whose gradients `StoreSparseOptimizer.step()` has not sent yet."""

    def __getstate__(self) -> dict[str, Any]:
        """Refuse to pickle (`torch.save(model)`, `copy.deepcopy`).

        The module holds an open store (files, threads, a lock) whose rows may outgrow RAM.

        Raises:
            TypeError: Always, naming what to save instead.
        """
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled (torch.save(model), copy.deepcopy): "
            f"it holds the open store at {self.store.directory}; save model.state_dict() "
            "instead (it checkpoints the store and references it) and rebuild the module "
            "over EmbeddingStore.open(...) to load it"
        )

    def _normalize_padding_idx(self, padding_idx: int | None) -> int | None:
        if padding_idx is None:
            return None
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)):
            raise TypeError(f"padding_idx={padding_idx!r} must be an int or None")
        num_rows = self.store.num_rows
        if self.store.key_space == "hashed":
            if padding_idx < 0:
                raise ValueError(
                    f"padding_idx={padding_idx} must be a key >= 0 in a hashed key space"
                )
            return int(padding_idx)
        if not -num_rows <= padding_idx < num_rows:
            raise ValueError(
                f"padding_idx={padding_idx} must be in [-num_embeddings, num_embeddings) = "
                f"[{-num_rows}, {num_rows}); pick a row of the store, or None"
            )
        return int(padding_idx) % num_rows

    @property
    def num_embeddings(self) -> int:
        """N, the store's rows (its key capacity in a hashed key space)."""
        return self.store.num_rows

    @property
    def embedding_dim(self) -> int:
        """D, the length of each row's vector."""
        return self.store.spec.embedding_dim

    def _check_trainable_read(self, ids_U: npt.NDArray[np.int64]) -> None:
        """Refuse, before any read, a training forward that no step could close."""
        if self.store.spec.optimizer.kind == "none":
            raise ValueError(
                "this store's rows have no optimizer (kind='none'), so no step() can update "
                "what a training forward reads; look rows up under torch.no_grad() or in "
                "eval(), or create the store with an optimizer"
            )
        same_step = [ids for step, ids, _ in self.pending if step == self.step]
        if self.store.config.staleness_bound == 0 and same_step:
            again = np.intersect1d(np.concatenate(same_step), ids_U)
            if len(again):
                raise ValueError(
                    f"{len(again)} ids (e.g. {int(again[0])}) were already read by a forward "
                    f"of step {self.step}, and the store's staleness_bound=0 allows one read "
                    "per step; look up all of a step's ids in one call (e.g. "
                    "torch.cat([heads, tails])), or call step() in between"
                )

    def _read(self, ids: Tensor) -> tuple[Tensor, Tensor, int | None]:
        """Read the unique rows of `ids`.

        Returns `(weight_RD, index_S, padding_row)`: the rows (plus one zero row at index
        `padding_row` when `ids` hold `padding_idx`) on the device of `ids`, and for each id
        its row in `weight_RD`, shaped like `ids`.
        """
        device = ids.device
        ids_cpu = ids.detach().to("cpu", torch.int64)
        unique_U, index_S = torch.unique(ids_cpu, return_inverse=True)  # sorted ascending
        padding_row = None
        if self.padding_idx is not None:
            hit = torch.nonzero(unique_U == self.padding_idx)
            if hit.numel():  # drop it from the read; its ids point past the last row read
                p = int(hit[0, 0])
                unique_U = torch.cat([unique_U[:p], unique_U[p + 1 :]])
                padding_row = len(unique_U)
                index_S = torch.where(
                    index_S == p, padding_row, index_S - (index_S > p).to(torch.int64)
                )
        ids_U = unique_U.numpy()
        reading = self.training and torch.is_grad_enabled()
        if reading:
            self._check_trainable_read(ids_U)
        if reading:  # opens reads that StoreSparseOptimizer.step() closes
            rows_UD = self.store.get(ids_U, step=self.step, cols="emb")
        else:  # evaluation: no update follows, so read without opening reads
            rows_UD = self.store.peek(ids_U, cols="emb")
        weight_UD = _stage(rows_UD, device).requires_grad_(reading)
        if reading and len(ids_U):
            self.pending.append((self.step, ids_U, weight_UD))
        weight_RD = weight_UD
        if padding_row is not None:
            zero_1D = torch.zeros(1, self.embedding_dim, dtype=weight_UD.dtype, device=device)
            weight_RD = torch.cat([weight_UD, zero_1D])
        if device.type == "cuda" and torch.cuda.is_available():
            index_S = index_S.pin_memory()
        return weight_RD, index_S.to(device, non_blocking=True), padding_row

    def get_extra_state(self) -> dict[str, Any]:
        """Checkpoint the store and return a reference to that checkpoint (for `state_dict`).

        Unlike `torch.nn.Embedding`, whose `state_dict()` copies the weight, the table here
        may be larger than RAM, so the state is a small dict naming the store checkpoint:
        `directory`, `epoch`, `rows_epoch` (see `EmbeddingStore.rows_epoch`), `step`, `meta`,
        the table's `num_rows`, `key_space`, `seed`, `spec`, and this module's
        `module_step`. It holds only builtins, so it round-trips
        through `torch.save` / `torch.load(weights_only=True)`. Keep the store folder with the
        torch checkpoint: the rows are there.

        Returns:
            The reference, stored under `<prefix>_extra_state` in `state_dict()`.

        Raises:
            RuntimeError: If training forwards are pending (call `StoreSparseOptimizer.step()`
                first: the checkpoint waits for every open read to close).
            StoreError: If this thread holds other open reads of the store (another module
                over it with pending forwards).
            StalenessTimeoutError: If reads opened by other threads stay open for the store's
                `timeout_s`.
        """
        if self.pending:
            raise RuntimeError(
                f"{len(self.pending)} training forwards of {type(self).__name__} are pending; "
                "call loss.backward() and StoreSparseOptimizer.step() before state_dict() "
                "(a checkpoint waits for their reads to close)"
            )
        store = self.store
        epoch = store.checkpoint(meta=store.meta)  # keeps the user's meta (loader cursor...)
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "directory": str(Path(store.directory).resolve()),
            "epoch": epoch,
            "rows_epoch": store.rows_epoch,
            "store_id": store.store_id,
            "step": store.step,
            "meta": store.meta,
            "num_rows": store.num_rows,
            "key_space": store.key_space,
            "seed": store.seed,
            "spec": config_to_dict(store.spec),
            "module_step": self.step,
        }

    def set_extra_state(self, state: Any) -> None:
        """Return the store to the checkpoint `state` names (for `load_state_dict`).

        The store's last checkpoint must hold the rows of that checkpoint (the same
        `rows_epoch`): frugal keeps only a store's latest checkpoint, so once a later
        checkpoint has saved changed rows, the earlier rows are gone. Checkpoints that save
        no change (a `close()` right after `state_dict()`, a second module over the same
        store) keep the `rows_epoch`, so such a state still loads. Changes since the
        checkpoint (further training) are discarded with `EmbeddingStore.rollback()`, in
        place, and pending forwards are dropped; the module's `step` is restored. The store
        folder may have been moved or copied: the reference is checked against the table's
        shape, spec, seed and `rows_epoch`, not against the folder's path.

        Args:
            state: A dict from `get_extra_state`.

        Raises:
            TypeError: If `state` is not such a dict.
            ValueError: If the store's table (`num_rows`, `key_space`, `seed`, `spec`) or the
                rows of its last checkpoint (`rows_epoch`) differ from those `state` names.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise TypeError(
                f"the _extra_state of {type(self).__name__} must be a dict from its "
                f"state_dict(), got {type(state).__name__}"
            )
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"state version {state.get('version')!r}, but this frugal reads version "
                f"{STATE_VERSION}; load it with the frugal that saved it"
            )
        store = self.store
        ours = {
            "num_rows": store.num_rows,
            "key_space": store.key_space,
            "seed": store.seed,
            "spec": config_to_dict(store.spec),
        }
        differing = [
            f"{k}={state.get(k)!r} (store: {v!r})" for k, v in ours.items() if state.get(k) != v
        ]
        if differing:
            raise ValueError(
                f"the state_dict names a different table than {store.directory} holds: "
                f"{', '.join(differing)}; load it into a module over the store it came from "
                f"({state.get('directory')})"
            )
        theirs = state.get("store_id", "")
        if theirs and store.store_id and theirs != store.store_id:
            raise ValueError(
                f"the state_dict comes from store {theirs} ({state.get('directory')}), but "
                f"{store.directory} is store {store.store_id}, a different table of the same "
                "shape; load it into a module over the store it came from (a moved or copied "
                "folder keeps its id)"
            )
        if state.get("rows_epoch") != store.rows_epoch:
            raise ValueError(
                f"the state_dict names the rows of checkpoint rows_epoch="
                f"{state.get('rows_epoch')} (step={state.get('step')}) of "
                f"{state.get('directory')}, but the last checkpoint of {store.directory} holds "
                f"those of rows_epoch={store.rows_epoch} (epoch={store.epoch}, "
                f"step={store.step}); a store keeps only its latest checkpoint, so load the "
                "state_dict saved last (or keep a copy of the store folder with each torch "
                "checkpoint)"
            )
        store.rollback()
        self.pending = []
        self.step = int(state["module_step"])


class StoreEmbedding(_StoreModule):
    """`torch.nn.Embedding` whose weight lives in an `EmbeddingStore`.

    Reads rows by id, unpooled: KGE entity embeddings, GNN node embeddings, sequence
    features. With the store's staleness bound 0, call it once per training step with all of
    the step's ids (e.g. heads, tails and negatives concatenated): a second training forward
    over the same row before `StoreSparseOptimizer.step()` would wait for that row's update.

    Args:
        store: The store holding the table (rows carry the optimizer state).
        padding_idx: An id whose output is zeros and which gets no gradient; its row is
            never read or written (as in a freshly built `torch.nn.Embedding`). Negative
            values count from `num_embeddings` (dense key space only).

    Raises:
        TypeError: If `store` is not an `EmbeddingStore` or `padding_idx` not an int.
        ValueError: If `padding_idx` is outside [-num_embeddings, num_embeddings).
    """

    def __init__(self, store: EmbeddingStore, padding_idx: int | None = None) -> None:
        super().__init__(store, padding_idx)

    def extra_repr(self) -> str:
        """Shown by `print(module)`."""
        text = f"{self.num_embeddings}, {self.embedding_dim}, store={self.store.directory}"
        return text + ("" if self.padding_idx is None else f", padding_idx={self.padding_idx}")

    def forward(self, input: Tensor) -> Tensor:
        """Look up each id's row.

        Args:
            input: Integer ids of any shape, on any device.

        Returns:
            float32 rows on the device of `input`.

        Raises:
            TypeError: If `input` is not an integer tensor.
            IndexError: If an id is outside [0, num_embeddings) (the store's error).
            StalenessTimeoutError: If a row stays beyond the staleness bound (training).

        Shapes:
            input: S -> S + (D,).
        """
        _check_ids(input, "input")
        weight_RD, index_S, padding_row = self._read(input)
        return F.embedding(index_S, weight_RD, padding_idx=padding_row)


class StoreEmbeddingBag(_StoreModule):
    """`torch.nn.EmbeddingBag` whose weight lives in an `EmbeddingStore`.

    Same semantics as `torch.nn.EmbeddingBag`: bags are the rows of a 2-D input, or spans of a
    flat input that start at `offsets`; an empty bag pools to zeros; ids equal to
    `padding_idx` are left out of the pooling (and of a mean's count) and get no gradient.
    Invalid input raises `TypeError`/`ValueError` before any row is read (torch raises
    `RuntimeError` or `NotImplementedError` for some of these).

    Args:
        store: The store holding the table (rows carry the optimizer state).
        mode: "sum", "mean" or "max" pooling per bag.
        padding_idx: An id left out of every bag; its row is never read or written.
            Negative values count from `num_embeddings` (dense key space only).
        include_last_offset: If True, `offsets` has B + 1 entries, the last one the end of
            the last bag (the CSR layout).

    Raises:
        TypeError: If `store` is not an `EmbeddingStore` or `padding_idx` not an int.
        ValueError: If `mode` is not "sum", "mean" or "max", or `padding_idx` is outside
            [-num_embeddings, num_embeddings).
    """

    def __init__(
        self,
        store: EmbeddingStore,
        mode: Literal["sum", "mean", "max"] = "sum",
        padding_idx: int | None = None,
        include_last_offset: bool = False,
    ) -> None:
        super().__init__(store, padding_idx)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode={mode!r}; choose 'sum', 'mean' or 'max'")
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def extra_repr(self) -> str:
        """Shown by `print(module)`."""
        text = (
            f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, "
            f"store={self.store.directory}"
        )
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        return text + (", include_last_offset=True" if self.include_last_offset else "")

    def forward(
        self,
        input: Tensor,
        offsets: Tensor | None = None,
        per_sample_weights: Tensor | None = None,
    ) -> Tensor:
        """Pool the rows of each bag.

        Args:
            input: Integer ids: (B, F) for B bags of F ids, or flat (N,) with `offsets`.
            offsets: Integer start of each bag in a flat `input`, non-decreasing from 0 and
                at most N, (B,) (or (B + 1,) with `include_last_offset`); None for 2-D input.
            per_sample_weights: float32 weight of each id, shaped like `input`, on its
                device; only with mode "sum".

        Returns:
            Pooled float32 embeddings on the device of `input`.

        Raises:
            TypeError: If `input` or `offsets` is not an integer tensor, or
                `per_sample_weights` is not float32.
            ValueError: If `input` is not 1-D or 2-D, `offsets` is given with 2-D input,
                missing with 1-D input, or invalid (not 1-D, not starting at 0, decreasing,
                past the end of `input`), or `per_sample_weights` is given with another mode
                than "sum", shaped unlike `input` or on another device.
            IndexError: If an id is outside [0, num_embeddings) (the store's error).
            StalenessTimeoutError: If a row stays beyond the staleness bound (training).

        Shapes:
            input: (B, F) or (N,); offsets: (B,) or (B + 1,); per_sample_weights: like
            input -> (B, D).
        """
        _check_ids(input, "input")
        self._check_bags(input, offsets, per_sample_weights)
        weight_RD, index_S, padding_row = self._read(input)
        if offsets is not None:
            offsets = offsets.to(index_S.device, torch.int64)
        return F.embedding_bag(
            index_S,
            weight_RD,
            offsets,
            mode=self.mode,
            per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset,
            padding_idx=padding_row,
        )

    def _check_bags(
        self, input: Tensor, offsets: Tensor | None, per_sample_weights: Tensor | None
    ) -> None:
        """Refuse what `F.embedding_bag` would refuse, before any read is opened."""
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ValueError(
                    f"per_sample_weights need mode='sum', but this bag pools with "
                    f"mode={self.mode!r}; build StoreEmbeddingBag(store, mode='sum') or drop "
                    "the weights"
                )
            if not isinstance(per_sample_weights, Tensor) or per_sample_weights.dtype != (
                torch.float32
            ):
                kind = getattr(per_sample_weights, "dtype", type(per_sample_weights).__name__)
                raise TypeError(
                    f"per_sample_weights must be a float32 tensor, got {kind}; convert with "
                    ".float()"
                )
            if per_sample_weights.device != input.device:
                raise ValueError(
                    f"per_sample_weights are on {per_sample_weights.device} but input is on "
                    f"{input.device}; move them with .to(input.device)"
                )
            if per_sample_weights.shape != input.shape:
                raise ValueError(
                    f"per_sample_weights of shape {tuple(per_sample_weights.shape)} must have "
                    f"the shape of input, {tuple(input.shape)}: one weight per id"
                )
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError(
                    f"input of shape {tuple(input.shape)} is 2-D, one bag per row, so offsets "
                    "must be None; flatten input to 1-D to use offsets"
                )
            return
        if input.dim() != 1:
            raise ValueError(
                f"input must be 1-D (with offsets) or 2-D (one bag per row), got shape "
                f"{tuple(input.shape)}"
            )
        if offsets is None:
            raise ValueError(
                f"input of shape {tuple(input.shape)} is flat, so pass offsets, the start of "
                "each bag (e.g. torch.tensor([0]) for one bag), or reshape input to 2-D"
            )
        _check_ids(offsets, "offsets")
        if offsets.dim() != 1:
            raise ValueError(f"offsets must be 1-D, got shape {tuple(offsets.shape)}")
        starts = offsets.detach().to("cpu", torch.int64)
        if self.include_last_offset and len(starts) == 0:
            raise ValueError(
                "offsets is empty but include_last_offset=True needs the end of the last bag; "
                "pass at least torch.tensor([0])"
            )
        if len(starts) == 0:
            return
        if int(starts[0]) != 0:
            raise ValueError(
                f"offsets[0]={int(starts[0])}, but the first bag must start at 0; "
                "prepend 0 to offsets"
            )
        steps = starts[1:] - starts[:-1]
        if bool((steps < 0).any()):
            at = int(torch.nonzero(steps < 0)[0, 0]) + 1
            raise ValueError(
                f"offsets decrease at position {at} ({int(starts[at - 1])} then "
                f"{int(starts[at])}); each bag must start where the previous one ends or later"
            )
        if int(starts[-1]) > len(input):
            raise ValueError(
                f"offsets[-1]={int(starts[-1])} is past the end of input (length {len(input)}); "
                "offsets index into the flat input"
            )


class StoreSparseOptimizer:
    """Apply each store's fused optimizer to the rows the forwards of its modules read.

    A training step is: forward(s), `loss.backward()`, `step()`. `zero_grad()` is not needed
    (every forward makes fresh leaf tensors) but is there for loops that call it. Until
    `step()` runs, a forward's rows stay read (they count against the store's staleness
    bound). The optimizer's hyperparameters live in each store's `RowSpec.optimizer`.

    Args:
        modules: A `StoreEmbedding` or `StoreEmbeddingBag`, a list of them, or any module
            (e.g. the whole model) whose submodules include them.

    Raises:
        TypeError: If `modules` holds something that is not a `torch.nn.Module`.
        ValueError: If no `StoreEmbedding` or `StoreEmbeddingBag` is found.
    """

    def __init__(self, modules: nn.Module | Iterable[nn.Module]) -> None:
        given = [modules] if isinstance(modules, nn.Module) else list(modules)
        found: dict[int, _StoreModule] = {}
        for module in given:
            if not isinstance(module, nn.Module):
                raise TypeError(
                    f"StoreSparseOptimizer takes torch modules, got {type(module).__name__}"
                )
            for sub in module.modules():
                if isinstance(sub, _StoreModule):
                    found.setdefault(id(sub), sub)
        if not found:
            raise ValueError(
                f"no StoreEmbedding or StoreEmbeddingBag among {len(given)} modules given; "
                "pass the store modules (or a model holding them)"
            )
        self.modules: list[_StoreModule] = list(found.values())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of pending forwards' rows (as `torch.optim.Optimizer` does)."""
        for module in self.modules:
            for _, _, weight in module.pending:
                if set_to_none:
                    weight.grad = None
                elif weight.grad is not None:
                    weight.grad.zero_()

    def step(self) -> None:
        """Send each pending forward's gradient to `apply_gradients`, oldest first.

        Every gradient is checked (present, finite) before any is applied, so a refused step
        changes no row and leaves the forwards pending (`discard()` drops them). Each
        module's `step` then advances by one.

        Raises:
            RuntimeError: If a pending forward has no gradient (backward was not called).
            NonFiniteError: If a gradient holds NaN or inf.
        """
        grads: list[list[npt.NDArray[np.float32]]] = []
        for module in self.modules:  # check all before applying any: nothing half-done
            module_grads = []
            for step, _, weight in module.pending:
                if weight.grad is None:
                    raise RuntimeError(
                        f"the forward of step {step} of {type(module).__name__} has no "
                        "gradient; call loss.backward() first (its rows stay read until a "
                        "step() with gradients)"
                    )
                grad = weight.grad.detach().to("cpu", torch.float32).numpy()
                if not np.isfinite(grad).all():
                    raise NonFiniteError(
                        f"the gradient of step {step} of {type(module).__name__} holds NaN or "
                        "inf; nothing was applied (lower the learning rate or clip gradients)"
                    )
                module_grads.append(np.ascontiguousarray(grad))
            grads.append(module_grads)
        for module, module_grads in zip(self.modules, grads, strict=True):
            # a forward leaves `pending` only once its update went through, so a store error
            # midway keeps the rest pending (for a retry or `discard()`)
            for grad in module_grads:
                step, ids, _ = module.pending[0]
                module.store.apply_gradients(ids, grad, step=step)
                module.pending.pop(0)
            module.step += 1

    def state_dict(self) -> dict[str, Any]:
        """What `torch.optim.Optimizer.state_dict` returns, for checkpoint loops that save it.

        The optimizer's state (Adam moments, Adagrad sums) lives in the store's rows and its
        hyperparameters in `RowSpec.optimizer`, so both are saved by the modules'
        `state_dict()`; this holds only the number of store modules, checked on load.

        Raises:
            RuntimeError: If forwards are pending (call `step()` or `discard()` first).
        """
        self._require_no_pending("state_dict()")
        return {"kind": "frugal.StoreSparseOptimizer", "num_store_modules": len(self.modules)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Accept what `state_dict()` returned (the rows come back with the modules').

        Raises:
            ValueError: If `state_dict` is not one of this class's, or was saved for another
                number of store modules.
            RuntimeError: If forwards are pending (call `step()` or `discard()` first).
        """
        kind = state_dict.get("kind") if isinstance(state_dict, dict) else None
        if kind != "frugal.StoreSparseOptimizer":
            keys = sorted(map(str, state_dict))[:5] if isinstance(state_dict, dict) else []
            raise ValueError(
                "load_state_dict takes what StoreSparseOptimizer.state_dict() returned; got "
                f"a {type(state_dict).__name__} with keys {keys}"
            )
        if state_dict.get("num_store_modules") != len(self.modules):
            raise ValueError(
                f"the state was saved for {state_dict.get('num_store_modules')} store modules "
                f"but this optimizer has {len(self.modules)}; build it over the same modules"
            )
        self._require_no_pending("load_state_dict()")

    def _require_no_pending(self, what: str) -> None:
        pending = sum(len(module.pending) for module in self.modules)
        if pending:
            raise RuntimeError(
                f"{pending} forwards are pending; call loss.backward() and step() (or "
                f"discard()) before {what}"
            )

    def discard(self) -> int:
        """Drop every pending forward without updating its rows; return how many.

        For a step that cannot go on (a NaN loss, a backward that failed, an exception in the
        model): the rows' reads are released (`EmbeddingStore.release`), so later reads do
        not wait on the staleness bound and `close()` can checkpoint. Each module's `step`
        still advances, as after `step()`.
        """
        dropped = 0
        for module in self.modules:
            while module.pending:
                step, ids, _ = module.pending[0]
                module.store.release(ids, step=step)
                module.pending.pop(0)
                dropped += 1
            module.step += 1
        return dropped
