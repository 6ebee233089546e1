"""`python -m frugal.launch.agent ...`: torchrun, with `--shutdown-timeout` honoured everywhere.

torch's elastic agent (2.13) stops the worker group of a failed job, and of a job it is about
to restart, with a built-in 30 s grace between SIGTERM and SIGKILL (`PContext.close()` when
it sees a rank fail, `LocalElasticAgent._shutdown()` when it stops the group): only a signal
sent to the agent itself uses `--shutdown-timeout`. A rank that
ignores SIGTERM (stopped by SIGSTOP, hung in a system call) therefore kept a failed job
alive 30 s after the rank that noticed had exited (measured: 52 s for a job whose
`comm_timeout_s` was 20). This entry point makes `--shutdown-timeout` the default grace of
those two calls too, then runs torch's own `torch.distributed.run.main` with the same
arguments.

(A restarted worker group must also rendezvous under a prefix of its attempt, or it reads the
last attempt's addresses: `frugal.launch.group.init_group`.)
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

__all__ = ["main", "shutdown_timeout_s"]

_DEFAULT_S = 30  # torch's own default


def shutdown_timeout_s(argv: Sequence[str]) -> int:
    """The `--shutdown-timeout` (or `--shutdown_timeout`) of a torchrun command line.

    Only torchrun's own options count: the scan stops at the worker (`-m MODULE` or a
    `.py` script), whose arguments are its own.

    Raises:
        ValueError: If its value is not an integer >= 0.
    """
    for i, arg in enumerate(argv):
        if arg in ("-m", "--module") or arg.endswith(".py"):
            break
        name, _, value = arg.partition("=")
        if name in ("--shutdown-timeout", "--shutdown_timeout"):
            text = value if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            if not text.isdigit():
                raise ValueError(f"--shutdown-timeout {text!r} must be an integer >= 0 seconds")
            return int(text)
    return _DEFAULT_S


def main(argv: Sequence[str] | None = None) -> None:
    """Run torchrun with `argv` (default: this process's arguments)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext
    from torch.distributed.run import main as torchrun_main

    args = list(sys.argv[1:] if argv is None else argv)
    grace = shutdown_timeout_s(args)
    LocalElasticAgent._shutdown.__defaults__ = (signal.SIGTERM, grace)
    PContext.close.__defaults__ = (None, grace)
    torchrun_main(args)


if __name__ == "__main__":
    main()
