"""Bytes on disk and random-read rows/s of the `file` backend for D=16 Adam rows (196 B).

Usage: python benchmarks/store/dense_rows.py [--rows N] [--dir FOLDER]. Writes every row
once, checkpoints, then reads random sorted batches of ids straight from the backend (O_DIRECT,
no cache in between) and prints one JSON line: log bytes (size and allocated), bytes per row,
and the median rows/s of random reads at two batch sizes (11 repeats after 1 warm-up each).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec


def main() -> None:
    """Write, checkpoint and read a D=16 Adam table; print the measurements as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(dir=args.dir)) / "store"
    spec = RowSpec(embedding_dim=16, optimizer=OptimizerConfig(kind="adam"))
    config = EmbeddingStore.Config(memory_budget_bytes=64 << 20)
    rng = np.random.default_rng(0)
    result: dict[str, object] = {"num_rows": args.rows, "row_bytes": spec.row_bytes}
    try:
        with EmbeddingStore.create(folder, num_rows=args.rows, spec=spec, config=config) as store:
            chunk = 50_000
            start = time.perf_counter()
            for first in range(0, args.rows, chunk):
                ids = np.arange(first, min(args.rows, first + chunk))
                store.put(ids, rng.standard_normal((len(ids), spec.width)).astype(np.float32))
            store.flush()
            result["write_rows_per_s"] = round(args.rows / (time.perf_counter() - start))
            store.checkpoint()
            logs = list(folder.glob("log.*.dat"))
            size = sum(p.stat().st_size for p in logs)
            allocated = sum(p.stat().st_blocks * 512 for p in logs)
            result |= {
                "log_bytes": size,
                "log_allocated_bytes": allocated,
                "disk_bytes_per_row": round(allocated / args.rows, 1),
                "direct_io": store.backend.direct_io,
            }
            backend = store.backend
            for batch in (1024, 16384):
                out = np.empty((batch, spec.width), dtype=np.float32)
                rates = []
                for repeat in range(12):
                    ids = np.sort(rng.choice(args.rows, batch, replace=False)).astype(np.int64)
                    begin = time.perf_counter()
                    backend.read_rows(ids, out)
                    elapsed = time.perf_counter() - begin
                    if repeat:  # the first is a warm-up
                        rates.append(batch / elapsed)
                result[f"random_read_rows_per_s_batch{batch}"] = round(statistics.median(rates))
            store.close(checkpoint=False)
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
