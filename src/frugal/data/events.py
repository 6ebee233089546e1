"""`TemporalEvents`: a time-sorted stream of (src, dst, t) events with dense node ids.

The container every temporal-graph consumer in frugal reads (tgraph models, store access
traces). Field names follow PyG's `TemporalData` (`src`, `dst`, `t`, `msg`) and convert to and
from it when torch-geometric is installed.

Shape legend: E events, N nodes, D edge-feature width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64

if TYPE_CHECKING:
    import torch

__all__ = ["TemporalEvents", "factorize_nodes"]


def factorize_nodes(
    src: npt.ArrayLike, dst: npt.ArrayLike, *, bipartite: bool = False
) -> tuple[I64, I64, npt.NDArray[Any], int]:
    """Re-index raw node ids densely, in order of first appearance.

    Non-bipartite graphs factorise [all sources in row order, then all destinations], so the
    id of a node depends only on the row order. Bipartite graphs factorise sources (users) and
    destinations (items) separately and shift items by the number of users. This is the
    re-indexing of the `ml_NAME` files of Benchtemp/TGN minus their +1 padding offset.

    Args:
        src: Raw source ids, any hashable dtype numpy can sort.
        dst: Raw destination ids, same length.
        bipartite: Whether sources and destinations are disjoint node sets.

    Returns:
        (src, dst, node_ids, num_src_nodes): dense int64 ids, the raw id of every dense id
        (for a bipartite graph users first, then items), and the number of source nodes
        (users) for a bipartite graph, else the number of nodes.

    Raises:
        ValueError: If `src` and `dst` differ in length.

    Shapes:
        src, dst: (E,) -> (E,), (E,); node_ids: (N,).
    """
    src_raw = np.asarray(src)
    dst_raw = np.asarray(dst)
    if src_raw.shape != dst_raw.shape or src_raw.ndim != 1:
        raise ValueError(
            f"src has shape {src_raw.shape} and dst {dst_raw.shape}; both must be 1-D and equal"
        )
    if bipartite:
        users, src_ids = _first_appearance(src_raw)
        items, dst_ids = _first_appearance(dst_raw)
        return src_ids, dst_ids + len(users), np.concatenate([users, items]), len(users)
    both = np.concatenate([src_raw, dst_raw])
    nodes, dense = _first_appearance(both)
    n = len(src_raw)
    return dense[:n], dense[n:], nodes, len(nodes)


def _first_appearance(values: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], I64]:
    """Return (unique values in order of first appearance, dense code of every value)."""
    uniques, first_index, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first_index, kind="stable")  # sorted-unique position -> appearance rank
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return uniques[order], rank[inverse].astype(np.int64)


@dataclass(frozen=True, eq=False)
class TemporalEvents:
    """A time-sorted event stream with dense 0-based node ids.

    Attributes:
        src: Source node of each event, int64 in [0, num_nodes).
        dst: Destination node of each event, int64 in [0, num_nodes).
        t: Timestamp of each event, int64, non-decreasing, in `time_unit`.
        num_nodes: Number of nodes, including nodes that appear in no event.
        time_unit: Unit of `t`: "s" (Unix seconds) or "year".
        msg: Edge features, float32, or None.
        label: Per-event dynamic label of the source (0 if none), int64, or None.
        node_ids: Raw id of every dense node id (from the source file).
        node_label: Static class of every node, int64 in [0, len(label_names)), -1 if unknown,
            or None.
        label_names: Class name of every `node_label` value.
        bipartite: Whether src (users) and dst (items) are disjoint node sets; then users are
            [0, num_src_nodes) and items [num_src_nodes, num_nodes).
        num_src_nodes: Number of users for a bipartite graph, else `num_nodes`.

    Shapes:
        src, dst, t, label: (E,); msg: (E, D); node_ids, node_label: (N,).

    Raises:
        ValueError: On construction, if lengths differ, ids are out of range, `t` decreases or
            `msg` holds NaN/inf.
    """

    src: I64
    dst: I64
    t: I64
    num_nodes: int
    time_unit: str = "s"
    msg: F32 | None = None
    label: I64 | None = None
    node_ids: npt.NDArray[Any] | None = None
    node_label: I64 | None = None
    label_names: tuple[str, ...] = ()
    bipartite: bool = False
    num_src_nodes: int = field(default=-1)

    def __post_init__(self) -> None:
        num_events = len(self.src)
        for name in ("src", "dst", "t"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != np.int64:
                raise ValueError(f"{name} must be a 1-D int64 numpy array, got {_describe(arr)}")
            if len(arr) != num_events:
                raise ValueError(f"{name} has {len(arr)} events but src has {num_events}")
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, (int, np.integer)):
            raise ValueError(f"num_nodes={self.num_nodes!r} must be an integer")
        if self.num_nodes < 0:
            raise ValueError(f"num_nodes={self.num_nodes} must be >= 0")
        for name in ("src", "dst"):
            arr = getattr(self, name)
            if num_events and (arr.min() < 0 or arr.max() >= self.num_nodes):
                bad = int(np.flatnonzero((arr < 0) | (arr >= self.num_nodes))[0])
                raise ValueError(
                    f"{name}[{bad}] = {arr[bad]} is outside [0, num_nodes={self.num_nodes}); "
                    "re-index nodes densely (factorize_nodes) or raise num_nodes"
                )
        decreasing = self.t[1:] < self.t[:-1]  # no np.diff: it overflows near int64 limits
        if decreasing.any():
            bad = int(np.flatnonzero(decreasing)[0]) + 1
            raise ValueError(
                f"t must be non-decreasing, but t[{bad}] = {self.t[bad]} < t[{bad - 1}] = "
                f"{self.t[bad - 1]}; sort the events by t with a stable sort first"
            )
        if self.msg is not None:
            if not isinstance(self.msg, np.ndarray) or self.msg.dtype != np.float32:
                raise ValueError(f"msg must be a float32 numpy array, got {_describe(self.msg)}")
            if self.msg.ndim != 2 or len(self.msg) != num_events:
                raise ValueError(f"msg must have shape (E={num_events}, D), got {self.msg.shape}")
            if not np.isfinite(self.msg).all():
                row = int(np.flatnonzero(~np.isfinite(self.msg).all(axis=1))[0])
                raise ValueError(f"msg row {row} holds NaN or inf; edge features must be finite")
        if self.label is not None and (
            not isinstance(self.label, np.ndarray)
            or self.label.dtype != np.int64
            or self.label.shape != (num_events,)
        ):
            raise ValueError(
                f"label must be int64 of shape ({num_events},), got {_describe(self.label)}"
            )
        for name in ("node_ids", "node_label"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (self.num_nodes,):
                raise ValueError(f"{name} must have shape ({self.num_nodes},), got {arr.shape}")
        if self.node_label is not None and len(self.node_label):
            top = int(self.node_label.max())
            if top >= len(self.label_names) or int(self.node_label.min()) < -1:
                raise ValueError(
                    f"node_label values must lie in [-1, {len(self.label_names)}), got "
                    f"[{int(self.node_label.min())}, {top}]; give one label_names entry per class"
                )
        if self.num_src_nodes == -1:
            object.__setattr__(self, "num_src_nodes", self.num_nodes)
        elif not 0 <= self.num_src_nodes <= self.num_nodes or (
            not self.bipartite and self.num_src_nodes != self.num_nodes
        ):
            raise ValueError(
                f"num_src_nodes={self.num_src_nodes} must be the number of users (in [0, "
                f"{self.num_nodes}]) of a bipartite graph, or num_nodes otherwise"
            )
        if self.bipartite and num_events:
            users = self.num_src_nodes
            if self.src.max() >= users or self.dst.min() < users:
                raise ValueError(
                    f"a bipartite graph needs src in [0, {users}) and dst in [{users}, "
                    f"{self.num_nodes}); got src max {self.src.max()}, dst min {self.dst.min()}"
                )

    @property
    def num_events(self) -> int:
        """Number of events E."""
        return len(self.src)

    def to_temporal_data(self) -> Any:
        """Convert to PyG's `torch_geometric.data.TemporalData`.

        `msg` becomes a float32 tensor of shape (E, D) (zeros of width 0 if there are no
        edge features) and `y` holds `label` when present.

        Returns:
            A `TemporalData` with `src`, `dst`, `t`, `msg` (and `y`).

        Raises:
            ModuleNotFoundError: If torch-geometric is not installed, with the pip line to run.
        """
        try:
            from torch_geometric.data import TemporalData
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "to_temporal_data needs torch-geometric; run: pip install torch-geometric==2.8.1"
            ) from exc
        import torch

        msg = self.msg if self.msg is not None else np.zeros((self.num_events, 0), np.float32)
        kwargs: dict[str, torch.Tensor] = {
            "src": torch.from_numpy(self.src.copy()),
            "dst": torch.from_numpy(self.dst.copy()),
            "t": torch.from_numpy(self.t.copy()),
            "msg": torch.from_numpy(np.ascontiguousarray(msg, dtype=np.float32)),
        }
        if self.label is not None:
            kwargs["y"] = torch.from_numpy(self.label.copy())
        return TemporalData(**kwargs)

    @classmethod
    def from_temporal_data(
        cls, data: Any, *, num_nodes: int | None = None, time_unit: str = "s"
    ) -> TemporalEvents:
        """Build events from a PyG `TemporalData` (`src`, `dst`, `t`, optional `msg`, `y`).

        Events are stably sorted by `t` if needed; node ids are kept as they are.

        Args:
            data: A `TemporalData` (or anything with tensor attributes `src`, `dst`, `t`).
            num_nodes: Number of nodes; defaults to max(src, dst) + 1.
            time_unit: Unit of `t`.

        Returns:
            The events.

        Raises:
            ValueError: If the tensors disagree in length or ids are negative.
        """
        src = data.src.numpy()
        dst = data.dst.numpy()
        t = data.t.numpy()
        for name, arr in (("src", src), ("dst", dst), ("t", t)):
            if not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(
                    f"TemporalData.{name} has dtype {arr.dtype}; frugal needs integer ids and "
                    "timestamps (convert t to integer seconds first)"
                )
        src, dst, t = src.astype(np.int64), dst.astype(np.int64), t.astype(np.int64)
        order = np.argsort(t, kind="stable")
        msg = getattr(data, "msg", None)
        msg_np = None if msg is None or msg.shape[-1] == 0 else msg.numpy().astype(np.float32)
        y = getattr(data, "y", None)
        label = None if y is None else y.numpy().astype(np.int64)[order]
        if num_nodes is None:
            num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
        return cls(
            src=src[order],
            dst=dst[order],
            t=t[order],
            num_nodes=num_nodes,
            time_unit=time_unit,
            msg=None if msg_np is None else msg_np[order],
            label=label,
        )


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__name__
