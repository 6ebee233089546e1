"""Trainers under torchrun on loopback (gloo + torch.distributed.rpc), MovieLens-100k."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from frugal.cli.main import main
from frugal.config import ConfigError, config_to_dict
from frugal.launch import TorchrunJob, run_torchrun
from frugal.recsys.checkpoint import read_chain
from frugal.recsys.config import RecsysTrainConfig, staleness_bound
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data
from frugal.recsys.launch import _check_checkpoint_dir
from frugal.recsys.metrics import log_loss, roc_auc
from frugal.recsys.models import build_model
from frugal.recsys.ps import table_keys
from frugal.recsys.serving import Snapshot
from frugal.store import RowSpec, init_rows


def _config(**fields: Any) -> RecsysTrainConfig:
    base: dict[str, Any] = {
        "data": RecsysDataConfig(dataset="movielens100k"),
        "nproc": 2,
        "max_steps": 60,
        "batch_size": 256,
        "timeout_s": 60.0,
    }
    return RecsysTrainConfig(**(base | fields))


def _run(tmp_path: Path, runs: list[tuple[RecsysTrainConfig, str]], nproc: int = 2) -> list[dict]:
    """One torchrun job running `runs` in turn; returns each run's result.json."""
    job = {"runs": [{"config": config_to_dict(c), "out_dir": str(tmp_path / n)} for c, n in runs]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    restarts = str(max(c.max_restarts for c, _ in runs))
    job_spec = TorchrunJob(
        ["frugal.recsys.trainer", str(tmp_path / "job.json")],
        nproc=nproc,
        timeout_s=240,
        max_restarts=int(restarts),
        log_dir=tmp_path / "logs",
    )
    result = run_torchrun(job_spec)
    assert result.ok, result.format()
    return [json.loads((tmp_path / n / "result.json").read_text()) for _, n in runs]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)  # three runs; slow starts when other jobs load the machine
def test_sync_and_hybrid_train_and_ranks_agree(tmp_path: Path) -> None:
    runs = [
        (_config(mode="sync", staleness=1), "sync"),
        (_config(mode="hybrid", staleness=4, rtt_ms=2.0), "hybrid"),
        (_config(mode="sync", staleness=1, rtt_ms=1.0), "sync-again"),
    ]
    results = _run(tmp_path, runs)
    # sync with 2 trainers is bit-reproducible: shards apply a step's pushes in rank order
    sync, again = results[0], results[2]
    assert sync["ranks"][0]["dense_params_sha256"] == again["ranks"][0]["dense_params_sha256"]
    assert sync["test_auc"] == again["test_auc"]
    assert sync["staleness_hist"] == again["staleness_hist"]
    for (config, _), result in zip(runs, results, strict=True):
        assert result["steps"] == 60
        # the loss goes down (mean of the last fifth of the steps vs the first fifth)
        assert result["train_loss_last"] < result["train_loss_first"] - 0.01
        # AllReduce every step: both ranks end with bit-identical dense parameters
        ranks = result["ranks"]
        assert len(ranks) == 2
        assert ranks[0]["dense_params_sha256"] == ranks[1]["dense_params_sha256"]
        # measured staleness within the mode's bound; every row update was logged
        bound = staleness_bound(config.mode, config.staleness, 2)
        assert result["staleness_bound"] == bound
        assert result["max_staleness_seen"] <= bound
        assert sum(result["staleness_hist"]) > 0
        assert 0.55 < result["test_auc"] < 0.9


