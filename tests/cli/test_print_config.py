"""`--print-config`: the resolved settings as commented TOML, loadable back, nothing run."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from frugal.cli.main import main
from frugal.config import config_to_dict, load_config

# (command line, Config class as "module:Class", the Config it must resolve to, or None)
COMMANDS = [
    (["store", "bench", "--quick"], "frugal.bench.store:StoreBenchConfig", "quick"),
    (["recsys", "bench"], "frugal.bench.recsys:RecsysBenchConfig", "default"),
    (["pipeline", "bench", "--quick"], "frugal.bench.pipeline:PipelineBenchConfig", "quick"),
    (["plan", "bench", "--set", "seed=3"], "frugal.bench.planner:PlanBenchConfig", None),
    (["plan", "validate", "--quick"], "frugal.bench.plan_validation:Config", None),
    (["tgraph", "bench", "--quick", "--protocol", "benchtemp", "--seeds", "2"],
     "frugal.bench.tgraph:TgraphBenchConfig", None),
    (["pipeline", "train", "--model", "smollm2-135m", "--stages", "3", "--codec", "aqsgd",
      "--fw-bits", "2", "--bw-bits", "4"], "frugal.pipeline.train:PipelineTrainConfig", None),
    (["recsys", "train", "--mode", "async", "--staleness", "8"],
     "frugal.recsys.config:RecsysTrainConfig", None),
    (["plan", "--scenario", "world", "--set", "budget=50"],
     "frugal.planner.plan:PlannerConfig", None),
    (["reproduce", "--smoke", "--only", "store,planner"],
     "frugal.reproduce:ReproduceConfig", None),
    (["data", "list"], "frugal.data:DataConfig", "default"),
]  # fmt: skip


def _config_class(spec: str) -> type:
    module, name = spec.split(":")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


@pytest.mark.parametrize(("args", "spec", "expected"), COMMANDS, ids=lambda v: str(v)[:40])
def test_printed_config_loads_back_equal_and_nothing_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    spec: str,
    expected: str | None,
) -> None:
    out = tmp_path / "never"
    out_flag = [] if args[0] in ("data",) or args[:2] == ["plan", "--scenario"] else ["--out"]
    full = [*args, *out_flag, *([str(out)] if out_flag else []), "--print-config"]
    assert main(full) == 0
    text = capsys.readouterr().out
    assert not out.exists()  # printed, not run
    lines = text.splitlines()
    assert lines[0].startswith("# ") and any(" = " in line for line in lines)
    # every setting line has its docstring as a comment right above it (or a table header)
    for k, line in enumerate(lines):
        if " = " in line and not line.startswith((" ", "#")):
            assert lines[k - 1].startswith("#"), f"no doc above {line!r}"
    cls = _config_class(spec)
    path = tmp_path / "printed.toml"
    path.write_text(text)
    loaded = load_config(cls, path)  # strict: every printed key is a real setting
    if expected == "quick":
        assert loaded == cls.quick()  # type: ignore[attr-defined]  # the bench presets have it
    elif expected == "default":
        assert loaded == cls()
    if args[0] == "reproduce":  # no --config: its settings are its flags
        assert config_to_dict(loaded) == {"mode": "smoke", "only": ["store", "planner"]}
        return
    # the file given back with --config resolves to the same settings
    again = [args[0], *([args[1]] if not args[1].startswith("-") else [])]
    if args[:2] == ["plan", "--scenario"]:
        again = [*args[:2], args[2]]
    assert main([*again, "--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out == text
    assert config_to_dict(load_config(cls, path)) == config_to_dict(loaded)


def test_print_config_still_refuses_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "bench", "--set", "num_batches=-1", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("frugal: error: ") and "num_batches" in err[0]
