"""The one torchrun launcher every multi-process job in frugal uses.

`run_torchrun(TorchrunJob(...))` runs a worker module as N processes (c10d rendezvous on
127.0.0.1, or a shared endpoint for several machines), keeps each rank's output in its own
log, streams lines to a callback, enforces a wall-clock limit and reports failures by rank.
`process` holds the lower-level helpers (free ports, launch markers, killing a whole job);
`guards` the checks a job passes before it starts (process count, memory).
"""

from frugal.launch.guards import (
    FORCE_ENV,
    MemoryEstimate,
    MemoryWarning,
    OversubscriptionWarning,
    check_job,
    check_memory,
    check_process_count,
    machine_memory_bytes,
    usable_cores,
)
from frugal.launch.process import (
    EXCEPTION_LINE,
    LAUNCH_ENV,
    exception_lines,
    free_port,
    kill_launch,
    launch_marker,
)
from frugal.launch.torchrun import (
    LaunchResult,
    RankFailure,
    TorchrunJob,
    run_torchrun,
    torchrun_command,
)

__all__ = [
    "EXCEPTION_LINE",
    "FORCE_ENV",
    "LAUNCH_ENV",
    "LaunchResult",
    "MemoryEstimate",
    "MemoryWarning",
    "OversubscriptionWarning",
    "RankFailure",
    "TorchrunJob",
    "check_job",
    "check_memory",
    "check_process_count",
    "exception_lines",
    "free_port",
    "kill_launch",
    "launch_marker",
    "machine_memory_bytes",
    "run_torchrun",
    "torchrun_command",
    "usable_cores",
]
