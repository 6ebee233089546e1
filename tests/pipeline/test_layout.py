"""Rank layouts, schedules, codec specs and config validation (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import build_schedule
from frugal.pipeline.models import split_layers
from frugal.pipeline.train import PipelineTrainConfig, make_layout
from tests.pipeline.test_distributed import _dp_plan


def test_linear_layout_and_world_size_check() -> None:
    layout = make_layout(PipelineTrainConfig(num_stages=4), 4)
    assert layout.mesh == ((0, 1, 2, 3),) and layout.layers == (1, 1, 1, 1)
    assert layout.position(2) == (0, 2)
    with pytest.raises(ValueError, match="world_size=3 but num_stages=4"):
        make_layout(PipelineTrainConfig(num_stages=4), 3)


def test_plan_layout_and_mismatch(tmp_path: Path) -> None:
    plan = _dp_plan(tmp_path)
    config = PipelineTrainConfig(plan=str(plan))
    layout = make_layout(config, 4)
    assert layout.position(3) == (1, 1) and layout.num_microbatches == (2, 2)
    with pytest.raises(ValueError, match="world_size=4 but 8 processes"):
        make_layout(config, 8)
    wrong_model = PipelineTrainConfig(plan=str(plan), gpt=config.gpt.__class__(num_layers=6))
    with pytest.raises(ValueError, match=r"set gpt\.num_layers=4"):
        make_layout(wrong_model, 4)


def test_schedules() -> None:
    assert build_schedule("gpipe", 2, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    # PipeDream-Flush, p = 4, m = 4: stage 0 warms up with 3 forwards; the last stage with 0.
    assert build_schedule("1f1b", 4, 0, 4) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("F", 3),
        ("B", 0),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert build_schedule("1f1b", 4, 3, 3) == [
        ("F", 0),
        ("B", 0),
        ("F", 1),
        ("B", 1),
        ("F", 2),
        ("B", 2),
    ]
    assert build_schedule("1f1b", 4, 1, 4)[:4] == [("F", 0), ("F", 1), ("F", 2), ("B", 0)]
    with pytest.raises(ValueError, match="'zb'"):
        build_schedule("zb", 2, 0, 2)


def test_codec_specs_and_bad_input() -> None:
    assert CodecSpec.parse("aqsgd:fw2,bw4") == CodecSpec("aqsgd", 2, 4)
    assert CodecSpec.parse("fp16").label == "fp16"
    with pytest.raises(ValueError, match="codec 'aqsgd:fw9,bw4'"):
        CodecSpec.parse("aqsgd:fw9,bw4")
    assert split_layers(6, 4) == (2, 2, 1, 1)
    with pytest.raises(ValueError, match="between 1 and 4"):
        PipelineTrainConfig(num_stages=5)
    with pytest.raises(ValueError, match="not both"):
        PipelineTrainConfig(bandwidth_mbps=10.0, rho=1.0)


def test_headers_are_checked() -> None:
    import torch

    from frugal.comm.message import LinkCodec, ProtocolError, parse_header

    sender = LinkCodec(CodecSpec.parse("directq:fw2,bw4"), 0)
    header, payload, finite = sender.encode(torch.ones(2, 3, 4), torch.arange(2), step=5, mb=1)
    fields = parse_header(header)
    assert finite and fields["shape"] == (2, 3, 4) and fields["payload_bytes"] == payload.numel()
    assert fields["bits"] == 2 and fields["step"] == 5 and fields["mb"] == 1
    receiver = LinkCodec(CodecSpec.parse("directq:fw2,bw4"), 0)
    with pytest.raises(ProtocolError, match=r"expected \(codec, kind, step, mb\) = \(4, 0, 6, 1\)"):
        receiver.expect(header, step=6, mb=1)
    other = LinkCodec(CodecSpec.parse("aqsgd:fw2,bw4"), 0)
    with pytest.raises(ProtocolError, match="different codecs"):
        other.expect(header, step=5, mb=1)
    bad = header.clone()
    bad[0] = 7
    with pytest.raises(ProtocolError, match="bad message header"):
        parse_header(bad)


def test_stage_blocks_share_the_model_blocks_and_check_the_split() -> None:
    from torch import nn

    from frugal.pipeline.models import StageBlocks, check_stage_layers

    blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(5))
    # layers (2, 3): stage 1 holds blocks 2, 3, 4 (the same objects, not copies)
    stage = StageBlocks(blocks, 1, (2, 3), use_recompute=False)
    assert (stage.stage, stage.num_stages, stage.is_first, stage.is_last) == (1, 2, False, True)
    assert [id(b) for b in stage.blocks] == [id(b) for b in blocks[2:]]
    check_stage_layers((2, 3), 5)
    with pytest.raises(ValueError, match=r"sum to the model's 5 blocks"):
        check_stage_layers((2, 2), 5)
    with pytest.raises(ValueError, match=r">= 1 each"):
        check_stage_layers((5, 0), 5)


def test_run_job_file_parses_runs_and_reports_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    from collections.abc import Sequence

    from frugal.config import config_to_dict
    from frugal.pipeline.train import RunSpec
    from frugal.pipeline.worker import run_job_file

    config = PipelineTrainConfig(num_stages=2)
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"config": config_to_dict(config), "runs": []}))
    seen: list[tuple[int, int, Path]] = []

    def body(c: PipelineTrainConfig, runs: Sequence[RunSpec], out: Path) -> None:
        seen.append((c.num_stages, len(runs), out))

    assert run_job_file([str(job), str(tmp_path)], module="m", body=body) == 0
    assert seen == [(2, 0, tmp_path)]
    assert run_job_file([str(job)], module="some.module", body=body) == 2
    assert "usage: python -m some.module JOB.json OUT_DIR" in capsys.readouterr().err

    def failing(c: PipelineTrainConfig, runs: Sequence[RunSpec], out: Path) -> None:
        raise ValueError("stage 1 is gone")

    def crashing(c: PipelineTrainConfig, runs: Sequence[RunSpec], out: Path) -> None:
        raise RuntimeError("bug")

    monkeypatch.setenv("RANK", "3")
    assert run_job_file([str(job), str(tmp_path)], module="m", body=failing) == 1
    assert "frugal: rank 3: ValueError: stage 1 is gone" in capsys.readouterr().err
    with pytest.raises(RuntimeError):  # not among `errors`: a bug, with its traceback
        run_job_file([str(job), str(tmp_path)], module="m", body=crashing)


def test_progress_lines_parse_even_when_torchruns_tail_joins_another_ranks_output() -> None:
    from frugal.pipeline.train import progress_event

    event = '{"run": "fp32", "step": 3, "loss": 5.25, "step_s": 0.1}'
    expected = {"run": "fp32", "step": 3, "loss": 5.25, "step_s": 0.1}
    assert progress_event(f"FRUGAL_PROGRESS {event}") == expected
    # print() wrote text and newline apart: the tail joined the next rank's prefix to the line
    assert progress_event(f"FRUGAL_PROGRESS {event}[default1]:") == expected
    assert progress_event('FRUGAL_PROGRESS {"run": "fp32", "st') is None  # cut short
    assert progress_event("FRUGAL_PROGRESS [1, 2]") is None  # not an event
    assert progress_event("step 3 done") is None
