"""A user's model named as `package.module:attribute`: resolved, trained, or refused clearly."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from torch import nn

from frugal import ConfigError
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.registry import import_object
from frugal.tgraph.models import MODELS, ModelProtocolError, TemporalGNN
from frugal.tgraph.protocol import ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction

MODULE = '''
from torch import nn

from frugal.tgraph.models import HeuristicModel, IdentityMessage, TemporalGNN, TimeEncoder
from frugal.tgraph.models.tgnn import attention_embedding, memory_cell


class RNNMemoryTGN(TemporalGNN):
    @classmethod
    def from_inputs(cls, inputs, **parts):
        encoder = TimeEncoder(inputs.embedding_dim)
        return super().from_inputs(
            inputs, time_encoder=encoder,
            embedding=attention_embedding(inputs, encoder, num_layers=1, num_heads=1),
            memory_updater=memory_cell(nn.RNNCell, inputs), message=IdentityMessage(),
        )


def build_rnn_tgn(inputs):
    return RNNMemoryTGN.from_inputs(inputs)


class SeenPair(HeuristicModel):
    """EdgeBank written again by a user: 1 if (src, dst) was seen before."""

    def _score(self, src, dst, t):
        seen, _ = self._last_seen(src * self.num_nodes + dst)
        return seen.astype(float)


class Broken(nn.Module):
    def __init__(self, inputs):
        super().__init__()

    def reset_state(self):
        pass


class BareTGN(TemporalGNN):
    pass


class NoScore(HeuristicModel):
    pass


class NoArgs:
    pass


NUMBER = 3
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module `my_tgnn_models` in tmp_path, importable; its resolved models unregistered."""
    (tmp_path / "my_tgnn_models.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "raising_models.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "broken_syntax_models.py").write_text("def (:\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    before = set(MODELS.names())
    yield "my_tgnn_models"
    for name in set(MODELS.names()) - before:
        MODELS.unregister(name)
    for module in ("my_tgnn_models", "raising_models", "broken_syntax_models"):
        sys.modules.pop(module, None)


def _protocol():  # type: ignore[no-untyped-def]
    stream = generate_temporal_events(TemporalStreamConfig(num_events=800, num_nodes=30))
    config = replace(ProtocolConfig(), max_epochs=1, embedding_dim=8, num_neighbors=3)
    return build_protocol(stream, "synthetic", config)


def test_a_class_or_builder_reference_trains_as_a_learned_model(user_module: str) -> None:
    protocol = _protocol()
    by_class = run_link_prediction(f"{user_module}:RNNMemoryTGN", protocol, 0, num_threads=1)
    by_builder = run_link_prediction(f"{user_module}:build_rnn_tgn", protocol, 0, num_threads=1)
    assert type(by_class.model).__name__ == "RNNMemoryTGN"
    assert isinstance(by_class.model, TemporalGNN)
    assert isinstance(by_class.model.updater, nn.RNNCell)
    assert MODELS.get(f"{user_module}:RNNMemoryTGN").kind == "learned"
    # The same model by either route and seed: the same training run.
    assert [h["loss"] for h in by_class.history] == [h["loss"] for h in by_builder.history]
    assert by_class.rows == by_builder.rows


def test_a_heuristic_subclass_reference_is_fitted_once(user_module: str) -> None:
    spec = MODELS.get(f"{user_module}:SeenPair")
    assert spec.kind == "heuristic"
    protocol = _protocol()
    rows = run_link_prediction(f"{user_module}:SeenPair", protocol, 0).rows
    assert rows == run_link_prediction("edgebank", protocol, 0).rows
    assert any(0.5 < (r.get("auc") or 0) < 1 for r in rows)


def test_a_class_without_the_trainer_calls_is_refused_naming_them(user_module: str) -> None:
    with pytest.raises(ModelProtocolError) as error:
        run_link_prediction(f"{user_module}:Broken", _protocol(), 0)
    message = str(error.value)
    assert isinstance(error.value, TypeError) and isinstance(error.value, ConfigError)
    assert "lacks state, load_state, forward_batch, commit_numpy" in message
    assert "reset_state," not in message  # it has that one
    assert "subclass TemporalGNN" in message


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("my_tgnn_models:NUMBER", "names a int, not a model"),
        ("my_tgnn_models:Missing", "has no attribute 'Missing'; it defines BareTGN, Broken, "),
        ("no_such_pkg_xyz.models:Model", "module 'no_such_pkg_xyz.models' cannot be imported"),
        ("my_tgnn_models:", "is not a 'package.module:attribute' reference"),
        ("a:b:c", "is not a 'package.module:attribute' reference"),
        ("raising_models:X", "importing module 'raising_models' failed with RuntimeError: boom"),
        (
            "broken_syntax_models:X",
            "importing module 'broken_syntax_models' failed with SyntaxError",
        ),
    ],
)
def test_bad_references_say_what_is_wrong(user_module: str, reference: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        MODELS.get(reference)
    assert reference not in MODELS  # `in` answers False instead of raising


def test_a_reference_imports_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd_only_models.py").write_text("VALUE = np = 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert import_object("cwd_only_models:VALUE") == 7
        assert sys.path[0] == str(tmp_path)
    finally:
        sys.modules.pop("cwd_only_models", None)


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        (
            "BareTGN",
            "building it from ModelInputs failed with TypeError: .*TemporalGNN "
            "subclass must pass its parts",
        ),
        ("NoArgs", "building it from ModelInputs failed with TypeError"),
        ("NoScore", r"\(NoScore\) cannot score a pair: NotImplementedError"),
        ("Broken", "built a Broken, which lacks state"),
    ],
)
def test_a_model_that_cannot_build_or_run_is_refused_before_any_run(
    user_module: str, tmp_path: Path, attribute: str, expected: str
) -> None:
    from frugal.bench.tgraph import TgraphBenchConfig, run_tgraph_bench

    config = TgraphBenchConfig(
        datasets=("sp_hospital",), models=(f"{user_module}:{attribute}",), num_seeds=1,
        compare_pyg_reference=False, use_subprocess=False,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=expected):
        run_tgraph_bench(config, tmp_path / "bench")
    journal = tmp_path / "bench" / "runs.jsonl"  # not even the heuristic floors ran
    assert not journal.exists() or journal.read_text().strip() == ""


