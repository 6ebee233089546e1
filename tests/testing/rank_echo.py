"""A torchrun target for the launcher's tests: prints its rank; rank 1 exits with argv[1]."""

import os
import sys

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says {sys.argv[1:]}")
sys.exit(int(sys.argv[1]) if os.environ["RANK"] == "1" else 0)
