"""Layer partitioning: how many contiguous layers each pipeline stage runs.

One partitioner for the runtime's default layout, the model zoo (a last stage carrying the
head and loss) and the planner (stages on devices of different speeds): every stage gets one
layer, then each further layer goes to the stage whose cost grows least. Stage i's cost is
(l_i + extra_i) x seconds_i; the greedy is optimal for the costliest stage (an exchange
argument), and ties go to the earlier stage, so equal costs give the even split with the
earlier stages taking the remainder.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

__all__ = ["partition_layers", "split_layers"]


def partition_layers(
    num_layers: int,
    num_stages: int,
    *,
    seconds_per_layer: Sequence[float] | None = None,
    extra_layers: Sequence[float] | None = None,
) -> tuple[int, ...]:
    """Layers per stage minimising the costliest stage.

    Args:
        num_layers: L, >= num_stages.
        num_stages: p, >= 1.
        seconds_per_layer: Per stage, the cost of one layer there (e.g. 1 / the slowest
            device's speed); None = 1 everywhere.
        extra_layers: Per stage, fixed work in layer units (e.g. the head and loss on the last
            stage), >= 0; None = 0 everywhere.

    Returns:
        p counts, each >= 1, summing to L.

    Raises:
        ValueError: If num_stages is not in [1, num_layers], a list has the wrong length, a
            cost is not > 0 or an extra is negative.
    """
    if not 1 <= num_stages <= num_layers:
        raise ValueError(
            f"num_stages={num_stages} but the model has {num_layers} blocks (layers); each stage "
            f"needs one, so set num_stages (--stages) between 1 and {num_layers}"
        )
    cost = (
        [1.0] * num_stages if seconds_per_layer is None else [float(c) for c in seconds_per_layer]
    )
    extra = [0.0] * num_stages if extra_layers is None else [float(e) for e in extra_layers]
    if len(cost) != num_stages or len(extra) != num_stages:
        raise ValueError(
            f"seconds_per_layer and extra_layers need {num_stages} entries (one per stage), got "
            f"{len(cost)} and {len(extra)}"
        )
    if min(cost) <= 0 or min(extra) < 0:
        raise ValueError(
            f"seconds_per_layer={cost} must be > 0 and extra_layers={extra} >= 0 per stage"
        )
    layers = [1] * num_stages
    heap = [((2 + extra[i]) * cost[i], i) for i in range(num_stages)]
    heapq.heapify(heap)
    for _ in range(num_layers - num_stages):
        _, i = heapq.heappop(heap)
        layers[i] += 1
        heapq.heappush(heap, ((layers[i] + 1 + extra[i]) * cost[i], i))
    return tuple(layers)


def split_layers(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible (earlier stages take the remainder).

    Raises:
        ValueError: If num_stages is not in [1, num_layers].
    """
    return partition_layers(num_layers, num_stages)
