"""Child of the disk-full test: writes until the file-size limit (RLIMIT_FSIZE) stops it.

Usage: python fsize_child.py STORE_DIR LIMIT_BYTES. Prints "error: <message>" for the first
error the store raises after the limit is hit, then "reread: ok" if the store still serves
reads of checkpointed rows, and exits 0.
"""

from __future__ import annotations

import resource
import signal
import sys
from pathlib import Path

import numpy as np

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

SPEC = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="sgd"))


def main() -> None:
    directory, limit = Path(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of dying
    store = EmbeddingStore.open(directory, EmbeddingStore.Config(memory_budget_bytes=1 << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    ids = np.arange(2000)
    try:
        for value in range(1, 1000):
            store.put(ids, np.full((2000, 8), float(value), np.float32))
            store.flush()
    except Exception as exc:  # the error a user would see
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
    store.close(checkpoint=False)


if __name__ == "__main__":
    main()
