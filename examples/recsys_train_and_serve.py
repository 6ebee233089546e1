"""Train a recommender with torchrun, export its checkpoints and serve them (`frugal.recsys`).

The three steps `frugal recsys train`, `frugal recsys export` and `Snapshot` take:

1. `launch_training` starts `--nproc` trainer processes under torchrun (what `frugal recsys
   train` runs), each a gloo rank of the dense AllReduce and one parameter-server shard, on a
   Criteo-shaped click stream (`criteo_kaggle_stream`, generated as read: no download). The
   run writes a checkpoint every `--checkpoint-every` steps: a full one, then incremental ones
   (only the rows changed since the one before).
2. `export_tables` (`frugal recsys export`) writes the trained rows as (ids, vectors) per
   table: in full, and with `since=` (`--incremental-since`) only what changed since an
   earlier checkpoint of the chain. Applying the incremental export to the earlier full one
   gives the latest full one.
3. `Snapshot.open` serves the newest checkpoint read-only: `lookup` returns the rows the
   export read from the checkpoint (and the seeded initial value for ids never trained), and
   `predict` the click probabilities of the trained model, whose AUC on the test split is
   the trainer's own `test_auc`.

    python examples/recsys_train_and_serve.py                 # 2 trainers, 40 steps
    python examples/recsys_train_and_serve.py --mode sync --nproc 4
    python examples/recsys_train_and_serve.py --tiny          # what the test runs
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from frugal.recsys import RecsysDataConfig, RecsysTrainConfig, Snapshot, launch_training
from frugal.recsys.checkpoint import export_tables
from frugal.recsys.datasets import load_recsys_data
from frugal.recsys.metrics import roc_auc


def _read_export(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """Every array of an export `.npz` but its `meta`."""
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files if name != "meta"}


def _apply(
    earlier: dict[str, np.ndarray[Any, Any]],
    changes: dict[str, np.ndarray[Any, Any]],
    num_tables: int,
) -> dict[str, np.ndarray[Any, Any]]:
    """An incremental export applied to an earlier full one.

    Drop the deleted and the changed ids, then add the changed rows (sorted by id, as a full
    export lists them).
    """
    out = {}
    for t in range(num_tables):
        ids, vectors = earlier[f"ids{t}"], earlier[f"vectors{t}"]
        gone = np.concatenate([changes[f"deleted{t}"], changes[f"ids{t}"]])
        keep = ~np.isin(ids, gone)
        ids = np.concatenate([ids[keep], changes[f"ids{t}"]])
        vectors = np.concatenate([vectors[keep], changes[f"vectors{t}"]])
        order = np.argsort(ids, kind="stable")
        out[f"ids{t}"], out[f"vectors{t}"] = ids[order], vectors[order]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the example; return what it checked and printed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tiny_env = os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    parser.add_argument("--tiny", action="store_true", default=tiny_env)
    parser.add_argument("--mode", default="hybrid", choices=("sync", "hybrid", "async"))
    parser.add_argument("--nproc", type=int, default=None, help="trainers (tiny: 1, else 2)")
    parser.add_argument("--checkpoint-every", type=int, default=None, help="steps (tiny: 2)")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the run's files")
    args = parser.parse_args(argv)
    nproc = args.nproc or (1 if args.tiny else 2)
    steps = 8 if args.tiny else 40
    every = args.checkpoint_every or (2 if args.tiny else 10)
    batch_size = 64 if args.tiny else 128
    data = RecsysDataConfig(
        dataset="criteo_kaggle_stream",
        stream_num_samples=steps * batch_size * nproc,
        stream_test_samples=512 if args.tiny else 4096,
        stream_scale=0.001 if args.tiny else 0.01,  # 0.1 % of Criteo's 33.76M ids: 38k ids
    )
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(tempfile.mkdtemp(prefix="recsys-", dir=args.dir or scratch))
        checkpoints = root / "checkpoints"
        config = RecsysTrainConfig(
            data=data, mode=args.mode, nproc=nproc, batch_size=batch_size, model="mlp",
            hidden=(16,), max_steps=steps, warmup_steps=0, checkpoint_dir=str(checkpoints),
            checkpoint_every_steps=every, checkpoint_full_every=4,
        )  # fmt: skip
        # 1. Train: what `frugal recsys train --dataset criteo_kaggle_stream --set ...` runs.
        result = launch_training(config, root / "run", timeout_s=300.0)
        folders = sorted(
            (p for p in checkpoints.glob("step-*") if (p / "MANIFEST.json").is_file()),
            key=lambda p: int(p.name.removeprefix("step-")),
        )
        first, latest = folders[0], checkpoints / (checkpoints / "LATEST").read_text().strip()
        # 2. Export: `frugal recsys export CHECKPOINT --out FILE [--incremental-since STEP]`.
        counts = export_tables(latest, root / "latest.npz")
        export_tables(first, root / "first.npz")
        changed = export_tables(latest, root / "changes.npz", since=first)
        num_tables = len(counts)
        full, changes = _read_export(root / "latest.npz"), _read_export(root / "changes.npz")
        patched = _apply(_read_export(root / "first.npz"), changes, num_tables)
        incremental_ok = all(np.array_equal(patched[k], full[k]) for k in full)
        # 3. Serve: lookups equal the checkpoint's rows; predict equals the trainer's scores.
        snapshot = Snapshot.open(checkpoints)
        lookups_ok = all(
            np.array_equal(snapshot.lookup(t, full[f"ids{t}"]), full[f"vectors{t}"])
            for t in range(num_tables)
        )
        test = load_recsys_data(config.data)[1]
        probabilities = snapshot.predict(test.batch(np.arange(test.num_samples), batch_id=-1))
        untrained = snapshot.lookup(0, [int(full["ids0"].max()) + 1])  # never seen: initial
    out = {
        "checkpoints": [p.name for p in folders],
        "rows": sum(counts.values()),
        "changed_rows": sum(v for k, v in changed.items() if k.startswith("table")),
        "num_tables": num_tables,
        "incremental_applies": incremental_ok,
        "lookups_equal_checkpoint": lookups_ok,
        "untrained_row_norm": float(np.linalg.norm(untrained)),
        "probabilities": probabilities,
        "served_test_auc": roc_auc(test.labels, probabilities),
        "test_auc": result["test_auc"],
        "embedding_dim": snapshot.embedding_dim,
    }
    print(
        f"{args.mode} x {nproc} on {data.dataset}: checkpoints {', '.join(out['checkpoints'])}; "
        f"exported {out['rows']:,} rows over {num_tables} tables ({out['changed_rows']:,} "
        f"changed since {first.name}); served lookups equal the checkpoint's: {lookups_ok}; "
        f"served AUC {out['served_test_auc']:.4f}, trainer's {out['test_auc']:.4f}"
    )
    return out


if __name__ == "__main__":
    main()
