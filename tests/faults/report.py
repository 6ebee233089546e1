"""Render the faults tier's JSONL record as `benchmarks/faults/RESULTS.md`.

Usage: `python -m tests.faults.report RECORD.jsonl OUT.md` (what `make faults` runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def render(lines: list[dict[str, str]], commit: str = "") -> str:
    by_command: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in lines:
        by_command[line["command"]].append(line)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    kinds = {
        "SIGKILL": sum("SIGKILL" in f["fault"] for f in lines),
        "SIGINT / SIGTERM": sum(
            ("SIGINT" in f["fault"]) or ("SIGTERM" in f["fault"]) for f in lines
        ),
        "full disk": sum(("tmpfs" in f["fault"]) or ("disk full" in f["fault"]) for f in lines),
    }
    out = [
        "# Faults tier",
        "",
        f"`make faults`, {stamp}, commit {commit or _commit()}: every fault below was injected",
        "into a real process tree and survived (a fault that is not survived fails the tier and",
        "is not listed; tests skipped on this machine are not listed either).",
        "",
        f"**{len(lines)} faults survived over {len(by_command)} commands**: "
        + ", ".join(f"{count} {kind}" for kind, count in kinds.items())
        + ".",
        "",
        "| command | faults survived | fault | outcome |",
        "| --- | --- | --- | --- |",
    ]
    for command, faults in by_command.items():
        for index, fault in enumerate(faults):
            count = str(len(faults)) if index == 0 else ""
            out.append(f"| {command if index == 0 else ''} | {count} | {fault['fault']} | "
                       f"{fault['outcome']} |")  # fmt: skip
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    record, target = Path(argv[0]), Path(argv[1])
    lines = [json.loads(text) for text in record.read_text().splitlines() if text.strip()]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(lines))
    print(f"wrote {target} ({len(lines)} faults)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
