"""Re-planning when hosts leave or join a running job: warm-start, move as few stages as pays.

`frugal plan --replan plan.json --without HOST` (a host died or is reclaimed) or `--with HOST`
(a host joined) starts from the running plan instead of from nothing, because every device
that gets other layers must load them (weights, optimizer state, AQ-SGD buffers) before the
job goes on. A device *moves* when the layers it runs change (a new device always moves).

1. **Warm start** (fewest moves): the plan keeps its stage count and layer split; it keeps
   the pipelines that lost no device (those with fewest holes first), and fills each hole at
   stage i with a free device that already ran stage i (no move), else a joining device, else
   any free device. Joining devices beyond the holes form new pipelines. The replica count is
   the largest that the devices allow and the global batch splits into (whole steps per
   replica); devices left over are *spare*.
2. **Polish**: seeded first-improvement swaps from the warm start (two mesh positions, or a
   mesh position and a spare), under the planner's objective; every accepted state is kept.
3. **Fresh**: the planner's own search (`build_plan`) on the same devices, ignoring the old
   plan.

The result is the candidate with the fewest moves among those predicted within
`tolerance` of the fastest (e.g. 0.05: at most 5 % slower than the best found). With
devices of different speeds (iteration objective), layers are re-balanced to the new
devices, which may move more.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from frugal.config import ConfigError
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import (
    InfeasiblePlanError,
    Plan,
    PlannerConfig,
    _balance_layers,
    build_plan,
    check_memory,
    price_mesh,
)
from frugal.planner.topology import Topology

__all__ = ["Replan", "replan", "subset_topology"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Replan:
    """A new plan and how it differs from the old one.

    Attributes:
        plan: The new plan; its ranks number its own devices (old rank order, then joining
            devices in cluster order), so the job restarts with `plan.world_size` ranks.
        removed: Device names on the `--without` hosts.
        added: Joining device names the new plan uses.
        spare: Available device names the new plan leaves idle (grid or batch split).
        moved: Device names of the new plan whose layers changed (joining ones included).
        kept: Device names of the new plan that keep their layers.
        candidates: (name, moves, predicted seconds) of each candidate: "warm" (old layer
            split), "warm-balanced" (layers re-balanced to the devices' speeds, if they
            differ), "warm-joined" (whole pipelines of joining devices in place of the slowest
            kept ones, if any are left spare), "polished" (the best polished state, if a
            swap helped), "fresh" (a new search on the warm start's devices) and
            "fresh-fastest" (on the fastest devices, if those differ).
        chosen: Name of the candidate returned.
        tolerance: Slowdown accepted to move fewer stages (fraction of the fastest).
        notes: Anything the user should know (e.g. a batch that would keep more replicas).
    """

    plan: Plan
    removed: tuple[str, ...]
    added: tuple[str, ...]
    spare: tuple[str, ...]
    moved: tuple[str, ...]
    kept: tuple[str, ...]
    candidates: tuple[tuple[str, int, float], ...]
    chosen: str
    tolerance: float
    notes: tuple[str, ...] = ()

    def table(self) -> str:
        """A short text report: what left, what joined, the candidates, the choice."""
        lines = [
            f"re-plan: {len(self.removed)} device(s) removed, {len(self.added)} joined, "
            f"{len(self.spare)} spare; {self.plan.num_replicas} replicas x "
            f"{self.plan.num_stages} stages on {self.plan.world_size} devices",
        ]
        for name, moves, seconds in self.candidates:
            mark = "  <- chosen" if name == self.chosen else ""
            lines.append(f"  {name:<13} {moves:>4} moved  {seconds:10.3f} s/iteration{mark}")
        lines.append(
            f"  chosen: fewest moves within {self.tolerance:.0%} of the fastest; moved: "
            + (", ".join(self.moved[:12]) + (" ..." if len(self.moved) > 12 else "") or "none")
        )
        if self.spare:
            lines.append("  spare: " + ", ".join(self.spare))
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def subset_topology(topology: Topology, indices: Sequence[int]) -> Topology:
    """The topology of `topology.devices[indices]` (in that order) and the links between them.

    Raises:
        ValueError: If an index repeats or is out of range.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if len(set(idx.tolist())) != len(idx) or (idx < 0).any() or (idx >= topology.num_devices).any():
        raise ValueError(f"indices {list(indices)} must be distinct devices of the topology")
    return Topology(
        devices=tuple(topology.devices[i] for i in idx),
        delay_ms=np.ascontiguousarray(topology.delay_ms[np.ix_(idx, idx)]),
        bandwidth_gbps=np.ascontiguousarray(topology.bandwidth_gbps[np.ix_(idx, idx)]),
        name=topology.name,
    )


def _layer_ranges(layers: Sequence[int]) -> list[tuple[int, int]]:
    starts = np.concatenate([[0], np.cumsum(layers)])
    return [(int(starts[i]), int(starts[i + 1])) for i in range(len(layers))]


def _check_request(
    old: Plan, cluster: Topology, config: PlannerConfig, without: Sequence[str],
    with_hosts: Sequence[str],
) -> None:  # fmt: skip
    if not without and not with_hosts:
        raise ConfigError("--replan needs --without HOST or --with HOST (or both)")
    plan_hosts = sorted({host for _, host, _ in old.devices})
    cluster_hosts = {d.host for d in cluster.devices}
    both = sorted(set(without) & set(with_hosts))
    if both:
        raise ConfigError(f"host {both[0]!r} is given to both --without and --with; give it once")
    for host in without:
        if host not in plan_hosts:
            raise ConfigError(
                f"--without {host}: no device of the plan runs on host {host!r}; the plan's "
                f"hosts are {', '.join(plan_hosts)}"
            )
    if set(without) >= set(plan_hosts) and not with_hosts:
        raise ConfigError(
            f"--without removes every host of the plan ({', '.join(plan_hosts)}); nothing is "
            "left to re-plan: plan afresh with `frugal plan --cluster FILE`"
        )
    for host in with_hosts:
        if host in plan_hosts:
            raise ConfigError(f"--with {host}: host {host!r} is already in the plan")
        if host not in cluster_hosts:
            free = sorted(cluster_hosts - set(plan_hosts))
            raise ConfigError(
                f"--with {host}: the cluster {cluster.name or '(unnamed)'} has no host {host!r}; "
                "add it to the cluster file"
                + (f" (hosts not in the plan: {', '.join(free)})" if free else "")
            )
    by_name = {d.name: d for d in cluster.devices}
    for name, host, _ in old.devices:
        if host in without:
            continue
        device = by_name.get(name)
        if device is None or device.host != host:
            raise ConfigError(
                f"the plan's device {name!r} (host {host!r}) is not in the cluster "
                f"{cluster.name or '(unnamed)'}; give the cluster the plan was made for, with "
                f"the joining hosts added (or --without {host} if it is gone)"
            )
    if sum(old.num_layers_per_stage) != config.workload.num_layers:
        raise ConfigError(
            f"the plan splits {sum(old.num_layers_per_stage)} layers but workload.num_layers="
            f"{config.workload.num_layers}; re-plan with the settings the plan was made with"
        )


def _running_workload(old: Plan, config: PlannerConfig) -> WorkloadConfig:
    """The workload the running plan was priced for: its codec, schedule and global batch.

    The job keeps what it runs: the plan's recorded codec, schedule and global batch win over
    the settings (a plan without them keeps the settings').

    Raises:
        ConfigError: If the plan's micro-batches per step do not divide the global batch
            (the settings are not the ones the plan was made with).
    """
    workload = config.workload
    if old.codec:
        workload = replace(workload, codec=old.codec)
    if old.schedule:
        workload = replace(workload, schedule=old.schedule)
    if old.global_batch_size:
        workload = replace(workload, global_batch_size=old.global_batch_size)
    if old.microbatch_size:
        workload = replace(workload, microbatch_size=old.microbatch_size)
    total = sum(old.num_microbatches_per_replica)
    if workload.global_batch_size % (total * workload.microbatch_size):
        raise ConfigError(
            f"the plan runs {total} micro-batches of {workload.microbatch_size} per step over "
            f"its replicas, which does not divide workload.global_batch_size="
            f"{workload.global_batch_size}; re-plan with the settings the plan was made with "
            "(its global batch)"
        )
    return workload


def _replicas(num_devices: int, num_stages: int, total_microbatches: int) -> tuple[int, str]:
    """Largest replica count the devices allow that splits the step's micro-batches evenly.

    A resumed job keeps its step (`total_microbatches` over all replicas, so the data and
    the checkpoint carry on); the note says what a spare device would need.
    """
    most = num_devices // num_stages
    for k in range(most, 0, -1):
        if total_microbatches % k == 0:
            if k == most:
                return k, ""
            return k, (
                f"the step's {total_microbatches} micro-batches do not split over {most} "
                f"replicas, so {k} replica{'s' if k != 1 else ''} run and "
                f"{(most - k) * num_stages} more devices stay spare; keeping {most} needs a "
                f"step of a multiple of {most} micro-batches, i.e. another global batch: plan "
                "afresh (the job then starts over: its checkpoint's step differs)"
            )
    raise AssertionError("k = 1 always splits")  # pragma: no cover


def replan(
    old: Plan,
    cluster: Topology,
    config: PlannerConfig,
    *,
    without: Sequence[str] = (),
    with_hosts: Sequence[str] = (),
    tolerance: float = 0.05,
) -> Replan:
    """Re-plan `old` after the `without` hosts left and the `with_hosts` joined.

    Args:
        old: The running plan.
        cluster: Every device that may take part: the plan's devices (those on `without`
            hosts may be absent) plus the joining hosts' devices, with their links.
        config: The planner settings the plan was made with (objective, workload, method for
            the fresh search, budget and time limit shared by polish and fresh search, seed).
        without: Hosts that left.
        with_hosts: Hosts that joined (present in `cluster`).
        tolerance: Accept a plan up to this fraction slower than the fastest candidate to
            move fewer stages, >= 0.

    Returns:
        The new plan and its report (`Replan`).

    Raises:
        ConfigError: If a host is not where it should be, the plan's devices are not in the
            cluster, fewer devices than stages remain, or the batch cannot split.
        InfeasiblePlanError: If no candidate fits the devices' memory.
    """
    if not tolerance >= 0:
        raise ConfigError(
            f"replan tolerance={tolerance} must be a number >= 0 (0.05 = up to 5 % slower)"
        )
    if config.num_stages and config.num_stages != old.num_stages:
        raise ConfigError(
            f"num_stages={config.num_stages} but the plan has {old.num_stages} stages; "
            "re-planning keeps the stages (so a checkpoint resumes): plan afresh to change them"
        )
    _check_request(old, cluster, config, without, with_hosts)
    config = replace(config, workload=_running_workload(old, config))
    start = time.perf_counter()
    by_name = {d.name: i for i, d in enumerate(cluster.devices)}
    gone = set(without)
    removed = tuple(name for name, host, _ in old.devices if host in gone)
    survivors = [by_name[name] for name, host, _ in old.devices if host not in gone]
    joining = [i for i, d in enumerate(cluster.devices) if d.host in set(with_hosts)]
    avail_idx = survivors + joining
    avail = subset_topology(cluster, avail_idx)
    names = [d.name for d in avail.devices]
    n_avail = len(avail_idx)
    num_stages = old.num_stages
    if n_avail < num_stages:
        raise ConfigError(
            f"{n_avail} devices remain for num_stages={num_stages}; plan afresh with "
            f"`frugal plan --cluster FILE --set num_stages={n_avail}` (or fewer)"
        )
    total = sum(old.num_microbatches_per_replica)
    k, note = _replicas(n_avail, num_stages, total)
    config = replace(config, workload=replace(config.workload, microbatches_per_step=total // k))
    notes = (note,) if note else ()

    # Old stage of each available device (position in `avail`), -1 if joining.
    old_stage = np.full(n_avail, -1, dtype=np.int64)
    position = {name: p for p, name in enumerate(names)}
    rows: list[list[int]] = []
    for row in old.mesh:
        rows.append([])
        for stage, rank in enumerate(row):
            name, host, _ = old.devices[rank]
            if host in gone:
                rows[-1].append(-1)
            else:
                rows[-1].append(position[name])
                old_stage[position[name]] = stage
    old_ranges = _layer_ranges(old.num_layers_per_stage)

    # 1. warm start
    order = sorted(range(len(rows)), key=lambda j: (rows[j].count(-1), j))
    warm = [rows[j] for j in order[:k]] + [[-1] * num_stages for _ in range(k - len(rows))]
    used = {p for row in warm for p in row if p >= 0}
    free = [p for p in range(n_avail) if p not in used]
    for holes in warm:
        for stage in range(num_stages):
            if holes[stage] >= 0:
                continue
            pick = next((p for p in free if old_stage[p] == stage), None)
            if pick is None:
                pick = next((p for p in free if old_stage[p] < 0), free[0])
            free.remove(pick)
            holes[stage] = pick
    warm_mesh = np.array(warm, dtype=np.int64)

    speed = np.array([d.speed for d in avail.devices])

    def layers_for(mesh: np.ndarray) -> tuple[int, ...]:
        """The old split, or (iteration objective, speeds differ) one balanced to the mesh."""
        if config.objective != "iteration" or np.ptp(speed[mesh]) == 0:
            return old.num_layers_per_stage
        rows_t = tuple(tuple(int(x) for x in r) for r in mesh)
        return _balance_layers(avail, rows_t, config.workload.num_layers)

    def moves(mesh: np.ndarray, layers: tuple[int, ...]) -> list[int]:
        ranges = _layer_ranges(layers)
        out = []
        for row in mesh:
            for stage, p in enumerate(row):
                s = old_stage[p]
                if s < 0 or old_ranges[s] != ranges[stage]:
                    out.append(int(p))
        return out

    grid = replace(config, num_stages=num_stages, num_replicas=k)
    scored = 0

    def score(mesh: np.ndarray, layers: tuple[int, ...] | None = None) -> float:
        """Predicted seconds of a mesh over `avail`'s devices (inf if it does not fit)."""
        nonlocal scored
        scored += 1
        used_idx = sorted(int(p) for p in mesh.reshape(-1))
        local = {p: i for i, p in enumerate(used_idx)}
        sub = subset_topology(avail, used_idx)
        remapped = tuple(tuple(local[int(p)] for p in row) for row in mesh)
        try:
            return _price(sub, grid, remapped, layers or layers_for(mesh))
        except InfeasiblePlanError:  # does not fit memory: never chosen
            return float("inf")

    def exact(mesh: np.ndarray, layers: tuple[int, ...]) -> float:
        """Seconds as `price_mesh` prices the plan (inf if it does not fit)."""
        from frugal.planner.choice import price

        used_idx = sorted(int(p) for p in mesh.reshape(-1))
        local = {p: i for i, p in enumerate(used_idx)}
        sub = subset_topology(avail, used_idx)
        remapped = np.array([[local[int(p)] for p in row] for row in mesh], dtype=np.int64)
        if grid.objective == "paper":
            return score(mesh, layers)
        try:
            check_memory(sub, tuple(map(tuple, remapped.tolist())), layers, grid.workload)
        except InfeasiblePlanError:
            return float("inf")
        priced = price(sub, remapped, layers, grid.workload, balance_microbatches=True)
        return float(priced.total_s)

    # (name, mesh, layers, seconds); the warm start keeps the old split (moves nothing more)
    warm_s = score(warm_mesh, old.num_layers_per_stage)
    candidates = [("warm", warm_mesh, old.num_layers_per_stage, warm_s)]
    if layers_for(warm_mesh) != old.num_layers_per_stage:  # speeds differ: also re-balanced
        balanced = layers_for(warm_mesh)
        candidates.append(("warm-balanced", warm_mesh, balanced, score(warm_mesh, balanced)))
    # Joining devices left spare form whole pipelines that may replace the slowest kept ones
    # (a fast host joining a slow job): only the joining devices move.
    joining_free = [p for p in free if old_stage[p] < 0]
    extra = len(joining_free) // num_stages
    if extra:
        new_rows = [joining_free[r * num_stages : (r + 1) * num_stages] for r in range(extra)]
        pool = [list(row) for row in warm_mesh] + new_rows

        def slowness(row: list[int]) -> float:
            return float(np.sum(1.0 / speed[np.asarray(row)]))

        ranked = sorted(range(len(pool)), key=lambda r: (slowness(pool[r]), r))
        joined_mesh = np.array([pool[r] for r in sorted(ranked[:k])], dtype=np.int64)
        if not np.array_equal(joined_mesh, warm_mesh):
            candidates.append(
                ("warm-joined", joined_mesh, old.num_layers_per_stage,
                 score(joined_mesh, old.num_layers_per_stage))
            )  # fmt: skip

    # 2. polish: first-improvement swaps (mesh-mesh or mesh-spare), seeded
    rng = np.random.default_rng(config.seed)
    mesh, cost = warm_mesh.copy(), score(warm_mesh)
    polished: list[tuple[str, np.ndarray, tuple[int, ...], float]] = []
    spare_pool = np.array([p for p in range(n_avail) if p not in set(warm_mesh.reshape(-1))],
                          dtype=np.int64)  # fmt: skip
    slots = k * num_stages
    rejected, stall = 0, 4 * n_avail
    budget = max(1, config.budget // 2)
    while scored < budget and rejected < stall and n_avail >= 2:
        if time.perf_counter() - start >= config.time_limit_s / 2:
            break
        a = int(rng.integers(slots))
        b = int(rng.integers(slots + len(spare_pool)))
        if a == b:
            continue
        trial, trial_spare = mesh.copy(), spare_pool.copy()
        flat = trial.reshape(-1)
        if b < slots:
            flat[a], flat[b] = flat[b], flat[a]
        else:
            flat[a], trial_spare[b - slots] = trial_spare[b - slots], flat[a]
        trial_s = score(trial)
        if trial_s < cost - 1e-12:
            mesh, spare_pool, cost, rejected = trial, trial_spare, trial_s, 0
            polished = [("polished", mesh, layers_for(mesh), cost)]
        else:
            rejected += 1

    # 3. fresh searches: on the warm start's devices, and on the fastest devices if others
    candidates += polished  # the last accepted swap is the best polished state
    device_sets = {"fresh": sorted(int(p) for p in warm_mesh.reshape(-1))}
    fastest = sorted(np.argsort(-speed, kind="stable")[: k * num_stages].tolist())
    if fastest != device_sets["fresh"]:
        device_sets["fresh-fastest"] = fastest
    stop = "budget"
    for number, (name, used_idx) in enumerate(device_sets.items()):
        remaining = max(1e-3, config.time_limit_s - (time.perf_counter() - start))
        share = max(1, (config.budget - scored) // (len(device_sets) - number))
        fresh = build_plan(
            subset_topology(avail, used_idx), replace(grid, budget=share, time_limit_s=remaining)
        )
        scored += fresh.num_candidates
        stop = "time_limit" if fresh.stop_reason == "time_limit" else stop
        fresh_mesh = np.array([[used_idx[r] for r in row] for row in fresh.mesh], dtype=np.int64)
        layers = layers_for(fresh_mesh)  # as build_plan split them
        candidates.append((name, fresh_mesh, layers, score(fresh_mesh, layers)))

    # Compare the candidates as the plan will be priced (its schedule simulated if not GPipe;
    # the search above used the closed form).
    candidates = [(name, m, lay, exact(m, lay)) for name, m, lay, _ in candidates]
    best_s = min(c[3] for c in candidates)
    if not np.isfinite(best_s):
        raise InfeasiblePlanError(
            "no re-planned placement fits the devices' memory; plan afresh with more stages",
            constraint="memory",
        )
    counted = [(name, m, lay, s, len(moves(m, lay))) for name, m, lay, s in candidates]
    allowed = [c for c in counted if c[3] <= best_s * (1.0 + tolerance) + 1e-12]
    chosen_name, chosen_mesh, layers, _, _ = min(allowed, key=lambda c: (c[4], c[3]))

    # The new plan over the devices it uses: old rank order, then joining devices.
    final_idx = sorted(int(p) for p in chosen_mesh.reshape(-1))
    local = {p: i for i, p in enumerate(final_idx)}
    final_topology = subset_topology(avail, final_idx)
    final_rows = tuple(tuple(local[int(p)] for p in row) for row in chosen_mesh)
    plan = price_mesh(
        final_topology, grid, final_rows, layers, num_candidates=scored, stop_reason=stop
    )
    moved = set(moves(chosen_mesh, layers))
    in_plan = set(final_idx)
    return Replan(
        plan=plan,
        removed=removed,
        added=tuple(names[p] for p in range(len(survivors), n_avail) if p in in_plan),
        spare=tuple(names[p] for p in range(n_avail) if p not in in_plan),
        moved=tuple(names[p] for p in final_idx if p in moved),
        kept=tuple(names[p] for p in final_idx if p not in moved),
        candidates=tuple((name, n_moves, float(s)) for name, _, _, s, n_moves in counted),
        chosen=chosen_name,
        tolerance=tolerance,
        notes=notes,
    )


def _price(
    topology: Topology, config: PlannerConfig, mesh: tuple[tuple[int, ...], ...],
    layers: tuple[int, ...],
) -> float:  # fmt: skip
    """Predicted seconds of a mesh under the objective (analytic; memory checked)."""
    from frugal.planner.cost import paper_cost
    from frugal.planner.iteration import iteration_cost

    check_memory(topology, mesh, layers, config.workload)
    array = np.asarray(mesh, dtype=np.int64)
    if config.objective == "paper":
        return float(paper_cost(topology, np.ascontiguousarray(array.T)).total_s)
    return float(
        iteration_cost(topology, array, layers, config.workload, balance_microbatches=True).total_s
    )
