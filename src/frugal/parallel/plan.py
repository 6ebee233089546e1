"""`Plan` (format 2): placement, layers, codec, schedule, micro-batches, DP collectives.

A plan names, for every pipeline j and stage i, the physical rank `mesh[j][i]` that runs it,
the layers of each stage, the micro-batches of each replica, the activation codec and
pipeline schedule it was priced for, the micro-batch size, the gradient collective of each
stage's data-parallel group, and what the cost model predicts. It round-trips through JSON
(`Plan.from_json(p.to_json()) == p`), hashes canonically, prints as a table and validates
against a cluster. The planner (`frugal.planner.build_plan`) writes plans; the pipeline
(`frugal.pipeline`) runs them, refuses one whose codec, schedule or micro-batch size differ
from the job's (`Plan.check_runnable`), and never imports the planner: they meet here.

Format 1 (frugal 0.1) had no codec, schedule, micro-batch size or collective: such a plan
still loads (`Plan.from_json`), with those fields empty ("not recorded"), and runs with the
job's settings after a warning; plan again with this frugal to have them checked.

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (the placement a plan describes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from frugal.config import ConfigError, check_types
from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import SCHEDULES

__all__ = [
    "DP_COLLECTIVES",
    "PLAN_FORMAT_VERSION",
    "STOP_REASONS",
    "ClusterDigest",
    "Plan",
    "PlanMismatchError",
]

PLAN_FORMAT_VERSION = 2
"""The format `Plan.to_json` writes; `from_json` also reads format 1."""
DP_COLLECTIVES = ("seq_peer", "ring", "central_ps")
"""Gradient exchanges a plan may name per stage: the DT-FM paper's sequential peer exchange,
a ring all-reduce, a central parameter server."""
_NEW_IN_V2 = ("codec", "schedule", "microbatch_size", "dp_collective")
_ADDED_IN_V2 = ("num_candidates", "stop_reason", "global_batch_size")
"""Fields added to format 2 later: a format-2 plan written before them still loads."""
STOP_REASONS = ("budget", "time_limit", "converged", "none")
"""Why a plan's search stopped: its candidate budget was spent (the plan is reproducible), its
time limit passed (two runs may differ), it ended on its own first, or no search ran."""


class PlanMismatchError(ConfigError):
    """A plan asked to run with settings other than those it was priced for."""


class ClusterDigest(Protocol):
    """What `Plan.validate` needs of a cluster (a `frugal.planner.Topology` has both)."""

    @property
    def num_devices(self) -> int:
        """Devices (ranks) in the cluster."""
        ...

    def sha256(self) -> str:
        """Digest of the cluster's description."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A placement of D_dp pipelines of D_pp stages on physical ranks.

    Attributes:
        world_size: Number of ranks N.
        num_stages: D_pp.
        num_replicas: D_dp.
        num_layers_per_stage: Layers of each stage (sum = num_layers, each >= 1).
        num_microbatches_per_replica: Micro-batches per accumulation step of each pipeline
            (uneven when faster pipelines take more; gradients are then weighted by it).
        mesh: `mesh[j][i]` = rank running stage i of pipeline j; a permutation of 0..N-1.
        stage_order: Group id along the pipeline path for each stage (paper's plan).
        devices: Per rank: name, host, site.
        objective: Cost model used.
        method: Search that produced the plan.
        predicted_cost_s: The objective's value in seconds.
        breakdown: Parts of the prediction (e.g. dp_s, pp_s) in seconds.
        lower_bound_s: A lower bound on the objective over all placements, seconds.
        gap: predicted_cost_s / lower_bound_s - 1 (how far from provably optimal, at most).
        seed: Seed of the search.
        cluster: Name of the topology (scenario or file).
        cluster_sha256: Digest of the topology it was made for.
        codec: Activation codec the plan was priced for (`CodecSpec.label`, e.g. `fp16`,
            `aqsgd:fw2,bw4`); "" = not recorded (a format-1 plan, or a hand-made one).
        schedule: Pipeline schedule it was priced for (`gpipe`, `1f1b`); "" = not recorded.
        microbatch_size: Examples per micro-batch it was priced for; 0 = not recorded.
        dp_collective: Per stage, the gradient exchange the prediction assumes (one of
            `DP_COLLECTIVES`); () = not recorded or no data parallelism.
        num_candidates: Placements the search scored (all grids' searches when the planner
            chose the grid); 0 = not recorded or no search.
        stop_reason: Why the search stopped, one of `STOP_REASONS` ("time_limit": a run on
            another machine or load may stop elsewhere and differ); "" = not recorded.
        global_batch_size: Sequences per iteration it was priced for; 0 = not recorded.
        format_version: Plan format version (2; format-1 JSON is upgraded on load).
    """

    world_size: int
    num_stages: int
    num_replicas: int
    num_layers_per_stage: tuple[int, ...]
    num_microbatches_per_replica: tuple[int, ...]
    mesh: tuple[tuple[int, ...], ...]
    stage_order: tuple[int, ...]
    devices: tuple[tuple[str, str, str], ...]
    objective: Literal["iteration", "paper"]
    method: str
    predicted_cost_s: float
    breakdown: tuple[tuple[str, float], ...]
    lower_bound_s: float
    gap: float
    seed: int
    cluster: str
    cluster_sha256: str
    codec: str = ""
    schedule: str = ""
    microbatch_size: int = 0
    dp_collective: tuple[str, ...] = ()
    num_candidates: int = 0
    stop_reason: str = ""
    global_batch_size: int = 0
    format_version: int = PLAN_FORMAT_VERSION

    def __post_init__(self) -> None:
        check_types(self)  # a hand-edited or foreign JSON fails here, naming the field
        if self.format_version != PLAN_FORMAT_VERSION:
            raise ValueError(
                f"plan format_version {self.format_version}; this frugal writes "
                f"{PLAN_FORMAT_VERSION} and reads 1 and 2: make the plan again with this version"
            )
        if self.codec:
            try:
                CodecSpec.parse(self.codec)
            except ValueError as exc:
                raise ValueError(
                    f"the plan's codec {self.codec!r} is not one the pipeline runs ({exc}); "
                    'plan again with workload.codec set to one of them (or "auto" to let '
                    'the planner choose), or edit the plan\'s "codec"'
                ) from exc
        if self.codec and CodecSpec.parse(self.codec).label != self.codec:
            raise ValueError(
                f"plan codec {self.codec!r} is not canonical; write "
                f"{CodecSpec.parse(self.codec).label!r}"
            )
        if self.schedule:
            SCHEDULES.check(self.schedule)
        if self.microbatch_size < 0:
            raise ValueError(
                f"microbatch_size={self.microbatch_size} must be >= 1, or 0 for not recorded"
            )
        if self.dp_collective and (
            len(self.dp_collective) != self.num_stages
            or any(c not in DP_COLLECTIVES for c in self.dp_collective)
        ):
            raise ValueError(
                f"dp_collective={self.dp_collective} needs one of {DP_COLLECTIVES} per stage "
                f"({self.num_stages}), or () for not recorded"
            )
        if self.num_candidates < 0:
            raise ValueError(f"num_candidates={self.num_candidates} must be >= 0")
        if self.stop_reason and self.stop_reason not in STOP_REASONS:
            raise ValueError(
                f"stop_reason={self.stop_reason!r} must be one of {STOP_REASONS}, or '' for not "
                "recorded"
            )
        if len(self.devices) != self.world_size:
            raise ValueError(
                f"devices lists {len(self.devices)} ranks but world_size = {self.world_size}"
            )
        flat = sorted(r for row in self.mesh for r in row)
        if flat != list(range(self.world_size)):
            raise ValueError(f"mesh must be a permutation of ranks 0..{self.world_size - 1}")
        if len(self.mesh) != self.num_replicas or any(
            len(row) != self.num_stages for row in self.mesh
        ):
            raise ValueError(
                f"mesh must be num_replicas x num_stages = {self.num_replicas} x {self.num_stages}"
            )
        if (
            len(self.num_microbatches_per_replica) != self.num_replicas
            or min(self.num_microbatches_per_replica) < 1
        ):
            raise ValueError(
                f"num_microbatches_per_replica={self.num_microbatches_per_replica} needs "
                f"{self.num_replicas} entries, each >= 1"
            )
        if len(self.num_layers_per_stage) != self.num_stages or min(self.num_layers_per_stage) < 1:
            raise ValueError(
                f"num_layers_per_stage={self.num_layers_per_stage} needs {self.num_stages} "
                "entries, each >= 1"
            )

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no timestamps (so equal plans have equal bytes)."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Parse a plan written by `to_json`.

        Raises:
            ValueError: If the JSON is malformed, a field is missing or unknown, or the plan
                breaks a rule (see the class).
        """
        try:
            data: dict[str, Any] = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
            raise ValueError(f"not a plan: invalid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ValueError(f"not a plan: the JSON is a {type(data).__name__}, not an object")
        if data.get("format_version", 1) == 1:
            data = {**data, "format_version": PLAN_FORMAT_VERSION}  # format 1: nothing recorded
            optional = set(_NEW_IN_V2)
        else:
            optional = set()
        optional |= set(_ADDED_IN_V2)
        fields = set(cls.__dataclass_fields__)
        unknown, missing = set(data) - fields, fields - set(data) - {"format_version"} - optional
        if unknown or missing:
            raise ValueError(
                f"not a plan: unknown fields {sorted(unknown)}, missing {sorted(missing)}; "
                "write a plan with `frugal plan --out FILE`"
            )

        def tuples(value: Any) -> Any:
            return tuple(tuples(v) for v in value) if isinstance(value, list) else value

        return cls(**{k: tuples(v) for k, v in data.items()})

    @property
    def sha256(self) -> str:
        """Digest of the canonical JSON; every rank checks it before training."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @property
    def is_recorded(self) -> bool:
        """Whether the plan records its codec, schedule and micro-batch size (format 2)."""
        return bool(self.codec and self.schedule and self.microbatch_size)

    def check_runnable(
        self, *, codecs: tuple[str, ...], schedule: str, microbatch_size: int
    ) -> None:
        """Refuse to run the plan with settings it was not priced for.

        Fields the plan does not record (format 1, hand-made plans) are not checked.

        Args:
            codecs: Every activation codec the job will run (CodecSpec texts).
            schedule: The job's pipeline schedule.
            microbatch_size: The job's examples per micro-batch.

        Raises:
            PlanMismatchError: Naming, for every field that differs, both values and the two
                fixes.
            ValueError: If a codec text does not parse.
        """
        problems: list[str] = []
        for codec in dict.fromkeys(CodecSpec.parse(c).label for c in codecs):
            if self.codec and codec != self.codec:
                problems.append(
                    f"the plan was priced for codec {self.codec!r} but the job runs {codec!r}; "
                    f"run with --codec {self.codec} or plan again with workload.codec="
                    f'"{codec}"'
                )
        if self.schedule and schedule != self.schedule:
            problems.append(
                f"the plan was priced for schedule {self.schedule!r} but the job runs "
                f'{schedule!r}; set schedule="{self.schedule}" or plan again with '
                f'workload.schedule="{schedule}"'
            )
        if self.microbatch_size and microbatch_size != self.microbatch_size:
            problems.append(
                f"the plan was priced for microbatch_size={self.microbatch_size} but the job "
                f"runs micro_batch_size={microbatch_size}; set micro_batch_size="
                f"{self.microbatch_size} or plan again with workload.microbatch_size="
                f"{microbatch_size}"
            )
        if problems:  # every mismatch at once, so one run shows them all
            raise PlanMismatchError("; and ".join(problems))

    def validate(self, topology: ClusterDigest) -> None:
        """Check the plan was made for `topology` (a `frugal.planner.Topology`).

        Raises:
            TypeError: If `topology` has no `num_devices` and `sha256()`.
            ValueError: If the world size or the topology digest differs.
        """
        if not (hasattr(topology, "num_devices") and callable(getattr(topology, "sha256", None))):
            raise TypeError(f"validate needs a Topology, got {type(topology).__name__}")
        if topology.num_devices != self.world_size:
            raise ValueError(
                f"the plan is for world_size={self.world_size} but the cluster has "
                f"{topology.num_devices} devices"
            )
        if topology.sha256() != self.cluster_sha256:
            raise ValueError(
                "the plan was made for another cluster (topology digest differs); plan again"
            )

    def _stopped(self) -> str:
        return {
            "budget": "its candidate budget",
            "time_limit": "its time limit (two runs may differ)",
            "converged": "convergence",
            "none": "nothing (a fixed placement, no search)",
        }[self.stop_reason]

    def table(self) -> str:
        """A text table: one row per pipeline, the device (site) of each stage."""
        head = f"{'pipeline':>8} | " + " | ".join(
            f"stage {i} ({self.num_layers_per_stage[i]} l)" for i in range(self.num_stages)
        )
        lines = [head, "-" * len(head)]
        for j, row in enumerate(self.mesh):
            cells = [f"{self.devices[r][0]} [{self.devices[r][2]}]" for r in row]
            lines.append(f"{j:>8} | " + " | ".join(cells))
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in self.breakdown)
        if self.is_recorded:
            collective = ", ".join(dict.fromkeys(self.dp_collective)) or "none"
            counts = sorted(set(self.num_microbatches_per_replica))
            per_step = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
            lines.append(
                f"codec {self.codec}, schedule {self.schedule}, micro-batch size "
                f"{self.microbatch_size}, {per_step} micro-batches per step, DP collective "
                f"{collective}"
            )
        if self.stop_reason:
            lines.append(f"search: {self.num_candidates} candidates, stopped on {self._stopped()}")
        lines.append(
            f"{self.objective} cost {self.predicted_cost_s:.3f} s ({parts}); lower bound "
            f"{self.lower_bound_s:.3f} s (gap {self.gap:.1%}); method {self.method}; cluster "
            f"{self.cluster}; plan sha256 {self.sha256[:12]}"
        )
        return "\n".join(lines)
