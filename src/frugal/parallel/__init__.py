"""The vocabulary planner, pipeline and comm share, without torch.

- `frugal.parallel.schedule`: pipeline schedules as per-stage action lists (GPipe, 1F1B; a
  registry for more) — the runtime executes them, both simulators replay them;
- `frugal.parallel.partition`: the one layer partitioner (even, or weighted by device speed
  and fixed per-stage work);
- `frugal.parallel.codec`: `CodecSpec`, every codec's exact wire size (header, scales,
  first visits), which `frugal.comm` runs and `frugal.planner` prices;
- `frugal.parallel.plan`: `Plan`, placement + codec + schedule + micro-batches + DP
  collectives as versioned JSON; the planner writes it, the pipeline runs it.

Nothing here imports torch (a test checks it), so a plan can be made and read anywhere.
"""

from frugal.parallel.codec import CodecSpec, message_wire_bytes, payload_bytes
from frugal.parallel.partition import partition_layers, split_layers
from frugal.parallel.plan import PLAN_FORMAT_VERSION, Plan, PlanMismatchError
from frugal.parallel.schedule import SCHEDULES, build_schedule, register_schedule

__all__ = [
    "PLAN_FORMAT_VERSION",
    "SCHEDULES",
    "CodecSpec",
    "Plan",
    "PlanMismatchError",
    "build_schedule",
    "message_wire_bytes",
    "partition_layers",
    "payload_bytes",
    "register_schedule",
    "split_layers",
]
