"""`LookaheadLoader`: hand the store the ids of the next W batches before they are needed.

Contract (store.md 2.3): before a batch of step t is yielded, `store.lookahead(ids, step)` has
been called for the batches of steps t+1 .. t+W. Hints change residency only, never values, so
I/O overlaps compute even at staleness bound 0.

References:
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (the Lookahead API, driven here by the loader).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Batch", "LookaheadLoader"]


class _Hintable(Protocol):
    def lookahead(self, ids: Any, step: int) -> None: ...


@dataclass(frozen=True, eq=False)
class Batch:
    """One training step's row ids (any shape) and whatever else the step needs."""

    step: int
    ids: npt.NDArray[np.int64]
    payload: Any = None


class LookaheadLoader:
    """Wrap an iterable of `Batch` so the store sees each batch `window` steps early.

    Args:
        batches: Batches in step order.
        store: Anything with `lookahead(ids, step)` (an `EmbeddingStore`, a baseline).
        window: How many future batches are hinted, >= 0 (0 passes batches through).

    Raises:
        ValueError: If `window` < 0, or batches arrive out of step order.
    """

    def __init__(self, batches: Iterable[Batch], store: _Hintable, window: int) -> None:
        if window < 0:
            raise ValueError(f"window={window} must be >= 0 (0 turns lookahead off)")
        self.batches = batches
        self.store = store
        self.window = window

    def __iter__(self) -> Iterator[Batch]:
        source = iter(self.batches)
        buffer: deque[Batch] = deque()
        last_step: int | None = None

        def admit(batch: Batch) -> None:
            nonlocal last_step
            if last_step is not None and batch.step <= last_step:
                raise ValueError(
                    f"batch step {batch.step} follows step {last_step}; steps must increase"
                )
            last_step = batch.step
            if self.window:
                self.store.lookahead(batch.ids, batch.step)
            buffer.append(batch)

        for batch in source:
            admit(batch)
            if len(buffer) > self.window:
                yield buffer.popleft()
        while buffer:
            yield buffer.popleft()