def _rows(folder: Path) -> dict[tuple[int, int], np.ndarray]:
    """(table, id) -> row (vector + optimizer state, version, last push) at checkpoint `folder`.

    Replays its chain by hand: the full checkpoint's shard files, then each delta's (its
    deleted ids go, its rows replace).
    """
    rows: dict[tuple[int, int], np.ndarray] = {}
    for checkpoint, manifest in read_chain(folder):
        files = sorted(checkpoint.glob("shard*.npz"))
        assert len(files) == manifest["world_size"]
        for path in files:
            with np.load(path) as data:
                t = 0
                while f"ids{t}" in data:
                    for i in data.get(f"deleted{t}", []):
                        rows.pop((t, int(i)), None)  # (an id may be new since the base)
                    for i, row, version, last in zip(
                        data[f"ids{t}"], data[f"rows{t}"], data[f"versions{t}"],
                        data[f"last_push{t}"], strict=True,
                    ):  # fmt: skip
                        rows[(t, int(i))] = np.append(row, [version, last])
                    t += 1
    return rows


def _dense(folder: Path) -> dict[str, Any]:
    """A checkpoint's dense model and optimizer state."""
    dense: dict[str, Any] = torch.load(folder / "dense.pt", weights_only=True)
    return dense


def _assert_same_dense(a: Path, b: Path) -> None:
    """Two checkpoints hold bit-identical dense parameters and optimizer states."""
    first, second = _dense(a), _dense(b)
    assert first["model"].keys() == second["model"].keys()
    for key, value in first["model"].items():
        torch.testing.assert_close(second["model"][key], value, rtol=0, atol=0)
    assert first["optimizer"]["param_groups"] == second["optimizer"]["param_groups"]
    assert first["optimizer"]["state"].keys() == second["optimizer"]["state"].keys()
    for index, state in first["optimizer"]["state"].items():
        assert state.keys() == second["optimizer"]["state"][index].keys()
        for key, value in state.items():
            torch.testing.assert_close(
                second["optimizer"]["state"][index][key], value, rtol=0, atol=0
            )


def _final(checkpoints: Path) -> Path:
    return checkpoints / (checkpoints / "LATEST").read_text().strip()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)  # a torchrun restart and a second job; slow under load
