"""Entry point of one torchrun process: `python -m frugal.pipeline.worker JOB.json OUT_DIR`.

A failure prints one line naming the rank and the cause (`frugal: rank R: ...`) on stderr
and exits 1, so torchrun stops the other ranks and the launcher reports it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from frugal import FrugalError

if TYPE_CHECKING:
    from frugal.pipeline.train import PipelineTrainConfig, RunSpec

__all__ = ["main", "run_job_file"]


def run_job_file(
    argv: list[str] | None,
    *,
    module: str,
    body: Callable[[PipelineTrainConfig, Sequence[RunSpec], Path], None],
    errors: tuple[type[Exception], ...] = (FrugalError, ValueError),
) -> int:
    """Parse `JOB.json OUT_DIR`, run `body` on this rank and turn a failure into exit code 1.

    Args:
        argv: The arguments after the module name (None = `sys.argv[1:]`).
        module: The `python -m` module named in the usage line.
        body: Runs the job file's config and runs on this rank, writing into OUT_DIR.
        errors: The exceptions reported as one line `frugal: rank R: Type: message` on stderr.

    Returns:
        0 on success, 1 on one of `errors`, 2 on a wrong number of arguments.
    """
    from frugal.pipeline.train import config_from_job

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {module} JOB.json OUT_DIR", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "?")
    try:
        config, runs = config_from_job(Path(args[0]))
        body(config, runs, Path(args[1]))
    except errors as exc:
        print(f"frugal: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the job file's runs on this rank; 0 on success, 1 on a pipeline failure."""
    from frugal.pipeline.train import run_worker

    return run_job_file(argv, module="frugal.pipeline.worker", body=run_worker)


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: its C++ destructors (gloo's threads) abort a
    # finished rank now and then ("terminate called without an active exception", SIGABRT
    # after every result was written). Everything this rank wrote is closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
