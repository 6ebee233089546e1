"""`python -m frugal ...` runs the `frugal` command line (same as the `frugal` script)."""

from __future__ import annotations

import sys

from frugal.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
