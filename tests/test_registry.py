"""frugal.registry.Registry: registration, lookup errors that list the choices, removal, plugins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frugal.config import ConfigError
from frugal.registry import Registry


def test_entries_keep_their_order_and_unknown_names_list_the_choices() -> None:
    reg: Registry[int] = Registry("codec", field="codec")
    reg.register("fp32", 32)
    reg.decorator("fp16")(16)
    assert reg.names() == ("fp32", "fp16") and list(reg) == ["fp32", "fp16"] and len(reg) == 2
    assert reg.get("fp16") == 16 and "fp32" in reg and "q3" not in reg
    assert reg.check("fp32") == "fp32"
    message = "codec='q3' is not a registered codec; choose one of fp32, fp16"
    with pytest.raises(ConfigError, match=message):  # bad input: the CLI prints one line
        reg.get("q3")


def test_a_taken_name_is_refused_unless_replaced() -> None:
    reg: Registry[int] = Registry("codec", field="codec")
    reg.register("fp32", 32)
    with pytest.raises(ValueError, match="'fp32' is already registered; pick another name"):
        reg.register("fp32", 1)
    reg.register("fp32", 1, replace=True)
    assert reg.get("fp32") == 1
    assert reg.unregister("fp32") == 1 and reg.names() == ()
    for bad in ("", " fp32"):
        with pytest.raises(ValueError, match="must be non-empty, without spaces"):
            reg.register(bad, 0)


_PLUGIN = """
import numpy as np

from frugal.recsys.batch import RecsysData
from frugal.recsys.datasets import RECSYS_DATASETS
from frugal.recsys.models import WideDeepMLP, register_dense_model


def tiny(config):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(1200, 2))
    labels = (ids[:, 0] % 2).astype(np.float32)  # learnable from the first feature
    data = RecsysData.from_columns(
        ("a", "b"), (50, 50), ids, np.zeros((1200, 0), np.float32), labels
    )
    cut = np.arange(1000)
    test = np.arange(1000, 1200)
    take = lambda rows: RecsysData(
        data.keys, data.num_embeddings,
        tuple(v[rows] for v in data.values), tuple(np.arange(len(rows) + 1) for _ in data.values),
        data.dense[rows], data.labels[rows],
    )
    return take(cut), take(test)


RECSYS_DATASETS.register("tiny_plugin", tiny)
register_dense_model("plugin_mlp", WideDeepMLP)
"""


def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with `tmp_path` on PYTHONPATH and `env` set."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_plugin_modules_and_entry_points_register_in_every_process(tmp_path: Path) -> None:
    (tmp_path / "my_recsys.py").write_text(_PLUGIN)
    code = (
        "from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data\n"
        "from frugal.recsys.models import DENSE_MODELS\n"
        "train, test = load_recsys_data(RecsysDataConfig(dataset='tiny_plugin'))\n"
        "print(train.num_samples, test.num_samples, 'plugin_mlp' in DENSE_MODELS)\n"
    )
    done = _python(code, tmp_path, FRUGAL_PLUGINS="my_recsys")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "200", "True"]
    unknown = _python(code, tmp_path, FRUGAL_PLUGINS="")  # no plugin: the usual error
    assert "dataset='tiny_plugin' is not a registered recsys dataset" in unknown.stderr
    assert "or register it from a module named in FRUGAL_PLUGINS" in unknown.stderr
    missing = _python(code, tmp_path, FRUGAL_PLUGINS="no_such_module")
    assert "FRUGAL_PLUGINS names module 'no_such_module', which cannot be imported" in (
        missing.stderr
    )
    # An installed package's entry point: a dist-info folder on the path declares it.
    (tmp_path / "my_models.py").write_text(
        "from frugal.recsys.models import WideDeepMLP\nfactory = WideDeepMLP\n"
    )
    info = tmp_path / "my_models-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-models\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[frugal.recsys.models]\nep_mlp = my_models:factory\n")
    code = (
        "from frugal.recsys.models import build_model\n"
        "print(type(build_model('ep_mlp', 2, 4, 0, (3,))).__name__)\n"
    )
    done = _python(code, tmp_path, FRUGAL_PLUGINS="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "WideDeepMLP"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_plugin_dataset_and_model_reach_the_torchrun_trainers(tmp_path: Path) -> None:
    (tmp_path / "my_recsys.py").write_text(_PLUGIN)
    code = (
        "import sys\nfrom frugal.cli.main import main\n"
        f"sys.exit(main(['recsys', 'train', '--dataset', 'tiny_plugin', '--out', "
        f"{str(tmp_path / 'out')!r}, '--set', 'model=\"plugin_mlp\"', '--set', 'epochs=3']))\n"
    )
    done = _python(code, tmp_path, FRUGAL_PLUGINS="my_recsys", OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["dataset"] == "tiny_plugin" and result["test_auc"] > 0.9  # label = id parity
