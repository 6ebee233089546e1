"""Strict Config loading from TOML, dicts and --set overrides."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from frugal import FrugalError
from frugal.config import (
    ConfigError,
    apply_overrides,
    check_types,
    config_from_dict,
    config_to_commented_toml,
    config_to_dict,
    config_to_json,
    config_to_toml,
    field_docs,
    load_config,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Inner:
    """A nested component."""

    bits: int = 4
    """Bits per value, 1..8."""
    ratios: tuple[float, ...] = (1.0, 0.25)
    """Memory ratios."""

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits={self.bits} must be in [1, 8]")


@dataclass(frozen=True, kw_only=True, slots=True)
class Root:
    """A root component with one required field."""

    name: str
    """Run name (required)."""
    seed: int = 0
    """Seed."""
    lr: float = 0.1
    """Learning rate."""
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    """Pipeline schedule."""
    budget_s: float | None = None
    """Optional time budget."""
    use_cache: bool = True
    """Whether to cache."""
    inner: Inner = field(default_factory=Inner)
    """Nested settings."""


def test_defaults_and_nested_table_load(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('name = "a"\nlr = 1\n[inner]\nbits = 2\nratios = [0.5]\n')
    cfg = load_config(Root, path)
    assert cfg == Root(name="a", lr=1.0, inner=Inner(bits=2, ratios=(0.5,)))
    assert isinstance(cfg.lr, float)  # an int in TOML is accepted for a float field
    assert isinstance(cfg.inner.ratios, tuple)


def test_unknown_key_names_file_dotted_key_and_allowed_keys(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('name = "a"\n[inner]\nbitz = 2\n')
    with pytest.raises(ConfigError) as info:
        load_config(Root, path)
    message = str(info.value)
    assert str(path) in message
    assert "inner.bitz" in message
    assert "bits, ratios" in message


def test_missing_required_key_is_named() -> None:
    with pytest.raises(ConfigError, match="missing required key name"):
        config_from_dict(Root, {"seed": 1}, source="x.toml")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"name": "a", "seed": "1"}, "seed = '1' must be an integer"),
        ({"name": "a", "seed": True}, "seed = True must be an integer"),
        ({"name": "a", "use_cache": 1}, "use_cache = 1 must be true or false"),
        ({"name": "a", "schedule": "zb"}, "choose one of 'gpipe', '1f1b'"),
        ({"name": "a", "inner": 3}, "inner must be a table (Inner), got 3; set its fields"),
        ({"name": "a", "inner": {"ratios": 0.5}}, "inner.ratios = 0.5 must be an array"),
        ({"name": 5}, "name = 5 must be a string"),
    ],
)
def test_wrong_types_are_rejected_with_the_key(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(Root, data, source="x.toml")
    assert fragment in str(info.value)


def test_component_validation_error_is_reported_with_its_table() -> None:
    with pytest.raises(ConfigError, match=r"x.toml: \[inner\] bits=9 must be in \[1, 8\]"):
        config_from_dict(Root, {"name": "a", "inner": {"bits": 9}}, source="x.toml")


def test_overrides_parse_toml_values_and_fall_back_to_strings() -> None:
    data = apply_overrides(
        {"name": "a", "inner": {"bits": 2}},
        [
            "seed=3",
            "lr=0.5",
            "use_cache=false",
            "inner.ratios=[1, 0.1]",
            "name=run/1",
            "budget_s=none",
        ],
    )
    assert data == {
        "name": "run/1",
        "seed": 3,
        "lr": 0.5,
        "use_cache": False,
        "inner": {"bits": 2, "ratios": [1, 0.1]},
        "budget_s": None,
    }
    cfg = config_from_dict(Root, data)
    assert cfg.inner.ratios == (1.0, 0.1)
    assert cfg.budget_s is None


def test_override_without_equals_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must look like key=value"):
        apply_overrides({}, ["seed"])
    with pytest.raises(ConfigError, match="must look like key=value"):
        apply_overrides({}, ["a..b=1"])


def test_override_on_top_of_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('name = "a"\nseed = 1\n')
    assert load_config(Root, path, ["seed=7"]).seed == 7


def test_missing_and_malformed_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Root, tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(Root, bad)


def test_round_trip_through_toml_and_json() -> None:
    cfg = Root(name="x", seed=2, budget_s=3.5, inner=Inner(bits=3, ratios=(0.1, 0.05)))
    assert config_from_dict(Root, tomllib.loads(config_to_toml(cfg))) == cfg
    assert config_from_dict(Root, json.loads(config_to_json(cfg))) == cfg
    no_budget = Root(name="x")
    assert "budget_s" not in config_to_toml(no_budget)  # TOML has no null: omitted
    assert config_from_dict(Root, tomllib.loads(config_to_toml(no_budget))) == no_budget
    assert config_to_dict(cfg)["inner"] == {"bits": 3, "ratios": [0.1, 0.05]}


def test_non_config_class_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        config_from_dict(int, {})
    with pytest.raises(TypeError):
        config_to_dict(3)


@dataclass(frozen=True, kw_only=True, slots=True)
class Checked:
    """A component that checks its fields."""

    rhos: tuple[float, ...] = (1.0,)
    """Ratios."""
    links: tuple[tuple[int, float], ...] = ()
    """(peer, bandwidth) pairs."""

    def __post_init__(self) -> None:
        check_types(self)


def test_nan_or_inf_inside_a_list_field_is_named() -> None:
    with pytest.raises(ConfigError, match=r"Checked: rhos\[1\] = nan must be finite"):
        Checked(rhos=(1.0, float("nan")))
    with pytest.raises(ConfigError, match=r"links\[0\]\[1\] = inf must be finite"):
        Checked(links=((1, float("inf")),))
    assert Checked(rhos=(0.5, 2.0), links=((1, 3.5),)).links == ((1, 3.5),)


def test_config_error_is_a_frugal_error_and_a_value_error() -> None:
    # `except ValueError` in callers keeps working; the CLI prints it as one line, exit 2.
    assert issubclass(ConfigError, FrugalError) and issubclass(ConfigError, ValueError)


def test_field_docs_are_the_attribute_docstrings() -> None:
    assert field_docs(Inner) == {"bits": "Bits per value, 1..8.", "ratios": "Memory ratios."}
    assert list(field_docs(Root)) == [
        "name", "seed", "lr", "schedule", "budget_s", "use_cache", "inner"
    ]  # fmt: skip


def test_commented_toml_has_each_doc_above_its_field_and_loads_back_equal(
    tmp_path: Path,
) -> None:
    config = Root(name="run", budget_s=None, inner=Inner(bits=2))
    text = config_to_commented_toml(config)
    lines = text.splitlines()
    assert lines[0] == "# A root component with one required field."
    assert lines[lines.index('name = "run"') - 1] == "# Run name (required)."
    assert lines[lines.index("[inner]") - 1] == "# Nested settings."
    assert lines[lines.index("bits = 2") - 1] == "# Bits per value, 1..8."
    assert "# budget_s is unset (None)" in lines  # TOML has no null: loads back as default
    path = tmp_path / "printed.toml"
    path.write_text(text)
    assert load_config(Root, path) == config
    assert tomllib.loads(text) == tomllib.loads(config_to_toml(config))


def test_a_nested_table_overrides_only_the_keys_it_names_of_the_fields_default() -> None:
    from frugal.recsys.config import RecsysTrainConfig

    # The field's default is row-wise Adagrad at lr 0.05, eps 1e-10 (not the class's sgd).
    config = config_from_dict(RecsysTrainConfig, {"embedding_optimizer": {"lr": 0.1}})
    optimizer = config.embedding_optimizer
    assert (optimizer.kind, optimizer.lr, optimizer.eps) == ("rowwise_adagrad", 0.1, 1e-10)
    other = config_from_dict(RecsysTrainConfig, {"embedding_optimizer": {"kind": "adagrad"}})
    assert (other.embedding_optimizer.kind, other.embedding_optimizer.lr) == ("adagrad", 0.05)
