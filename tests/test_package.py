"""The package itself: version, error base class, import direction."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import frugal

SRC = Path(frugal.__file__).parent

# ARCHITECTURE.md: config, data, parallel -> store, comm, launch -> pipeline, planner, recsys,
# tgraph -> bench -> reproduce -> cli. A module may import its own subpackage and lower layers
# only. Benchmarks live in frugal.bench, above every library package.
# pipeline and planner share a layer, so neither imports the other: they meet in parallel.
LAYERS = {
    "config": 0,
    "registry": 0,
    "_libc": 0,  # glibc allocator settings, prctl (imports nothing of frugal)
    "_typing": 0,  # numpy array type aliases (imports nothing of frugal)
    "disk": 0,  # DiskFullError, free-space checks (imports only FrugalError)
    "results": 1,
    "data": 1,
    "parallel": 1,
    "store": 2,
    "comm": 2,
    "launch": 2,
    "planner": 3,
    "tgraph": 3,
    "pipeline": 3,
    "recsys": 4,
    "bench": 6,
    "reproduce": 7,
    "cli": 8,
    "__main__": 9,  # `python -m frugal`
}


def _frugal_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "frugal" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_version_comes_from_the_installed_metadata() -> None:
    from importlib.metadata import version

    assert frugal.__version__ == version("frugal")
    assert frugal.__version__ != "0+unknown"


def test_frugal_error_is_an_exception_and_not_a_value_error() -> None:
    # The CLI maps FrugalError to exit 1 and ValueError to exit 2, so they must not overlap.
    assert issubclass(frugal.FrugalError, Exception)
    assert not issubclass(frugal.FrugalError, ValueError)


def test_every_module_imports_only_its_own_or_lower_layers() -> None:
    violations = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "__init__.py":
            # _libc imports nothing of frugal: workers arm die_with_launcher at import.
            assert _frugal_imports(path) <= {"_libc"}, "frugal/__init__.py imports a subpackage"
            continue
        own = rel.parts[0].removesuffix(".py")
        assert own in LAYERS, f"{rel}: add {own!r} to LAYERS in this test (ARCHITECTURE.md)"
        for target in _frugal_imports(path):
            if target == own:
                continue
            if target not in LAYERS or LAYERS[target] >= LAYERS[own]:
                violations.append(f"{rel} imports frugal.{target}")
    assert violations == []


def test_importing_frugal_data_does_not_import_torch() -> None:
    # `frugal data ...` must start fast; torch is imported only where tensors are made.
    code = "import sys, frugal.data, frugal.cli.main; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_python_dash_m_frugal_runs_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "frugal", "--version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert frugal.__version__ in result.stdout
