"""`report.md` of `frugal reproduce`: verdict table, environment, one section per part."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.reproduce.parts import Verdict, get_part

if TYPE_CHECKING:
    from frugal.reproduce.run import PartOutcome

__all__ = ["cpu_model", "verdict_table", "write_report"]

_MODE_TEXT = {
    "smoke": "tiny settings for CI: the numbers say nothing about performance",
    "quick": "small presets, about 13 minutes on 2 cores: indicative numbers",
    "full": "the real benchmark of every subsystem",
}


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def _verdict_word(verdict: Verdict) -> str:
    met = verdict.met
    if met is None:
        return "not measured"
    return "**met**" if met else "**not met**"


def verdict_table(verdicts: list[Verdict], with_part: bool = True) -> list[str]:
    """Markdown lines of a verdict table (claim, ours, baseline, measured, target, verdict)."""
    head = ["claim", "ours", "baseline", "measured", "target", "verdict"]
    if with_part:
        head.insert(0, "part")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for v in verdicts:
        baseline = (
            "-" if v.baseline_name is None else f"{v.baseline_name}: {_number(v.baseline, v.unit)}"
        )
        cells = [
            v.claim,
            _number(v.ours, v.unit),
            baseline,
            _number(v.value, v.value_unit),
            f"{v.comparison} {_number(v.target, v.value_unit)}",
            _verdict_word(v),
        ]
        if with_part:
            cells.insert(0, v.part)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def _short_summary(summary: dict[str, Any]) -> str:
    """The bench's summary as indented JSON, long lists cut to keep the report readable."""

    def cut(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value[:8]] + (["..."] if len(value) > 8 else [])
        if isinstance(value, float):
            return float(f"{value:.4g}")
        return value

    return json.dumps(cut(summary), indent=1)


def write_report(path: Path, document: dict[str, Any], outcomes: list[PartOutcome]) -> None:
    """Write the report of a reproduce run to `path` (markdown; figures sit beside it).

    Raises:
        OSError: If the file cannot be written.
    """
    mode = document["config"]["mode"]
    commit = document.get("git_commit") or "unknown (not a git checkout)"
    verdicts = [v for o in outcomes for v in o.verdicts]
    met = sum(v.met is True for v in verdicts)
    not_met = sum(v.met is False for v in verdicts)
    unmeasured = sum(v.met is None for v in verdicts)
    failed = [o.name for o in outcomes if o.status == "failed"]
    lines = [
        f"# frugal reproduce ({mode})",
        "",
        f"{document['created']} · frugal {document['frugal_version']} · commit `{commit}` · "
        f"mode `{mode}`: {_MODE_TEXT[mode]}.",
        "",
        "## Verdicts",
        "",
        *verdict_table(verdicts),
        "",
        f"**{met} of {len(verdicts)} claims met**, {not_met} not met, {unmeasured} not measured"
        + (f"; failed parts: {', '.join(failed)}." if failed else "; every part ran."),
        "",
        "## Environment",
        "",
        "| | |",
        "| --- | --- |",
        f"| CPU | {cpu_model()} |",
    ]
    for key, value in document["env"].items():
        lines.append(f"| {key} | {value} |")
    lines.append("")
    for outcome in outcomes:
        part = get_part(outcome.name)
        lines += [
            f"## {outcome.name}: {part.title}",
            "",
            f"Paper: {part.paper}.  ",
            f"Published claim: {part.published}.  ",
            f"Status: {outcome.status} in {outcome.wall_s:.0f} s"
            + (" (measured by an earlier run of this commit, reused)" if outcome.resumed else "")
            + (f"; rows in `parts/{outcome.name}/results.json`." if outcome.error is None else "."),
            "",
        ]
        if outcome.error is not None:
            lines += [
                "**This part failed:**",
                "",
                "```",
                outcome.error,
                "```",
                "",
                f"(traceback in `parts/{outcome.name}/error.txt`)",
                "",
            ]
            continue
        if outcome.verdicts:
            lines += [*verdict_table(list(outcome.verdicts), with_part=False), ""]
        if outcome.figure is not None:
            lines += [f"![{outcome.name}]({outcome.figure})", ""]
        if outcome.document is not None:
            lines += [
                "<details><summary>bench summary</summary>",
                "",
                "```json",
                _short_summary(outcome.document["summary"]),
                "```",
                "",
                "</details>",
                "",
            ]
    path.write_text("\n".join(lines))
