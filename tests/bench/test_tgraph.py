"""Leaderboard rendering by hand, the CLI's bad-input paths, and a tiny end-to-end bench."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from frugal.bench.tgraph import TgraphBenchConfig, run_tgraph_bench
from frugal.cli.main import main
from frugal.tgraph.leaderboard import (
    collect_rows,
    mean_ci95,
    render_leaderboard,
    write_leaderboard,
)
from frugal.tgraph.protocol import ProtocolConfig


def _row(model: str, seed: int, auc: float, dataset: str = "d1") -> dict[str, object]:
    return {
        "system": model, "dataset": dataset, "protocol": "frugal", "protocol_hash": "ab" * 32,
        "setting": "transductive", "negatives": "random", "seed": seed, "auc": auc,
        "s_per_epoch": 1.0,
    }  # fmt: skip


def test_mean_ci95_by_hand() -> None:
    # [0.8, 0.9]: mean 0.85, sd 0.070711, t(0.975, 1) = 12.7062 -> half = 12.7062 * 0.05.
    mean, half = mean_ci95([0.8, 0.9])
    assert mean == pytest.approx(0.85)
    assert half == pytest.approx(12.7062 * 0.05, rel=1e-4)
    assert mean_ci95([0.7]) == (0.7, 0.0)


def test_leaderboard_marks_best_and_ranks() -> None:
    rows = [_row("edgebank", 0, 0.7), _row("tgn", 0, 0.8), _row("tgn", 1, 0.9)]
    rows += [_row("edgebank", 0, 0.9, "d2"), _row("tgn", 0, 0.6, "d2")]
    text = render_leaderboard(rows)
    # tgn's mean is higher on d1, but its interval [0.2147, 1.4853] holds edgebank's 0.7.
    assert "| d1 | 0.7000 (n=1) | 0.8500 ± 0.6353 |" in text
    # One tgn run has no interval: edgebank (exact) is ahead but cannot be said to beat it.
    assert "| d2 | 0.9000 (n=1) | 0.6000 (n=1) |" in text
    assert "| mean rank (2 datasets) | 1.50 | 1.50 |" in text
    assert "protocol `frugal` (settings abababababab)" in text


def test_leaderboard_bolds_only_a_winner_beyond_every_interval() -> None:
    # d1: tgn 0.80, 0.81, 0.82 -> 0.81 ± 4.3027 * 0.01 / sqrt(3) = ± 0.0248, above
    # jodie's 0.70 ± 0.0248 and edgebank's exact 0.75. d2: tgn's interval reaches jodie's.
    tgn = [_row("tgn", s, v) for s, v in enumerate((0.80, 0.81, 0.82))]
    jodie = [_row("jodie", s, v) for s, v in enumerate((0.69, 0.70, 0.71))]
    rows = [*tgn, *jodie, _row("edgebank", 0, 0.75)]
    rows += [_row("tgn", s, v, "d2") for s, v in enumerate((0.60, 0.80, 0.90))]
    rows += [_row("jodie", s, v, "d2") for s, v in enumerate((0.69, 0.70, 0.71))]
    rows += [_row("edgebank", 0, 0.95, "d3"), _row("tgn", 0, 0.5, "d3"), _row("tgn", 1, 0.52, "d3")]
    text = render_leaderboard(rows)
    assert "| d1 | **0.8100 ± 0.0248** | 0.7000 ± 0.0248 | 0.7500 (n=1) |" in text
    assert "| d2 | 0.7667 ± 0.3795 | 0.7000 ± 0.0248 | — |" in text
    # An exact heuristic above a learned model's interval [0.383, 0.637] is a clear winner.
    assert "| d3 | 0.5100 ± 0.1271 | — | **0.9500 (n=1)** |" in text


def test_leaderboard_adds_one_node_classification_table_per_protocol() -> None:
    rows = []
    for seed, nc in ((0, 0.6), (1, 0.8)):
        for negatives in ("random", "historical"):  # the run's nc_auc repeats on every row
            row = {**_row("tgn", seed, 0.9), "negatives": negatives, "nc_auc": nc}
            rows.append(row)
    rows.append(_row("recency", 0, 0.7))  # heuristics classify nothing
    text = render_leaderboard(rows, "nc_auc")
    assert "## node classification — protocol `frugal` (settings abababababab)" in text
    # mean of 0.6 and 0.8 (each run counted once), t(0.975, 1) * 0.141421 / sqrt(2)
    assert "| d1 | 0.7000 ± 1.2706 |" in text  # alone: nothing to beat, so not bold
    assert "recency" not in text


def test_leaderboard_merges_datasets_by_settings_and_counts_a_copied_run_once(
    tmp_path: Path,
) -> None:
    protocol = {"name": "frugal", "epochs": 50}
    for name, dataset, digest, aucs in (
        ("a", "d1", "11" * 32, (0.8, 0.9)),
        ("b", "d2", "22" * 32, (0.6, 0.7)),
    ):
        rows = [{**_row("tgn", seed, auc, dataset), "protocol_hash": digest}
                for seed, auc in enumerate(aucs)]  # fmt: skip
        rows.append({**_row("recency", 0, 0.75, dataset), "protocol_hash": digest})
        document = {"benchmark": "tgraph", "config": {"protocol": protocol}, "rows": rows}
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(document))
    # a copy of folder a: the same runs again must not narrow the interval
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "results.json").write_text((tmp_path / "a" / "results.json").read_text())
    rows = collect_rows(tmp_path)
    assert len(rows) == 6
    text = render_leaderboard(rows)
    assert text.count("## transductive / random negatives") == 1  # one table, both datasets
    # Two seeds' intervals (± 0.6353) hold recency's exact 0.75 on both datasets: no bold.
    assert "| d1 | 0.8500 ± 0.6353 | 0.7500 (n=1) |" in text
    assert "| d2 | 0.6500 ± 0.6353 | 0.7500 (n=1) |" in text
    assert "| mean rank (2 datasets) | 1.50 | 1.50 |" in text
    assert "d1 `111111111111`, d2 `222222222222`" in text
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text('{"benchmark": ')
    with pytest.raises(ValueError, match=r"bad/results.json is not valid JSON"):
        collect_rows(tmp_path)
    with pytest.raises(ValueError, match="no result row has a value of 'nc_auc'"):
        render_leaderboard(rows, "nc_auc")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"rows": [{"protocol_hash": "h", "setting": "transductive", "auc": 0.5}]},
         r"row 0 lacks \['protocol', 'dataset', 'system', 'seed', 'negatives'\]"),
        ({"config": [1], "rows": []}, "'config' must be an object, got list"),
        ({"rows": 5}, "'rows' must be a list of rows, got int"),
        ({"rows": "x"}, "'rows' must be a list of rows, got str"),
        ({"rows": [_row("tgn", 0, 0.8) | {"seed": [0]}]}, r"row 0: seed must be an integer"),
        ({"rows": [_row("tgn", 0, 0.8) | {"seed": True}]}, r"row 0: seed must be an integer"),
        ({"rows": [_row("tgn", 0, 0.8) | {"setting": None}]}, "row 0: setting must be a string"),
        ({"rows": [_row("tgn", 0, 0.8) | {"dataset": 1}]}, "row 0: dataset must be a string"),
        ({"rows": [_row("tgn", 0, 0.8) | {"protocol_hash": 12345}]},
         "row 0: protocol_hash must be a string"),
        ({"rows": [_row("tgn", 0, 0.8) | {"auc": "0.9"}]}, "row 0: auc must be a number or null"),
        ({"rows": [_row("tgn", 0, 0.8) | {"auc": True}]}, "row 0: auc must be a number or null"),
        ({"rows": [_row("tgn", 0, 0.8), _row("jodie", 0, 0.8) | {"run_s": "10"}]},
         "row 1: run_s must be a number or null"),
    ],
)  # fmt: skip
def test_leaderboard_names_the_file_and_row_of_malformed_results(
    tmp_path: Path, document: dict[str, object], message: str
) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps({"benchmark": "tgraph", **document}))
    with pytest.raises(ValueError, match=f"r/results.json: {message}"):
        collect_rows(tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_seeds": 0}, "num_seeds=0 must be >= 1"),
        ({"first_seed": -1}, "first_seed=-1 must be >= 0"),
        ({"first_seed": 2**32 - 1, "num_seeds": 2}, r"reaches seed 4294967296; seeds must be <="),
        ({"run_timeout_s": 0.0}, "run_timeout_s=0.0 must be > 0"),
        ({"datasets": ("sp_hospital", "sp_hospital")}, "lists a name twice"),
        ({"models": ("tgn", "tgn")}, "lists a name twice"),
        ({"pyg_reference_batches": 5}, "pyg_reference_batches=5 must be > 5"),
    ],
)
def test_bench_config_names_the_bad_setting(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TgraphBenchConfig(**changes)  # type: ignore[arg-type]


def test_leaderboard_names_a_results_file_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=r"results\.json is not UTF-8 text"):
        collect_rows(tmp_path)


def test_leaderboard_reads_the_journal_of_an_unfinished_bench(tmp_path: Path) -> None:
    # A sweep stopped mid-group: no results.json yet, only its journal (one line cut short).
    settings = {"protocol_settings": "cd" * 32}
    lines = [
        {"config": "k", "cell": "d1/tgn/0", "value": [_row("tgn", 0, 0.8) | settings]},
        {"config": "k", "cell": "d1/tgn/1", "value": [_row("tgn", 1, 0.9) | settings]},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + '\n{"config": "k", "ce'
    (tmp_path / "running").mkdir()
    (tmp_path / "running" / "runs.jsonl").write_text(text)
    rows = collect_rows(tmp_path)
    assert [(r["seed"], r["protocol_settings"]) for r in rows] == [(0, "cd" * 32), (1, "cd" * 32)]
    assert "| d1 | 0.8500 ± 0.6353 |" in render_leaderboard(rows)
    # A bench of one seed wrote results.json (another bench of the folder ran seed 1): the
    # journal still adds seed 1, and seed 0, in both files, counts once (results.json's row).
    finished = {"benchmark": "tgraph", "rows": [_row("tgn", 0, 0.8) | settings | {"x": 1}]}
    (tmp_path / "running" / "results.json").write_text(json.dumps(finished))
    assert [(r["seed"], r.get("x")) for r in collect_rows(tmp_path)] == [(0, 1), (1, None)]
    bad = tmp_path / "other"
    bad.mkdir()
    broken = {"value": [_row("tgn", 0, 0.8) | {"seed": "0"}]}
    (bad / "runs.jsonl").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"runs\.jsonl: line 1, row 0: seed must be an integer"):
        collect_rows(tmp_path)


def test_leaderboard_cli_writes_markdown_and_png(tmp_path: Path) -> None:
    rows = [_row("tgn", 0, 0.8), _row("tgn", 1, 0.8), _row("edgebank", 0, 0.7)]
    (tmp_path / "results.json").write_text(json.dumps({"benchmark": "tgraph", "rows": rows}))
    assert main(["tgraph", "leaderboard", str(tmp_path)]) == 0
    board = (tmp_path / "leaderboard.md").read_text()
    assert "| d1 | **0.8000 ± 0.0000** | 0.7000 (n=1) |" in board
    assert (tmp_path / "leaderboard.png").stat().st_size > 0
    with pytest.raises(FileNotFoundError):
        write_leaderboard(tmp_path / "nothing-here")


def test_cli_rejects_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["tgraph", "bench", "--model", "apan", "--out", str(tmp_path)]) == 2
    assert "models[0] = 'apan' is not allowed" in capsys.readouterr().err
    out = str(tmp_path)
    assert main(["tgraph", "bench", "--dataset", "collegemsg", "--task", "nc", "--out", out]) == 2
    assert "needs node labels" in capsys.readouterr().err
    assert main(["tgraph", "bench", "--dataset", "adult", "--out", str(tmp_path)]) == 2
    assert "not a temporal event stream" in capsys.readouterr().err


def test_cli_flags_win_over_the_config_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The file alone is a valid node-classification bench on PubMed; --dataset replaces it,
    # and CollegeMsg has no labels: refused before any training.
    settings = tmp_path / "bench.toml"
    settings.write_text('datasets = ["pubmed"]\ntask = "nc"\n')
    out = str(tmp_path / "out")
    args = ["tgraph", "bench", "--config", str(settings), "--out", out]
    assert main([*args, "--dataset", "collegemsg"]) == 2
    assert "needs node labels, and collegemsg has none" in capsys.readouterr().err
    settings.write_text('datasets = ["collegemsg"]\n')  # without a flag the file applies
    assert main([*args, "--task", "nc"]) == 2
    assert "collegemsg has none" in capsys.readouterr().err


def _tiny_config(embedding_dim: int = 16, **changes: Any) -> TgraphBenchConfig:
    """EdgeBank and JODIE on sp_hospital, one seed, one epoch: a bench of seconds."""
    return TgraphBenchConfig(
        datasets=("sp_hospital",),
        models=("edgebank", "jodie"),
        protocol=ProtocolConfig(max_epochs=1, embedding_dim=embedding_dim, learning_rate=1e-3),
        num_seeds=1,
        num_threads=1,
        compare_pyg_reference=False,
        **changes,
    )


@pytest.mark.slow
def test_tiny_bench_writes_rows_with_the_protocol_hash(tmp_path: Path) -> None:
    config = _tiny_config()
    document = run_tgraph_bench(config, tmp_path).document
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["benchmark"] == "tgraph"
    rows = stored["rows"]
    digest = document["summary"]["protocols"]["sp_hospital"]["protocol_hash"]
    assert {r["protocol_hash"] for r in rows} == {digest}
    # Heuristic floors are always present, one row per (view, negatives).
    assert {r["system"] for r in rows} == {
        "edgebank",
        "edgebank_window",
        "recency",
        "popularity",
        "jodie",
    }
    jodie = [r for r in rows if r["system"] == "jodie"]
    assert len(jodie) == 4 * 3
    for key in ("auc", "ap", "auc_per_batch", "ap_per_batch", "mrr", "hits_at_10",
                "s_per_epoch", "train_events_per_s", "infer_events_per_s", "epochs",
                "peak_rss_mib"):  # fmt: skip
        assert key in jodie[0], key
    assert len(list((tmp_path / "negatives").glob("*.npz"))) == 1
    assert (tmp_path / "results.jsonl").read_text().count("\n") == len(rows)
    # Rows name their protocol settings as the leaderboard derives them from results.json.
    settings = {r["protocol_settings"] for r in rows}
    assert (
        len(settings) == 1 and {r["protocol_settings"] for r in collect_rows(tmp_path)} == settings
    )
    # A second invocation on the same folder and config reuses every finished run.
    again = run_tgraph_bench(config, tmp_path).rows
    assert all(r.get("resumed") for r in again)
    strip = ["resumed", "peak_rss_mib"]  # heuristics report the bench process's RSS
    assert [{k: v for k, v in r.items() if k not in strip} for r in again] == [
        {k: v for k, v in r.items() if k not in strip} for r in rows
    ]
    # Extending the sweep (one more model, a longer timeout) reruns only what is new.
    wider = replace(config, models=("jodie", "dyrep"), run_timeout_s=1234.0)
    extended = run_tgraph_bench(wider, tmp_path).rows
    assert all(r.get("resumed") for r in extended if r["system"] != "dyrep")
    assert [r for r in extended if r["system"] == "dyrep"] and not any(
        r.get("resumed") for r in extended if r["system"] == "dyrep"
    )
    # Another protocol setting is another result: nothing is reused.
    other = replace(config, protocol=replace(config.protocol, train_batch_size=100))
    assert not any(r.get("resumed") for r in run_tgraph_bench(other, tmp_path).rows)


def test_tgraph_leaderboard_of_a_missing_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tgraph", "leaderboard", str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_compute_time_counts_each_run_once_and_sums_seeds() -> None:
    from frugal.tgraph.leaderboard import render_compute_time

    rows = []
    for seed, run_s in ((0, 60.0), (1, 120.0)):
        for negatives in ("random", "historical"):  # a run's rows repeat its run_s
            rows.append({**_row("tgn", seed, 0.9), "negatives": negatives, "run_s": run_s})
    rows.append({**_row("edgebank", 0, 0.7), "run_s": 6.0})
    rows.append({**_row("tgn", 0, 0.8, "d2"), "run_s": 30.0})
    text = render_compute_time(rows)
    assert "## protocol `frugal`" in text
    assert "| dataset | tgn | edgebank | total |" in text
    assert "| d1 | 3.0 | 0.1 | 3.1 |" in text  # (60 + 120) s, 6 s
    assert "| d2 | 0.5 | — | 0.5 |" in text
    assert "| all | 3.5 | 0.1 | 3.6 |" in text
    assert "no run_s" not in text
    assert "1 run(s) have no run_s" in render_compute_time([_row("tgn", 0, 0.9)])


@pytest.mark.slow
def test_pyg_reference_timing_is_journaled_and_kept_on_resume(tmp_path: Path) -> None:
    config = TgraphBenchConfig(
        datasets=("sp_hospital",),
        models=("tgn",),
        protocol=ProtocolConfig(max_epochs=1, embedding_dim=8, learning_rate=1e-3),
        num_seeds=1,
        num_threads=1,
        use_subprocess=False,
        pyg_reference_batches=7,
    )
    first = run_tgraph_bench(config, tmp_path).document
    (reference,) = [r for r in first["rows"] if r["system"] == "tgn_pyg_reference"]
    assert reference["dataset"] == "sp_hospital" and reference["timed_batches"] == 2 * 2
    assert reference["speedup"] == pytest.approx(
        reference["ours_train_events_per_s"] / reference["pyg_train_events_per_s"]
    )
    # A resumed bench reports the first timing, not a new one taken on a busier machine.
    again = run_tgraph_bench(config, tmp_path).document
    (resumed,) = [r for r in again["rows"] if r["system"] == "tgn_pyg_reference"]
    assert resumed.pop("resumed") is True and resumed == reference
    assert again["summary"]["tgn_vs_pyg_reference"] == first["summary"]["tgn_vs_pyg_reference"]
    # Another timing window is another measurement.
    longer = run_tgraph_bench(replace(config, pyg_reference_batches=8), tmp_path).document
    (retimed,) = [r for r in longer["rows"] if r["system"] == "tgn_pyg_reference"]
    assert "resumed" not in retimed and retimed["timed_batches"] == 2 * 3


@pytest.mark.slow
def test_node_classification_bench_has_the_floor_row(tmp_path: Path) -> None:
    config = TgraphBenchConfig(
        datasets=("sp_hospital",),
        models=("recency",),  # heuristics only: the popularity rows carry the NC floor
        task="nc",
        protocol=ProtocolConfig(max_epochs=1, embedding_dim=16, learning_rate=1e-3),
        num_seeds=1,
        num_threads=1,
        compare_pyg_reference=False,
    )
    rows = run_tgraph_bench(config, tmp_path).rows
    with_nc = {r["system"] for r in rows if r.get("nc_auc") is not None}
    assert with_nc == {"popularity"}
    floor = next(r for r in rows if r["system"] == "popularity")
    assert 0 <= floor["nc_auc"] <= 1 and floor["num_classes"] == 4
    assert floor["nc_steps"] >= 300


def test_benchtemp_config_keeps_the_presets_epochs_and_learning_rate() -> None:
    from frugal.bench.tgraph import benchtemp_config

    quick = benchtemp_config(TgraphBenchConfig.quick())
    assert quick.protocol.name == "benchtemp" and quick.protocol.embedding_dim == 172
    assert (quick.protocol.max_epochs, quick.protocol.learning_rate) == (2, 1e-3)
    full = benchtemp_config(TgraphBenchConfig())
    assert full.protocol == ProtocolConfig.benchtemp()  # the full preset: Benchtemp's own


def test_protocol_name_benchtemp_in_set_selects_the_benchtemp_preset() -> None:
    from frugal.cli.main import build_parser
    from frugal.cli.tgraph import bench_config

    def config(*argv: str) -> TgraphBenchConfig:
        return bench_config(build_parser().parse_args(["tgraph", "bench", *argv]))

    flag = config("--protocol", "benchtemp")
    via_set = config("--set", 'protocol.name="benchtemp"')
    assert via_set == flag
    assert via_set.protocol.embedding_dim == 172 and via_set.protocol.patience == 3
    # An explicit setting still wins over the preset's.
    wider = config("--set", 'protocol.name="benchtemp"', "--set", "protocol.embedding_dim=64")
    assert wider.protocol.embedding_dim == 64 and wider.protocol.patience == 3
    assert config().protocol.embedding_dim == 100  # the frugal protocol by default
    with pytest.raises(ValueError, match=r"--protocol frugal contradicts protocol\.name"):
        config("--protocol", "frugal", "--set", 'protocol.name="benchtemp"')
    split = config("--seeds", "1", "--first-seed", "2")
    assert (split.first_seed, split.num_seeds) == (2, 1) and config().first_seed == 0


@pytest.mark.slow
def test_benches_of_one_folder_split_the_seeds_and_the_full_bench_resumes_them(
    tmp_path: Path,
) -> None:
    config = _tiny_config(embedding_dim=8, use_subprocess=False)
    seed_1 = run_tgraph_bench(replace(config, first_seed=1), tmp_path).rows
    jodie = {(r["seed"], r.get("resumed", False)) for r in seed_1 if r["system"] == "jodie"}
    assert jodie == {(1, False)}
    assert {r["seed"] for r in seed_1 if r["system"] == "edgebank"} == {0}  # heuristics: seed 0
    seed_0 = run_tgraph_bench(config, tmp_path).rows  # the other bench of the folder
    assert {r["seed"] for r in seed_0 if r["system"] == "jodie" and not r.get("resumed")} == {0}
    both = run_tgraph_bench(replace(config, num_seeds=2), tmp_path).document
    assert all(r.get("resumed") for r in both["rows"])
    assert {r["seed"] for r in both["rows"] if r["system"] == "jodie"} == {0, 1}
    assert both["summary"]["datasets"]["sp_hospital"]["models"]["jodie"]["num_seeds"] == 2

    def jodie_auc(rows: list[dict[str, Any]]) -> dict[int, float]:
        return {r["seed"]: r["auc"] for r in rows if r["system"] == "jodie"
                and r["setting"] == "transductive" and r["negatives"] == "random"}  # fmt: skip

    assert jodie_auc(both["rows"]) == jodie_auc(seed_1 + seed_0)  # the same runs, resumed


def _events_csv(path: Path, num_events: int = 600, shift_s: int = 0) -> Path:
    """A synthetic stream as a plain events CSV with two edge-feature columns."""
    import numpy as np
    import pandas as pd

    from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events

    events = generate_temporal_events(TemporalStreamConfig(num_events=num_events, num_nodes=40))
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"src": events.src, "dst": events.dst, "t": events.t + shift_s})
    frame["f1"], frame["f2"] = rng.random(num_events), rng.random(num_events)
    frame.to_csv(path, index=False)
    return path


def test_an_events_file_is_named_by_its_digest_and_its_features_reach_the_models(
    tmp_path: Path,
) -> None:
    from frugal.data.event_files import read_event_file
    from frugal.tgraph.models import MODELS
    from frugal.tgraph.protocol import build_protocol
    from frugal.tgraph.train import model_inputs

    path = _events_csv(tmp_path / "mine.csv")
    config = TgraphBenchConfig(datasets=(str(path),), models=("tgn",))  # a path is accepted
    assert config.datasets == (str(path),)
    file = read_event_file(path)
    protocol = build_protocol(file.events, file.key, config.protocol)
    inputs = model_inputs(protocol, MODELS.get("tgn"))
    assert inputs.msg.shape == (600, 2)  # the file's f1, f2, not the 172 zero columns
    assert float(abs(inputs.msg).sum()) > 0
    with pytest.raises(ValueError, match=r"not a temporal event stream.*your own events \.csv"):
        TgraphBenchConfig(datasets=("my_events",))


def test_cli_names_the_line_of_a_bad_events_file_before_any_training(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("src,dst,t\n0,1,5\n1,2,oops\n")
    out = tmp_path / "out"
    assert main(["tgraph", "bench", "--dataset", str(bad), "--out", str(out)]) == 2
    assert f"{bad}: line 3: t = 'oops' is not an integer" in capsys.readouterr().err
    assert not (out / "runs.jsonl").exists()
    # One file named twice (another spelling of its path) is one dataset: refused.
    good = _events_csv(tmp_path / "good.csv", num_events=50)
    twice = ["--dataset", str(good), "--dataset", f"{tmp_path}/./good.csv"]
    assert main(["tgraph", "bench", *twice, "--out", str(out)]) == 2
    assert "are the same data" in capsys.readouterr().err
    # Three events, or any number at one time, cannot be split into train, val and test.
    for name, text in (("three.csv", "src,dst,t\n0,1,5\n1,2,6\n2,0,7\n"),
                       ("one_time.csv", "src,dst,t\n" + "0,1,5\n" * 60)):  # fmt: skip
        (tmp_path / name).write_text(text)
        assert main(["tgraph", "bench", "--dataset", str(tmp_path / name), "--out", str(out),
                     "--model", "recency"]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert "leaves a split empty" in err and "Traceback" not in err


def test_bench_on_an_events_file_journals_by_digest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _events_csv(tmp_path / "mine.csv")
    out = tmp_path / "out"
    args = [
        "tgraph", "bench", "--dataset", str(path), "--model", "edgebank", "--model", "tgn",
        "--seeds", "1", "--out", str(out), "--set", "protocol.max_epochs=1",
        "--set", "protocol.embedding_dim=8", "--set", "protocol.num_neighbors=4",
        "--set", "compare_pyg_reference=false", "--set", "use_subprocess=false",
        "--set", "num_threads=1",
    ]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    document = json.loads((out / "results.json").read_text())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    key = f"mine.csv@{digest[:16]}"
    rows = document["rows"]
    assert {r["system"] for r in rows} >= {"edgebank", "tgn"}
    assert {(r["dataset"], r["dataset_path"], r["dataset_sha256"]) for r in rows} == {
        (key, str(path), digest)
    }
    described = document["summary"]["protocols"][key]
    assert described["dataset_sha256"] == digest and described["dataset_resorted_by_t"] is False
    (head,) = [r for r in rows if r["system"] == "tgn" and r["setting"] == "transductive"
               and r["negatives"] == "random"]  # fmt: skip
    assert 0.0 <= head["auc"] <= 1.0
    # The same file again: every run is resumed from the journal.
    assert main(args) == 0
    assert all(r.get("resumed") for r in json.loads((out / "results.json").read_text())["rows"])
    # The same name with times shifted below zero is another file: nothing is reused, and
    # (times count only as differences) every score is the same.
    _events_csv(path, shift_s=-(10**6))
    assert main(args) == 0
    again = json.loads((out / "results.json").read_text())["rows"]
    new_digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert new_digest != digest and not any(r.get("resumed") for r in again)
    assert {r["dataset_sha256"] for r in again} == {new_digest}

    def scores(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        keys = ("system", "setting", "negatives", "auc", "ap", "mrr")
        return sorted(tuple(str(r.get(k)) for k in keys) for r in rows)

    assert scores(again) == scores(rows)
