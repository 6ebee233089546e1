"""`frugal reproduce`: every subsystem's headline comparison, side by side, in one report.

The main job. Each part calls its subsystem's own bench (`frugal.bench.store`,
`frugal.bench.tgraph`, `frugal.bench.recsys`, `frugal.bench.pipeline`, `frugal.bench.planner`)
with a preset of the chosen mode, then the report puts the published claim, our number, the
baseline's and the verdict side by side. See `frugal.reproduce.run.run_reproduce`.
"""

from __future__ import annotations

from frugal.reproduce.parts import PART_NAMES, Part, Verdict, get_part
from frugal.reproduce.run import MODES, Mode, ReproduceConfig, run_reproduce

__all__ = [
    "MODES",
    "PART_NAMES",
    "Mode",
    "Part",
    "ReproduceConfig",
    "Verdict",
    "get_part",
    "run_reproduce",
]
