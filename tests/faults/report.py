"""Render the faults tier's JSONL record as `benchmarks/faults/RESULTS.md`.

Usage: `python -m tests.faults.report RECORD.jsonl OUT.md` (what `make faults` runs).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path


def render(lines: list[dict[str, str]]) -> str:
    by_command: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in lines:
        by_command[line["command"]].append(line)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Faults tier",
        "",
        f"`make faults`, {stamp}: every fault below was injected into a real process tree and",
        "survived (a fault that is not survived fails the tier and is not listed).",
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
