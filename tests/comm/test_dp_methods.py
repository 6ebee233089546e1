"""DP compression methods are a registry: a user's method plugs in, unknown names list them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from frugal.cli.main import build_parser
from frugal.cli.pipeline import train_config
from frugal.comm.gradcomp import (
    DP_METHODS,
    GradientSync,
    NoCompressionMethod,
    dp_wire_bytes,
    register_dp_method,
)
from frugal.parallel.plan import PlanMismatchError
from frugal.pipeline.train import PipelineTrainConfig, RunSpec

SHAPES = [(48, 64), (48,), (8, 48), (8,)]  # 3,512 values


class Fp32Copy(NoCompressionMethod):
    """The plain float32 sum under another name (what a user's module would register)."""

    description = "a copy of none"


@pytest.fixture
def fp32_copy() -> Iterator[str]:
    register_dp_method("fp32-copy", Fp32Copy())
    try:
        yield "fp32-copy"
    finally:
        DP_METHODS.unregister("fp32-copy")


def test_the_built_in_methods_in_order() -> None:
    assert DP_METHODS.names() == ("none", "fp16", "powersgd", "ef-kbit", "qadam")
    assert [m for m in DP_METHODS if DP_METHODS.get(m).uses_bits] == ["ef-kbit", "qadam"]
    assert [m for m in DP_METHODS if DP_METHODS.get(m).owns_optimizer] == ["qadam"]


def test_a_registered_method_prices_configures_and_parses(fp32_copy: str, tmp_path: Path) -> None:
    assert dp_wire_bytes(fp32_copy, SHAPES, 2, 3) == dp_wire_bytes("none", SHAPES, 2, 3) == 14048
    config = PipelineTrainConfig(dp_compression=fp32_copy)
    assert config.dp_compression == fp32_copy
    assert RunSpec(label="r", codec="fp32", steps=1, dp_compression=fp32_copy).steps == 1
    args = build_parser().parse_args(["pipeline", "train", "--dp-compress", fp32_copy])
    assert train_config(args).dp_compression == fp32_copy
    with pytest.raises(ValueError, match="already registered"):
        register_dp_method(fp32_copy, Fp32Copy())


def test_an_unknown_method_lists_every_registered_one() -> None:
    message = (
        "dp_compression='topk' is not a registered DP compression method; choose one of "
        "none, fp16, powersgd, ef-kbit, qadam"
    )
    with pytest.raises(ValueError, match=message):
        dp_wire_bytes("topk", SHAPES, 2, 0)
    with pytest.raises(ValueError, match="choose one of"):
        PipelineTrainConfig(dp_compression="topk")
    with pytest.raises(ValueError, match="choose one of"):
        RunSpec(label="r", codec="fp32", steps=1, dp_compression="topk")
    with pytest.raises(ValueError, match="choose one of"):  # before the group is touched
        GradientSync("topk", [], cast(Any, None))


def test_warmup_and_collective_constraints_come_from_the_spec() -> None:
    qadam = DP_METHODS.get("qadam")
    with pytest.raises(ValueError, match=r"dp_compression='qadam' freezes .* warmup_steps >= 1"):
        qadam.check_warmup("qadam", 0)
    qadam.check_warmup("qadam", 1)
    DP_METHODS.get("none").check_warmup("none", 0)
    for collective in ("ring", "central_ps", "seq_peer"):  # the float32 sum runs any
        DP_METHODS.get("none").check_collective("none", collective)
    DP_METHODS.get("fp16").check_collective("fp16", "ring")
    DP_METHODS.get("ef-kbit").check_collective("ef-kbit", "seq_peer")
    message = (
        "the plan priced stage 1's data-parallel exchange as 'central_ps' but "
        "dp_compression='fp16' always exchanges by ring; run with --dp-compress none, or plan "
        "again"
    )
    with pytest.raises(PlanMismatchError, match=message):
        DP_METHODS.get("fp16").check_collective("fp16", "central_ps", stage=1)
    with pytest.raises(PlanMismatchError, match="--dp-compress none or fp16 or powersgd"):
        DP_METHODS.get("qadam").check_collective("qadam", "ring")
