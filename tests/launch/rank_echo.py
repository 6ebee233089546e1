"""A torchrun target for the launcher's tests: prints its rank; rank 1 then does argv[1].

argv[1] is an exit code ("0", "3"), "raise" (a ValueError) or "segv" (SIGSEGV itself).
"""

import os
import signal
import sys

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says {sys.argv[1:]}", flush=True)
if os.environ["RANK"] == "1":
    if sys.argv[1] == "raise":
        raise ValueError("rank one refuses")
    if sys.argv[1] == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(int(sys.argv[1]))
