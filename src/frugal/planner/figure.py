"""Draw a plan: devices grouped by site, one line per pipeline, stage numbers on devices."""

from __future__ import annotations

from pathlib import Path

from frugal.planner.plan import Plan

__all__ = ["draw_plan"]


def draw_plan(plan: Plan, path: Path) -> None:
    """Write a PNG of `plan`.

    x = site, y = device within the site; pipeline j is a polyline through its stages in
    order, and each device shows its stage number (its DP group).

    Raises:
        OSError: If the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sites: list[str] = []
    for _, _, site in plan.devices:
        if site not in sites:
            sites.append(site)
    slot_in_site: dict[int, int] = {}
    seen: dict[str, int] = {}
    for rank, (_, _, site) in enumerate(plan.devices):
        slot_in_site[rank] = seen.get(site, 0)
        seen[site] = slot_in_site[rank] + 1
    x = {r: sites.index(plan.devices[r][2]) for r in range(plan.world_size)}
    y = slot_in_site
    width = max(6.0, 1.1 * len(sites))
    height = max(3.0, 0.35 * max(seen.values()))
    fig, ax = plt.subplots(figsize=(width, height))
    cmap = plt.get_cmap("tab20")
    for j, row in enumerate(plan.mesh):
        jitter = (j / max(1, plan.num_replicas - 1) - 0.5) * 0.3
        xs = [x[r] + jitter for r in row]
        ys = [y[r] for r in row]
        ax.plot(xs, ys, "-", color=cmap(j % 20), linewidth=1.2, alpha=0.8, label=f"pipeline {j}")
        for stage, rank in enumerate(row):
            ax.annotate(str(stage), (x[rank] + jitter, y[rank]), fontsize=6, ha="center",
                        va="center", color="black")  # fmt: skip
    ax.set_xticks(range(len(sites)), sites, rotation=30, fontsize=8)
    ax.set_ylabel("device within site")
    ax.set_title(
        f"{plan.cluster}: {plan.num_replicas} pipelines x {plan.num_stages} stages, "
        f"{plan.objective} {plan.predicted_cost_s:.2f} s ({plan.method})",
        fontsize=9,
    )
    if plan.num_replicas <= 16:
        ax.legend(fontsize=6, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
