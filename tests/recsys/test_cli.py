"""`frugal recsys train` / `bench`: bad input exits 2 with one line; a real short run."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from frugal.cli.main import build_parser, main
from frugal.cli.recsys import train_config
from frugal.recsys.config import RecsysTrainConfig


def train_config_of(args: list[str]) -> RecsysTrainConfig:
    """The config `frugal recsys train ARGS` would run."""
    return train_config(build_parser().parse_args(["recsys", "train", *args]))


def test_bad_staleness_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recsys", "train", "--staleness", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "staleness=0 must be >= 1" in err[0]
    assert err[0].startswith("frugal: error: command line: ")  # a flag, not a --set override
    assert main(["recsys", "train", "--set", "staleness=0"]) == 2
    assert "error: --set: staleness=0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags", [["--staleness", "4"], ["--set", "staleness=4"]], ids=["flag", "override"]
)
def test_staleness_with_sync_exits_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recsys", "train", "--mode", "sync", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not apply to --mode sync" in err[0]


def test_unknown_dataset_exits_2_naming_every_registered_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["recsys", "train", "--dataset", "criteo"]) == 2
    err = capsys.readouterr().err
    assert "dataset='criteo' is not a registered recsys dataset" in err
    assert "criteo_kaggle_stream, criteo_terabyte_stream" in err


def test_feature_names_must_match_the_data(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["recsys", "train", "--dataset", "adult", "--set", 'features=["age", "zip"]'])
    assert code == 2
    err = capsys.readouterr().err
    assert "features=['age', 'zip'] do not match adult's features" in err
    assert "'workclass'" in err


def test_dense_optimizer_settings_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recsys", "train", "--set", 'dense_optimizer="lamb"']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dense_optimizer = 'lamb' is not allowed" in err[0]
    assert "'sgd', 'adam', 'adamw'" in err[0]
    assert main(["recsys", "train", "--set", "dense_weight_decay=0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dense_weight_decay=0.1 applies to adam and adamw only" in err[0]
    assert "set dense_optimizer to 'adam' or 'adamw'" in err[0]


def test_bench_rejects_a_grid_without_sync(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recsys", "bench", "--quick", "--set", 'modes=["hybrid"]']) == 2
    assert "must include 'sync'" in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.slow
def test_train_command_runs_adult(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "recsys",
            "train",
            "--dataset",
            "adult",
            "--mode",
            "hybrid",
            "--staleness",
            "2",
            "--nproc",
            "2",
            "--out",
            str(tmp_path),
            "--set",
            "max_steps=40",
            "--set",
            'model="mlp"',
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["dataset"] == "adult" and printed["mode"] == "hybrid"
    assert printed["max_staleness_seen"] <= printed["staleness_bound"] == 1 + 6
    assert 0.6 < printed["test_auc"] <= 1.0
    assert (tmp_path / "result.json").exists()


def test_export_of_a_folder_that_is_no_checkpoint_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recsys", "export", str(tmp_path), "--out", str(tmp_path / "t.npz")]) == 2
    assert "has neither LATEST nor MANIFEST.json: not a checkpoint" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["recsys", "export", str(afile), "--out", str(tmp_path / "t.npz")]) == 2
    assert "is a file; give a checkpoint_dir or step-S folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("{bad", "MANIFEST.json is not valid JSON"),
        ("[1]", "MANIFEST.json: not a frugal recsys checkpoint"),
        ('{"format": "frugal-recsys-checkpoint", "files": {}, "compat": {}, "world_size": 1}',
         r"missing or malformed \['compat.embedding_dim'\]"),
        ('{"format": "frugal-recsys-checkpoint"}',
         r"missing or malformed \['files'\]"),
    ],
)  # fmt: skip
def test_export_of_a_damaged_manifest_names_the_file_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: str, message: str
) -> None:
    from frugal.recsys.checkpoint import CHECKPOINT_FORMAT

    assert CHECKPOINT_FORMAT == "frugal-recsys-checkpoint"
    (tmp_path / "ck" / "step-5").mkdir(parents=True)
    (tmp_path / "ck" / "step-5" / "MANIFEST.json").write_text(manifest)
    out = str(tmp_path / "t.npz")
    assert main(["recsys", "export", str(tmp_path / "ck" / "step-5"), "--out", out]) == 1
    err = capsys.readouterr().err
    assert "step-5/MANIFEST.json" in err
    assert re.search(message, err), err


def test_export_names_a_latest_that_points_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "LATEST").write_text("step-9\n")
    assert main(["recsys", "export", str(tmp_path / "ck"), "--out", str(tmp_path / "t.npz")]) == 1
    assert "LATEST names 'step-9', which is missing" in capsys.readouterr().err


def test_a_checkpoint_dir_that_is_a_file_exits_2_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    args = ["recsys", "train", "--set", f"checkpoint_dir='{afile}'", "--set",
            "checkpoint_every_steps=2", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(args) == 2
    assert "is a file; give a folder" in capsys.readouterr().err
    assert afile.read_text() == "keep"


def test_a_pooling_list_of_the_wrong_length_exits_2_before_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["recsys", "train", "--dataset", "adult", "--set", 'pooling=["sum", "mean"]'])
    assert code == 2
    assert "pooling has 2 modes, adult has 8 tables" in capsys.readouterr().err


def test_checkpoint_dir_misuse_exits_2_before_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.recsys.checkpoint import compat_fields
    from frugal.recsys.config import RecsysTrainConfig
    from frugal.recsys.datasets import RecsysDataConfig

    folder = tmp_path / "ck"
    (folder / "step-640").mkdir(parents=True)
    (folder / "LATEST").write_text("step-640\n")
    earlier = RecsysTrainConfig(data=RecsysDataConfig(dataset="adult"), embedding_dim=4)
    manifest = {"compat": compat_fields(earlier)}
    (folder / "step-640" / "MANIFEST.json").write_text(json.dumps(manifest))
    base = ["recsys", "train", "--dataset", "adult", "--set", f'checkpoint_dir="{folder}"']
    # a fresh run would replace the earlier run's checkpoints
    assert main([*base, "--out", str(tmp_path / "a")]) == 2
    assert "holds an earlier run's checkpoints (LATEST: step-640)" in capsys.readouterr().err
    # a resume with another embedding_dim is refused before any process starts
    assert main([*base, "--set", "resume=true", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "written with embedding_dim=4, this job has embedding_dim=8" in err
    assert not (tmp_path / "b" / "logs").exists()  # nothing was launched
    assert sorted(p.name for p in folder.iterdir()) == ["LATEST", "step-640"]  # nothing lost
    assert main(["recsys", "train", "--set", 'checkpoint_dir=""']) == 2
    assert "checkpoint_dir='' is empty" in capsys.readouterr().err


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a `recsys train` refused with exit 2 (nothing launched)."""
    assert main(["recsys", "train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("frugal: error: ")
    return err[0]


ZIPF = ["--dataset", "criteo_zipf", "--set", "data.zipf_num_samples=2000", "--set",
        "data.zipf_num_embeddings=50", "--set", "batch_size=32"]  # fmt: skip


def test_a_shard_below_one_batch_s_ids_exits_2_before_launch_naming_the_minimum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.recsys.launch import check_run

    err = _refused([*ZIPF, "--set", "ps_capacity_rows=10", "--out", str(tmp_path)], capsys)
    match = re.search(r"ps_capacity_rows=10 is below the (\d+) distinct ids one trainer", err)
    assert match is not None, err
    assert not (tmp_path / "logs").exists()  # refused before torchrun started
    needed = int(match.group(1))
    # a batch of 32 samples brings at most 8 features x 32 = 256 ids to a shard
    assert 10 < needed <= 256
    assert f"set ps_capacity_rows >= {needed}" in err
    config = train_config_of([*ZIPF, "--set", f"ps_capacity_rows={needed}"])
    check_run(config)  # the minimum named is accepted, the one below is not, evicting or not
    with pytest.raises(ValueError, match=f"ps_capacity_rows={needed - 1} is below the {needed}"):
        check_run(replace(config, ps_capacity_rows=needed - 1, ps_when_full="evict_lru"))


def test_max_batch_rows_is_the_largest_push_of_a_batch_to_one_shard() -> None:
    from frugal.recsys.batch import RecsysData
    from frugal.recsys.launch import max_batch_rows
    from frugal.recsys.ps import default_owners, virtual_shard

    ids = np.array([[1], [4], [1], [4]])  # feature b: one id per sample, 2 distinct
    bags = {"a": (np.array([1, 2, 3, 5, 1, 4], np.int64), np.array([0, 3, 3, 4, 6], np.int64))}
    data = RecsysData.from_columns(
        ("b",), (10, 10), ids, np.zeros((4, 1), np.float32), np.zeros(4, np.float32), bags
    )
    assert data.keys == ("b", "a")
    # One trainer, one batch of all 4 samples: b's ids {1, 4} and a's bags [1, 2, 3], [],
    # [5], [1, 4]: ids {1, 2, 3, 4, 5}, all to the one shard.
    one = RecsysTrainConfig(batch_size=4, nproc=1)
    assert max_batch_rows(data, one) == 2 + 5
    # Two trainers of 2 samples each over 2 shards: at most each shard's share of 7 rows
    two = RecsysTrainConfig(batch_size=2, nproc=2)
    owner = default_owners(2)
    shard0 = sum(int((owner[virtual_shard(t, np.array(v))] == 0).sum())
                 for t, v in enumerate([[1, 4], [1, 2, 3, 4, 5]]))  # fmt: skip
    assert 1 <= max_batch_rows(data, two) <= max(shard0, 7 - shard0)


def test_a_stream_shorter_than_one_step_exits_2_before_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from frugal.recsys.launch import check_run

    stream = ["--dataset", "criteo_kaggle_stream", "--set", "data.stream_scale=0.001",
              "--set", "data.stream_test_samples=100"]  # fmt: skip
    err = _refused([*stream, "--set", "data.stream_num_samples=255"], capsys)
    # one step of the default batch_size 128 on nproc 2 trainers takes 256 samples
    assert "has 255 samples (data.stream_num_samples=255), fewer than one step of " in err
    assert "batch_size=128 x nproc=2 = 256 samples; set data.stream_num_samples >= 256" in err
    check_run(train_config_of([*stream, "--set", "data.stream_num_samples=256"]))
    # a cut split names its cut
    err = _refused([*ZIPF, "--nproc", "4", "--set", "data.max_train_samples=100"], capsys)
    assert "has 100 samples (data.max_train_samples=100)" in err
    assert "32 x nproc=4 = 128 samples; set data.max_train_samples >= 128" in err


def test_a_ps_memory_budget_below_the_store_s_minimum_exits_2_before_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from frugal.recsys.launch import check_run

    wide = [*ZIPF, "--set", 'store_backend="file"', "--set", "embedding_dim=512"]
    err = _refused([*wide, "--set", "ps_memory_ratio=0.05"], capsys)
    assert "ps_memory_ratio=0.05 gives" in err and "each PS shard's store needs" in err
    match = re.search(
        r"set ps_memory_ratio >= ([0-9.]+) or ps_memory_budget_bytes >= ([0-9,]+)", err
    )
    assert match is not None, err
    ratio, minimum = float(match.group(1)), int(match.group(2).replace(",", ""))
    assert ratio > 0.05
    check_run(train_config_of([*wide, "--set", f"ps_memory_ratio={ratio}"]))  # accepted
    check_run(train_config_of([*wide, "--set", f"ps_memory_budget_bytes={minimum}"]))
    err = _refused([*wide, "--set", f"ps_memory_budget_bytes={minimum - 1}"], capsys)
    assert f"ps_memory_budget_bytes={minimum - 1:,} is below the {minimum:,} bytes" in err


def test_a_ps_budget_whose_cache_cannot_hold_one_batch_is_refused_before_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A lookup reads one batch's rows of a shard into its cache at once: a budget over the
    # store's 64-row minimum but under that stops training with CacheTooSmallError.
    from frugal.recsys.launch import _split_facts, check_run
    from frugal.recsys.ps import shard_capacity
    from frugal.store import EmbeddingStore, RowSpec

    args = [*ZIPF, "--set", 'store_backend="file"', "--set", "batch_size=256",
            "--set", "embedding_dim=512"]  # fmt: skip
    config = train_config_of(args)
    facts = _split_facts(config.data, 256, config.nproc, config.seed, config.max_steps)
    assert facts.batch_rows is not None and facts.batch_rows > 64
    capacity = shard_capacity(facts.num_embeddings, config.nproc)
    shape = {
        "num_rows": capacity,
        "spec": RowSpec(embedding_dim=config.embedding_dim, optimizer=config.embedding_optimizer),
        "config": EmbeddingStore.Config(backend="file", staleness_bound=None, use_direct_io=True),
        "key_space": "hashed",
    }
    floor = EmbeddingStore.minimum_budget_bytes(**shape)  # type: ignore[arg-type]
    assert EmbeddingStore.cached_rows_for_budget(floor, **shape) < facts.batch_rows  # type: ignore[arg-type]
    err = _refused([*args, "--set", f"ps_memory_budget_bytes={floor}"], capsys)
    assert f"a cache of the {facts.batch_rows:,} rows one trainer's batch reads" in err
    match = re.search(r"set ps_memory_budget_bytes >= ([0-9,]+)", err)
    assert match is not None, err
    minimum = int(match.group(1).replace(",", ""))
    cached = EmbeddingStore.cached_rows_for_budget
    assert cached(minimum, **shape) >= facts.batch_rows > cached(minimum - 1, **shape)  # type: ignore[arg-type]
    check_run(train_config_of([*args, "--set", f"ps_memory_budget_bytes={minimum}"]))


def test_a_checkpoint_dir_in_use_by_another_job_is_refused(tmp_path: Path) -> None:
    import fcntl
    import os

    from frugal.config import ConfigError
    from frugal.recsys.launch import CHECKPOINT_LOCK, launch_training

    folder = tmp_path / "ckpt"
    folder.mkdir()
    fd = os.open(folder / CHECKPOINT_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running job's launcher holds it
    os.pwrite(fd, b"4242", 0)
    config = train_config_of([*ZIPF, "--set", f'checkpoint_dir="{folder}"'])
    try:
        with pytest.raises(ConfigError, match=r"is in use by another training job \(process 4242"):
            launch_training(config, tmp_path / "out")
        assert not (tmp_path / "out").exists()  # refused before anything was written
    finally:
        os.close(fd)
