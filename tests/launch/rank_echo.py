"""A torchrun target for the launcher's tests: prints its rank; rank 1 then does argv[1].

argv[1] is an exit code ("0", "3"), "raise" (a ValueError), "segv" (SIGSEGV itself) or
"stop" (rank 1 stops itself with SIGSTOP; rank 0 exits 1 a second later, as a rank does
that times out waiting for a stopped peer).
"""

import os
import signal
import sys
import time

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says {sys.argv[1:]}", flush=True)
if sys.argv[1] == "stop":
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(1)
    sys.exit(1)
if os.environ["RANK"] == "1":
    if sys.argv[1] == "raise":
        raise ValueError("rank one refuses")
    if sys.argv[1] == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(int(sys.argv[1]))
