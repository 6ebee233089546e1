"""Entry point of one torchrun process: `python -m frugal.pipeline.worker JOB.json OUT_DIR`.

A failure prints one line naming the rank and the cause (`frugal: rank R: ...`) on stderr
and exits 1, so torchrun stops the other ranks and the launcher reports it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from frugal import FrugalError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the job file's runs on this rank; 0 on success, 1 on a pipeline failure."""
    from frugal.pipeline.train import config_from_job, run_worker

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m frugal.pipeline.worker JOB.json OUT_DIR", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "?")
    try:
        config, runs = config_from_job(Path(args[0]))
        run_worker(config, runs, Path(args[1]))
    except (FrugalError, ValueError) as exc:
        print(f"frugal: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