def test_editing_your_models_module_runs_it_again(user_module: str, tmp_path: Path) -> None:
    from frugal.bench.tgraph import TgraphBenchConfig, run_tgraph_bench
    from frugal.tgraph.models import model_source_sha256

    reference = f"{user_module}:SeenPair"
    config = TgraphBenchConfig(
        datasets=("sp_hospital",), models=(reference,), num_seeds=1,
        compare_pyg_reference=False, use_subprocess=False,
    )  # fmt: skip
    first = run_tgraph_bench(config, tmp_path / "bench")
    digest = model_source_sha256(reference)
    assert digest is not None and model_source_sha256("tgn") is None
    mine = [r for r in first.rows if r["system"] == reference]
    assert mine and {r["model_source_sha256"] for r in mine} == {digest}
    again = run_tgraph_bench(config, tmp_path / "bench")  # unchanged: resumed
    assert all(r.get("resumed") for r in again.rows if r["system"] == reference)
    path = Path(str(sys.modules[user_module].__file__))
    path.write_text(path.read_text() + "\n# edited\n")
    changed = run_tgraph_bench(config, tmp_path / "bench")  # edited: run again
    rerun = [r for r in changed.rows if r["system"] == reference]
    assert rerun and not any(r.get("resumed") for r in rerun)
    assert {r["model_source_sha256"] for r in rerun} == {model_source_sha256(reference)} != {digest}


def test_the_bench_refuses_a_broken_model_before_any_run(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.cli.main import main

    out = tmp_path / "bench"
    code = main(
        ["tgraph", "bench", "--dataset", "sp_hospital", "--model", f"{user_module}:Broken",
         "--seeds", "1", "--out", str(out)]
    )  # fmt: skip
    assert code == 2
    assert "my_tgnn_models:Broken' built a Broken, which lacks state" in capsys.readouterr().err
    journal = out / "runs.jsonl"
    assert not journal.exists() or journal.read_text().strip() == ""
