"""Each script in examples/ runs at its tiny size and does what its docstring says."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> ModuleType:
    """Import examples/NAME.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested() -> None:
    tested = {
        "store_training_loop", "tgraph_benchmark", "plan_my_cluster", "pipeline_tiny_gpt",
        "pipeline_your_model", "store_kge", "store_gnn", "recsys_train_and_serve",
        "tgraph_own_model",
    }  # fmt: skip
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_plan_my_cluster_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result: dict[str, Any] = load("plan_my_cluster").main(["--tiny", "--out", str(out)])
    plan = result["plan"]
    # two_sites.toml fixes 4 stages x 2 replicas over its 8 GPUs.
    assert (plan.num_stages, plan.num_replicas, plan.world_size) == (4, 2, 8)
    assert sum(plan.num_layers_per_stage) == 24
    assert json.loads(out.read_text()) == json.loads(result["json"])
    assert type(plan).from_json(out.read_text()) == plan
    # Megatron's default order is one of the candidates ours starts from: never better.
    assert plan.predicted_cost_s <= result["megatron"].predicted_cost_s


@pytest.mark.slow
def test_store_training_loop_learns_and_round_trips(tmp_path: Path) -> None:
    result = load("store_training_loop").main(["--tiny", "--dir", str(tmp_path)])
    assert result["round_trip"] is True
    # The labels are sums of fixed per-row scalars; Adagrad on the rows must cut the MSE.
    assert result["last_loss"] < 0.8 * result["first_loss"]


@pytest.mark.slow
def test_store_gnn_trains_the_same_through_a_store(tmp_path: Path) -> None:
    results = load("store_gnn").main(["--tiny", "--dir", str(tmp_path)])
    ram, frugal = results["ram"], results["frugal"]
    assert ram["losses"] == frugal["losses"] and len(ram["losses"]) == 6
    assert ram["embeddings_sha256"] == frugal["embeddings_sha256"]
    # 4 planted classes (chance 0.25); 6 batches of 64 already reach about 0.64.
    assert frugal["test_accuracy"] > 0.4


@pytest.mark.slow
def test_tgraph_benchmark_scores_models() -> None:
    rows = load("tgraph_benchmark").main(["--tiny"])
    assert set(rows) == {"recency", "tgn"}
    # The synthetic stream repeats recent edges (recurrence 0.5 by default), which is
    # exactly what the recency floor scores: well above chance against random negatives.
    assert rows["recency"]["auc"] > 0.6
    assert 0.0 <= rows["tgn"]["auc"] <= 1.0
    assert rows["tgn"]["epochs"] == 1
    assert rows["tgn"]["params"] > 0


def test_tgraph_own_model_and_csv_run_beside_tgn(tmp_path: Path) -> None:
    from frugal.tgraph.models import MODELS

    before = set(MODELS.names())
    try:
        rows = load("tgraph_own_model").main(["--tiny", "--out", str(tmp_path / "bench")])
    finally:  # the reference it resolved stays out of other tests' registry
        for name in set(MODELS.names()) - before:
            MODELS.unregister(name)
    own = rows["tgraph_own_model:NormedMemoryTGN"]
    # The heuristic floors run beside every bench's models.
    assert set(rows) == {"tgraph_own_model:NormedMemoryTGN", "tgn", "edgebank",
                         "edgebank_window", "recency", "popularity"}  # fmt: skip
    # Both ran on the user's file (named by its digest), with its 2 edge-feature columns.
    assert own["dataset"].startswith("my_events.csv@") and own["dataset"] == rows["tgn"]["dataset"]
    assert own["epochs"] == 1 and own["params"] > rows["tgn"]["params"]  # + the LayerNorm
    assert own["num_events"] > 0 and 0.0 <= own["auc"] <= 1.0


@pytest.mark.slow
def test_pipeline_tiny_gpt_trains_and_compresses() -> None:
    results = load("pipeline_tiny_gpt").main(["--tiny"])
    fp32, aqsgd = results["fp32"], results["aqsgd:fw2,bw4"]
    for run in (fp32, aqsgd):
        assert run["last_loss"] < run["first_loss"]
    # Same seed, same first step (AQ-SGD's first visit of an example is sent in full).
    assert aqsgd["first_loss"] == fp32["first_loss"]
    # 2-bit deltas and 4-bit gradients after each example's first visit: fewer bytes.
    assert aqsgd["wire_bytes"] < 0.6 * fp32["wire_bytes"]
    assert abs(aqsgd["eval_loss"] - fp32["eval_loss"]) < 0.05 * fp32["eval_loss"]


def test_pipeline_your_model_fine_tunes_a_folder_on_a_jsonl(tmp_path: Path) -> None:
    from tests.pipeline.test_hf_loader import _nontrivial, write_hf_folder
    from tests.pipeline.test_llama import TINY

    folder = write_hf_folder(tmp_path / "my-model", _nontrivial(TINY))
    data = tmp_path / "notes.jsonl"
    data.write_text("".join(json.dumps({"text": f"the cat {i} sat"}) + "\n" for i in range(300)))
    out = load("pipeline_your_model").main(
        ["--model-dir", str(folder), "--data", str(data), "--context", "16", "--steps", "6"]
    )
    assert out["last_loss"] < out["first_loss"]  # fine-tuning on the file lowers the loss
    assert 0 < out["eval_loss"] < 6.0  # below uniform over the 264 tokens: ln 264 = 5.58 + slack


def test_store_kge_learns_umls_and_reads_your_own_files(tmp_path: Path) -> None:
    result = load("store_kge").main(["--tiny", "--dir", str(tmp_path)])
    # 60 steps of DistMult on UMLS: far above an untrained table (filtered MRR < 0.2)
    assert result["last_loss"] < 0.7 * result["first_loss"]
    assert result["mrr"] > 0.35
    for split in ("train", "valid", "test"):  # a tiny graph of your own
        lines = [f"e{i}\tr{i % 3}\te{(i + 1) % 40}" for i in range(600 if split == "train" else 20)]
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    own = load("store_kge").main(
        ["--tiny", "--dir", str(tmp_path / "own"), "--train", str(tmp_path / "train.txt"),
         "--valid", str(tmp_path / "valid.txt"), "--test", str(tmp_path / "test.txt")]
    )  # fmt: skip
    assert 0 < own["mrr"] <= 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_recsys_train_and_serve_serves_the_checkpoints_rows(tmp_path: Path) -> None:
    out = load("recsys_train_and_serve").main(["--tiny", "--dir", str(tmp_path)])
    # 8 steps of 64 samples on 1 trainer, a checkpoint every 2 steps: at 128, 256, 384, 512
    # samples (a full one, then three incremental ones; 4 fit in the retention of 2 chains).
    assert out["checkpoints"] == ["step-128", "step-256", "step-384", "step-512"]
    assert out["num_tables"] == 26 and out["embedding_dim"] == 8
    assert 0 < out["changed_rows"] <= out["rows"]  # later steps touch new and old rows
    # the incremental export since step-128, applied to step-128's full export, is step-512's
    assert out["incremental_applies"] is True
    # Snapshot.lookup of every exported id is the row the export read from the checkpoint
    assert out["lookups_equal_checkpoint"] is True
    assert out["untrained_row_norm"] > 0  # an id never trained reads its seeded initial value
    probabilities = out["probabilities"]
    assert probabilities.shape == (512,)  # the whole test split
    assert ((probabilities > 0) & (probabilities < 1)).all()
    # predict is the trainer's evaluation: the same scores, so the same test AUC
    assert out["served_test_auc"] == pytest.approx(out["test_auc"], abs=1e-9)