def test_killed_rank_resumes_and_loads_onto_one_shard(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    adam: dict[str, Any] = {"dense_optimizer": "adam", "dense_lr": 2e-3}
    config = _config(
        mode="hybrid",
        staleness=4,
        max_steps=40,
        checkpoint_dir=str(checkpoints),
        checkpoint_every_steps=10,
        max_restarts=1,
        fail_at_step=25,  # rank 1 is SIGKILLed at step 25; torchrun restarts both
        **adam,
    )
    (result,) = _run(tmp_path, [(config, "killed")])
    # resumed from the step-20 checkpoint; every sample of the job consumed exactly once
    assert result["resumed_from_samples"] == 20 * 256 * 2
    assert result["steps"] == 20
    assert result["samples_done"] == result["total_samples"] == 40 * 256 * 2
    assert result["max_staleness_seen"] <= result["staleness_bound"]
    final = checkpoints / f"step-{40 * 256 * 2}"
    assert (checkpoints / "LATEST").read_text().strip() == final.name
    saved = _rows(final)
    shutil.copytree(final, tmp_path / "at-w2")
    # resume the finished job on one process: nothing left to train, the tables move to
    # one shard and its final checkpoint holds exactly the same rows
    one = _config(
        mode="hybrid", staleness=4, max_steps=40, nproc=1, checkpoint_dir=str(checkpoints),
        resume=True, **adam,
    )  # fmt: skip
    (again,) = _run(tmp_path, [(one, "one")], nproc=1)
    assert again["steps"] == 0 and again["resumed_from_samples"] == 40 * 256 * 2
    moved = _rows(final)
    assert len(list(final.glob("shard*.npz"))) == 1
    assert moved.keys() == saved.keys()
    for key, row in saved.items():
        np.testing.assert_array_equal(moved[key], row)
    assert abs(again["test_auc"] - result["test_auc"]) < 1e-6  # same model, same tables
    # and the same Adam state (moments and step count), loaded and written again
    _assert_same_dense(tmp_path / "at-w2", final)
    assert float(_dense(final)["optimizer"]["state"][0]["step"]) == 40
    # and `frugal recsys export` writes them shard-free
    assert main(["recsys", "export", str(checkpoints), "--out", str(tmp_path / "t.npz")]) == 0
    with np.load(tmp_path / "t.npz") as exported:
        assert sum(len(exported[k]) for k in exported.files if k.startswith("ids")) == len(saved)


@pytest.mark.distributed
@pytest.mark.slow
def test_one_trainer_with_one_permit_is_bit_reproducible(tmp_path: Path) -> None:
    config = _config(mode="hybrid", staleness=1, nproc=1, max_steps=30)
    first, second = _run(tmp_path, [(config, "a"), (config, "b")], nproc=1)
    assert first["max_staleness_seen"] == 0  # K = 1, W = 1: every read sees every update
    assert first["ranks"][0]["dense_params_sha256"] == second["ranks"][0]["dense_params_sha256"]
    assert first["test_auc"] == second["test_auc"]
    assert first["staleness_hist"] == second["staleness_hist"]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_out_of_core_shards_with_lookahead_train_exactly_as_in_ram(tmp_path: Path) -> None:
    # sync with 2 trainers is bit-reproducible, so a PS whose stores keep most rows on disk
    # (prefetched by hints 4 steps ahead) must end bit-identical to one that holds them all.
    # A Zipf stream over 8 x 50k ids: 251k rows per shard of 132 B (D = 32 + Adagrad's
    # sum), 33 MB; 25% of it as budget leaves the cache 4% of the rows once the per-row
    # maps (key map, record addresses: 20-28 B a row) are paid.
    data = RecsysDataConfig(
        dataset="criteo_zipf", zipf_num_samples=40_000, zipf_num_embeddings=50_000
    )
    common: dict[str, Any] = {
        "data": data, "mode": "sync", "staleness": 1, "store_backend": "file",
        "max_steps": 60, "embedding_dim": 32,
    }  # fmt: skip
    in_ram = _config(**common)
    out_of_core = _config(**common, ps_memory_ratio=0.25, ps_lookahead=4)
    hybrid = _config(
        **(common | {"mode": "hybrid", "staleness": 4}), ps_memory_ratio=0.25, ps_lookahead=4
    )
    admit = _config(**common, ps_admit_after=2)
    ram, ooc, ooc_hybrid, admitted = _run(
        tmp_path,
        [(in_ram, "ram"), (out_of_core, "ooc"), (hybrid, "ooc-hybrid"), (admit, "admit")],
    )
    # A frequency filter drops the first push of every id: fewer rows, some updates lost.
    for rank, ram_rank in zip(admitted["ranks"], ram["ranks"], strict=True):
        assert rank["shard"]["rejected_updates"] > 0
        assert sum(rank["shard"]["updates_applied"]) < sum(ram_rank["shard"]["updates_applied"])
    assert ram["ranks"][0]["shard"]["rejected_updates"] == 0
    assert (
        ooc_hybrid["steps"] == ram["steps"] and abs(ooc_hybrid["test_auc"] - ram["test_auc"]) < 0.02
    )
    assert ooc["ranks"][0]["dense_params_sha256"] == ram["ranks"][0]["dense_params_sha256"]
    assert ooc["test_auc"] == ram["test_auc"]
    assert ooc["staleness_hist"] == ram["staleness_hist"]
    for rank in ooc["ranks"] + ooc_hybrid["ranks"]:
        store = rank["shard"]["store"]
        assert store["capacity_rows"] < 251_024 // 10  # most rows live on disk only
        assert store["prefetched"] > 0 and store["bytes_read"] > 0  # rows came from disk
        assert store["hit_ratio"] > 0.9  # the hints made nearly every lookup a hit
    for rank in ram["ranks"]:
        assert rank["shard"]["store"]["bytes_read"] == 0


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_admission_eviction_and_expiry_train_a_stream_of_10x_the_capacity(tmp_path: Path) -> None:
    # Each shard holds 1,500 rows; the stream brings more than ten times as many distinct
    # ids. Without eviction the run stops at a full shard; with admission (an id's second
    # push) and LRU eviction, or with expiry alone, it trains to the end, at an AUC cost
    # measured against an unbounded table.
    data = RecsysDataConfig(
        dataset="criteo_zipf", zipf_num_samples=40_000, zipf_num_embeddings=50_000
    )
    common: dict[str, Any] = {"data": data, "mode": "hybrid", "staleness": 4, "max_steps": 60}
    bounded: dict[str, Any] = common | {"ps_capacity_rows": 1_500, "ps_admit_after": 2}
    unbounded, evicting, expiring = _run(
        tmp_path,
        [
            (_config(**common), "unbounded"),
            (_config(**bounded, ps_when_full="evict_lru"), "evicting"),
            (_config(**bounded, ps_expire_after_steps=2), "expiring"),
        ],
    )
    assert unbounded["live_rows"] >= 10 * 2 * 1_500  # 10x the two shards' capacity
    assert unbounded["evicted_rows"] == unbounded["expired_rows"] == 0
    for run in (evicting, expiring):
        assert run["steps"] == unbounded["steps"] == 60
        assert run["live_rows"] <= 2 * 1_500 and run["rejected_updates"] > 0
        assert 0.5 < run["test_auc"] <= unbounded["test_auc"] + 0.02
    assert evicting["evicted_rows"] > 0 and evicting["expired_rows"] == 0
    assert expiring["expired_rows"] > 0 and expiring["evicted_rows"] == 0
    (tmp_path / "full").mkdir()
    with pytest.raises(AssertionError, match="KeySpaceFullError"):
        _run(tmp_path / "full", [(_config(**bounded, timeout_s=10.0), "full")])


@pytest.mark.timeout(400)  # three torchrun jobs, one with a restart
def test_sync_adamw_steps_as_torch_and_resumes_bit_exactly(tmp_path: Path) -> None:
    adamw: dict[str, Any] = {
        "mode": "sync", "staleness": 1, "dense_optimizer": "adamw", "dense_lr": 2e-3,
        "dense_betas": (0.8, 0.99),  # dense_weight_decay None: AdamW's 0.01
    }  # fmt: skip
    one = _config(**adamw, max_steps=1, checkpoint_dir=str(tmp_path / "one"))
    full = _config(
        **adamw, max_steps=12, checkpoint_dir=str(tmp_path / "full"), checkpoint_every_steps=4
    )
    (_, uninterrupted) = _run(tmp_path, [(one, "one"), (full, "full")])
    # One step in the trainer is torch.optim.AdamW's step on the AllReduced gradient g, which
    # the saved first moment gives back: m = (1 - beta1) g after one step.
    torch.manual_seed(one.seed)
    train = load_recsys_data(one.data)[0]
    model = build_model(one.model, len(train.keys), one.embedding_dim, train.dense_dim, one.hidden)
    after = _dense(_final(tmp_path / "one"))
    params = list(model.parameters())
    by_hand = torch.optim.AdamW(params, lr=2e-3, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.01)
    for index, param in enumerate(params):
        state = after["optimizer"]["state"][index]
        assert float(state["step"]) == 1
        param.grad = state["exp_avg"] / (1 - 0.8)
        want_sq = (1 - 0.99) * param.grad**2  # v = (1 - beta2) g^2
        torch.testing.assert_close(state["exp_avg_sq"], want_sq, rtol=1e-5, atol=0)
    initial = [p.detach().clone() for p in params]
    by_hand.step()
    moved = 0.0
    for (name, param), before in zip(model.named_parameters(), initial, strict=True):
        value = after["model"][name]
        torch.testing.assert_close(value, param.detach(), rtol=0, atol=1e-7, msg=name)
        moved = max(moved, float((value - before).abs().max()))
    # Adam's first step moves each weight by lr * g / (|g| + eps), about lr (SGD's lr * |g|
    # would be far smaller); AdamW's decay adds lr * 0.01 * |p|
    assert moved == pytest.approx(2e-3, rel=0.05)
    # Killed at step 6 and resumed from the step-4 checkpoint: the same model, bit for bit
    killed = replace(full, checkpoint_dir=str(tmp_path / "killed"), max_restarts=1, fail_at_step=6)
    (resumed,) = _run(tmp_path, [(killed, "killed")])
    assert resumed["resumed_from_samples"] == 4 * 256 * 2 and resumed["steps"] == 8
    for rank, want in zip(resumed["ranks"], uninterrupted["ranks"], strict=True):
        assert rank["dense_params_sha256"] == want["dense_params_sha256"]
    assert resumed["test_auc"] == uninterrupted["test_auc"]
    _assert_same_dense(_final(tmp_path / "full"), _final(tmp_path / "killed"))
    assert float(_dense(_final(tmp_path / "full"))["optimizer"]["state"][0]["step"]) == 12


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(400)  # three torchrun jobs, one with a restart
def test_async_adam_chunks_resume_exactly_and_onto_one_process(tmp_path: Path) -> None:
    adam: dict[str, Any] = {"mode": "async", "dense_optimizer": "adam", "dense_lr": 2e-3}
    # Two trainers: the dense chunks (one per rank) each keep their Adam state; the
    # checkpoints gather it into the model's layout.
    two = _config(**adam, staleness=2, max_steps=20, checkpoint_dir=str(tmp_path / "two"),
                  checkpoint_every_steps=10)  # fmt: skip
    (on_two,) = _run(tmp_path, [(two, "two")])
    assert on_two["dense_max_staleness_seen"] <= on_two["staleness_bound"]
    final_two = _final(tmp_path / "two")
    # two chunks, each stepped once per push: 2 ranks x 20 steps
    assert float(_dense(final_two)["optimizer"]["state"][0]["step"]) == 40
    shutil.copytree(final_two, tmp_path / "at-w2")
    # One trainer with one permit is deterministic: an uninterrupted run, and the finished
    # two-trainer job loaded onto one process (one chunk cut from the gathered state).
    single: dict[str, Any] = adam | {"staleness": 1, "nproc": 1, "max_steps": 20}
    full = _config(**single, checkpoint_dir=str(tmp_path / "full"), checkpoint_every_steps=8)
    moved = replace(two, nproc=1, resume=True)
    uninterrupted, on_one = _run(tmp_path, [(full, "full"), (moved, "moved")], nproc=1)
    assert on_one["steps"] == 0 and on_one["resumed_from_samples"] == 20 * 256 * 2
    assert abs(on_one["test_auc"] - on_two["test_auc"]) < 1e-6
    _assert_same_dense(tmp_path / "at-w2", _final(tmp_path / "two"))
    # Killed at step 12 and resumed from the step-8 checkpoint: the chunk's Adam state is
    # restored, so the model is the uninterrupted run's, bit for bit.
    killed = replace(full, checkpoint_dir=str(tmp_path / "killed"), max_restarts=1,
                     fail_at_step=12)  # fmt: skip
    (resumed,) = _run(tmp_path, [(killed, "killed")], nproc=1)
    assert resumed["resumed_from_samples"] == 8 * 256 and resumed["steps"] == 12
    want = uninterrupted["ranks"][0]["dense_params_sha256"]
    assert resumed["ranks"][0]["dense_params_sha256"] == want
    assert resumed["test_auc"] == uninterrupted["test_auc"]
    _assert_same_dense(_final(tmp_path / "full"), _final(tmp_path / "killed"))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_terabyte_shaped_stream_of_raw_ids_trains_out_of_core_and_resumes_after_a_kill(
    tmp_path: Path,
) -> None:
    # Raw 64-bit ids (337.6M of them at full scale; 3.4M here) generated batch by batch,
    # hashed by the trainers; the shards keep their rows on disk with a 25% budget.
    data = RecsysDataConfig(
        dataset="criteo_terabyte_stream",
        stream_num_samples=30_720,
        stream_test_samples=4_000,
        stream_scale=0.01,
    )
    # Killed at step 45 and restarted by torchrun: the shards rebuild their on-disk rows from
    # the step-40 checkpoint and train to the end.
    config = _config(
        data=data, mode="hybrid", staleness=4, max_steps=None, embedding_dim=32,
        store_backend="file", ps_memory_ratio=0.25, ps_lookahead=4,
        checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_steps=20, max_restarts=1,
        fail_at_step=45,
    )  # fmt: skip
    (result,) = _run(tmp_path, [(config, "tb")])
    assert result["resumed_from_samples"] == 40 * 2 * 256
    assert result["steps"] == 20  # 30,720 samples / (2 x 256) = 60 steps, 40 before the kill
    assert _final(tmp_path / "ckpt").name == f"step-{60 * 2 * 256}"
    assert result["live_rows"] > 40_000  # distinct hashed ids the shards took
    assert result["test_auc"] > 0.6  # learns the planted teacher
    for rank in result["ranks"]:
        store = rank["shard"]["store"]
        assert store["direct_io"] and store["capacity_rows"] < rank["shard"]["live_rows"] // 2


def _predict(snapshot: Snapshot, config: RecsysTrainConfig) -> np.ndarray:
    """The snapshot's click probabilities on the test split, in the trainer's 2048 chunks."""
    test = load_recsys_data(config.data)[1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each trainer process runs
    try:
        return np.concatenate(
            [
                snapshot.predict(test.batch(np.arange(lo, min(lo + 2048, test.num_samples)), -1))
                for lo in range(0, test.num_samples, 2048)
            ]
        )
    finally:
        torch.set_num_threads(threads)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(600)  # four torchrun jobs, one with a restart, one failing
def test_incremental_checkpoints_with_expiry_resume_exactly_and_serve_the_model(
    tmp_path: Path,
) -> None:
    # sync is bit-reproducible; with expiry the shards delete rows between checkpoints, so a
    # delta that lost its deletions would bring rows back on resume and change the model.
    # 3 steps x 2 trainers = 6 push steps: expiry is checked at every push step, so a resumed
    # run checks at the same steps as an uninterrupted one.
    common: dict[str, Any] = {
        "mode": "sync", "staleness": 1, "max_steps": 30, "checkpoint_every_steps": 5,
        "checkpoint_full_every": 3, "ps_expire_after_steps": 3,
    }  # fmt: skip
    step = 256 * 2  # samples per step
    full = _config(**common, checkpoint_dir=str(tmp_path / "full"))
    (uninterrupted,) = _run(tmp_path, [(full, "full")])
    assert uninterrupted["expired_rows"] > 0
    # checkpoints after steps 5 (full), 10, 15 (deltas), 20 (full), 25, 30 (deltas); the
    # chains of the newest two are kept
    folders = sorted((tmp_path / "full").glob("step-*"), key=lambda f: int(f.name[5:]))
    assert [f.name for f in folders] == [f"step-{s * step}" for s in (20, 25, 30)]
    manifests = [m for _, m in read_chain(folders[-1])]
    assert [m["kind"] for m in manifests] == ["full", "delta", "delta"]
    deleted = 0
    for folder in folders[1:]:
        for path in folder.glob("shard*.npz"):
            with np.load(path) as data:
                deleted += sum(len(data[k]) for k in data.files if k.startswith("deleted"))
    assert deleted > 0  # the deltas record deletions
    # Killed at step 17, restarted from step 15 (full 5, deltas 10 and 15): the same model
    killed = replace(full, checkpoint_dir=str(tmp_path / "killed"), max_restarts=1,
                     fail_at_step=17)  # fmt: skip
    (resumed,) = _run(tmp_path, [(killed, "killed")])
    assert resumed["resumed_from_samples"] == 15 * step and resumed["steps"] == 15
    for rank, want in zip(resumed["ranks"], uninterrupted["ranks"], strict=True):
        assert rank["dense_params_sha256"] == want["dense_params_sha256"]
    assert resumed["test_auc"] == uninterrupted["test_auc"]
    assert resumed["test_logloss"] == uninterrupted["test_logloss"]
    final = _final(tmp_path / "killed")
    # one run id per run: the uninterrupted run's is another
    run_ids = {m["run_id"] for _, m in read_chain(final)}
    assert len(run_ids) == 1 and run_ids != {m["run_id"] for m in manifests}
    saved = _rows(final)
    assert saved.keys() == _rows(_final(tmp_path / "full")).keys()
    for key, row in _rows(_final(tmp_path / "full")).items():
        np.testing.assert_array_equal(saved[key], row)
    # A snapshot of the killed run's chain serves the trainer's evaluation, sample for sample
    # as far as the AUC and log loss tell (both are computed from the same probabilities).
    snapshot = Snapshot.open(tmp_path / "killed")
    assert snapshot.samples_done == 30 * step and snapshot.source == str(final)
    probabilities = _predict(snapshot, full)
    test = load_recsys_data(full.data)[1]
    assert roc_auc(test.labels, probabilities) == resumed["test_auc"]
    assert log_loss(test.labels, probabilities) == resumed["test_logloss"]
    # Loaded onto one process (nothing left to train): the chain's rows move to one shard,
    # whose checkpoint, full now, replaces the last delta; the open snapshot is unaffected.
    one = replace(killed, nproc=1, resume=True, max_restarts=0, fail_at_step=None)
    (again,) = _run(tmp_path, [(one, "one")], nproc=1)
    assert again["steps"] == 0 and again["test_auc"] == resumed["test_auc"]
    assert read_chain(final)[0][1]["kind"] == "full" and len(list(final.glob("shard*"))) == 1
    assert {read_chain(final)[0][1]["run_id"]} == run_ids  # a resumed job keeps its run's id
    moved = _rows(final)
    assert moved.keys() == saved.keys()
    for key, row in saved.items():
        np.testing.assert_array_equal(moved[key], row)
    np.testing.assert_array_equal(_predict(snapshot, full), probabilities)
    width = full.embedding_dim
    with np.load(final / "shard0.npz") as data:
        for t in range(len(test.keys)):
            trained = data[f"ids{t}"]
            np.testing.assert_array_equal(snapshot.lookup(t, trained), data[f"rows{t}"][:, :width])
            # ids without a row (never trained, or expired) read the PS's initial values
            others = np.setdiff1d(np.arange(test.num_embeddings[t] + 5), trained)
            spec = RowSpec(embedding_dim=width, optimizer=full.embedding_optimizer)
            keys = table_keys(np.full(len(others), t, dtype=np.int64), others)
            want = init_rows(keys, spec, full.seed)[:, :width]
            np.testing.assert_array_equal(snapshot.lookup(t, others), want)
    # A chain whose full checkpoint is gone cannot be resumed: a clear error, nothing deleted
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "full", broken)
    shutil.rmtree(broken / f"step-{20 * step}")
    listing = sorted(str(p) for p in broken.rglob("*"))
    lost = replace(full, checkpoint_dir=str(broken), resume=True, nproc=1)
    (tmp_path / "lost").mkdir()
    with pytest.raises(AssertionError, match=f"step-{20 * step}, which is missing"):
        _run(tmp_path / "lost", [(lost, "lost")], nproc=1)
    assert sorted(str(p) for p in broken.rglob("*")) == listing


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resume_with_a_larger_max_steps_extends_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    for job in "abc":
        (tmp_path / job).mkdir()
    common: dict[str, Any] = {
        "nproc": 1, "mode": "sync", "checkpoint_dir": str(folder), "checkpoint_every_steps": 10,
    }  # fmt: skip
    (first,) = _run(tmp_path / "a", [(_config(**common, max_steps=20), "a")], nproc=1)
    (longer,) = _run(tmp_path / "b", [(_config(**common, max_steps=30, resume=True), "b")], nproc=1)
    assert (first["steps"], longer["steps"]) == (20, 10)  # 10 more steps, from step 20
    assert longer["samples_done"] == 30 * 256
    (again,) = _run(tmp_path / "c", [(_config(**common, max_steps=30, resume=True), "c")], nproc=1)
    assert again["steps"] == 0 and again["samples_done"] == 30 * 256  # nothing more to train


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_per_table_widths_train_out_of_core_checkpoint_and_serve(tmp_path: Path) -> None:
    # MovieLens' 7 tables at 2 widths: each PS shard keeps one store per width, on disk with
    # a cache of a few hundred rows, and dlrm projects the width-4 features to 32.
    dims = (32, 32, 4, 4, 4, 32, 4)
    config = _config(
        mode="hybrid", staleness=2, max_steps=20, embedding_dims=dims,
        store_backend="file", ps_memory_budget_bytes=4 * 131072, ps_lookahead=2,
        checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_steps=10,
    )  # fmt: skip
    (result,) = _run(tmp_path, [(config, "widths")])
    assert result["steps"] == 20 and result["test_auc"] > 0.55
    for rank in result["ranks"]:
        store = rank["shard"]["store"]
        assert store["direct_io"] and store["memory_budget_bytes"] == 4 * 131072
        assert (
            len(rank["shard"]["updates_applied"]) == 7 and min(rank["shard"]["updates_applied"]) > 0
        )
    final = _final(tmp_path / "ckpt")
    snapshot = Snapshot.open(tmp_path / "ckpt")
    assert snapshot.table_dims == dims
    for path in sorted(final.glob("shard*.npz")):
        with np.load(path) as data:
            for t, dim in enumerate(dims):
                assert data[f"rows{t}"].shape[1] == dim + 1  # vector + row-wise Adagrad
                np.testing.assert_array_equal(
                    snapshot.lookup(t, data[f"ids{t}"]), data[f"rows{t}"][:, :dim]
                )
    # the served model is the trainers' model: the same test AUC from its predictions
    test = load_recsys_data(config.data)[1]
    assert roc_auc(test.labels, _predict(snapshot, config)) == result["test_auc"]
    # resuming with other widths is refused before launch, naming the field
    other = replace(config, resume=True, embedding_dims=(8,) * 7)
    with pytest.raises(ConfigError, match=r"embedding_dims=\[32, 32, 4, 4, 4, 32, 4\]"):
        _check_checkpoint_dir(other)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sequence_feature_trains_with_din_attention_and_serves(tmp_path: Path) -> None:
    # MovieLens with each rating's earlier movies of the user as an unpooled feature, pooled
    # by DIN attention against the rated movie inside the dense model.
    config = _config(
        data=RecsysDataConfig(dataset="movielens100k_history"), mode="hybrid", staleness=2,
        max_steps=30, sequence_features=("history",), sequence_target="movie_id",
        checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_steps=30,
    )  # fmt: skip
    (result,) = _run(tmp_path, [(config, "seq")])
    assert result["steps"] == 30 and result["test_auc"] > 0.6
    history = 7
    assert all(rank["shard"]["updates_applied"][history] > 0 for rank in result["ranks"])
    snapshot = Snapshot.open(tmp_path / "ckpt")
    test = load_recsys_data(config.data)[1]
    assert roc_auc(test.labels, _predict(snapshot, config)) == result["test_auc"]
