"""`frugal pipeline train|bench`: bad input exits 2 before launching; a real 2-stage run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frugal.cli.main import main
from tests.pipeline.test_distributed import _dp_plan


def test_bits_without_a_quantizing_codec_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", "train", "--codec", "aqsgd", "--fw-bits", "2"]) == 2
    assert "needs --fw-bits and --bw-bits" in capsys.readouterr().err
    assert main(["pipeline", "train", "--codec", "fp32", "--fw-bits", "2"]) == 2
    assert main(["pipeline", "train", "--rho", "fast"]) == 2
    assert "10gbps" in capsys.readouterr().err


def test_plan_for_another_world_size_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _dp_plan(tmp_path)  # 2 stages x 2 replicas, 4 layers: fits the default model
    assert main(["pipeline", "train", "--plan", str(plan), "--set", "gpt.num_layers=6"]) == 2
    assert "set gpt.num_layers=4" in capsys.readouterr().err
    assert main(["pipeline", "train", "--plan", str(plan), "--stages", "4"]) == 2
    assert "the plan has 2 stages" in capsys.readouterr().err


@pytest.mark.distributed
def test_train_writes_losses_and_a_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["pipeline", "train", "--model", "tiny-gpt", "--stages", "2", "--codec", "aqsgd",
            "--fw-bits", "2", "--bw-bits", "4", "--rho", "100mbps", "--steps", "4", "--out",
            str(out), "--set", "num_train=64", "--set", "calibrate_steps=2"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["codec"] == "aqsgd:fw2,bw4" and summary["world_size"] == 2
    assert summary["bandwidth_bits_per_s"] > 0  # rho 3.3 resolved from the measured compute
    saved = json.loads((out / "train.json").read_text())
    assert len(saved["losses"]) == 4 and saved["losses"][-1] < saved["losses"][0]
    assert (out / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_smollm2_with_more_stages_than_blocks_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    # The preset applies (30 blocks of SmolLM2, not the tiny GPT's 4): rejected before launch.
    assert main(["pipeline", "train", "--model", "smollm2-135m", "--stages", "31"]) == 2
    assert "30 blocks" in capsys.readouterr().err


def test_bits_out_of_range_and_dp_bits_without_a_kbit_method_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["pipeline", "train", "--codec", "aqsgd", "--fw-bits", "0", "--bw-bits", "4"]) == 2
    assert "--fw-bits 0: bits must be in 1..8" in capsys.readouterr().err
    assert main(["pipeline", "train", "--dp-compress", "fp16", "--dp-bits", "4"]) == 2
    assert "--dp-bits 4 applies to --dp-compress ef-kbit or qadam, not fp16" in (
        capsys.readouterr().err
    )


def test_a_link_too_slow_for_the_timeout_exits_2_before_launching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 stages, 4 micro-batches of 4 x 64 x 128 fp32 values + 128-byte header = 131,200 B;
    # at 0.001 Mbit/s: 4 x 8 x 131,200 / 1,000 = 4,198 s > 30 s.
    args = ["pipeline", "train", "--stages", "2", "--bandwidth-mbps", "0.001", "--set",
            "comm_timeout_s=30", "--set", "micro_batch_size=4", "--set", "num_microbatches=4",
            "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "4 first-visit activation messages of 131,200 bytes need 4,198 s" in err
    assert "comm_timeout_s=8397" in err


def test_latency_alone_and_absurd_links_are_refused_with_a_usable_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["pipeline", "train", "--stages", "2", "--set", "micro_batch_size=4", "--set",
            "num_microbatches=4", "--out", str(tmp_path / "run")]  # fmt: skip
    # Unshaped bandwidth, 1e7 ms latency: 4 messages x 10,000 s = 40,000 s > 120 s.
    assert main([*base, "--set", "latency_ms=1e7"]) == 2
    err = capsys.readouterr().err
    assert "at full speed and 1e+07 ms latency" in err and "need 40,000 s" in err
    assert "lower latency_ms" in err
    # 1e-300 Mbit/s: 4 x 8 x 131,200 bit / 1e-294 bit/s = 4.2e300 s. No timeout covers it,
    # so the fix names the slowest usable bandwidth: 4 x 8 x 131,200 bits in 120 s = 0.035.
    assert main([*base, "--bandwidth-mbps", "1e-300"]) == 2
    err = capsys.readouterr().err
    assert "need 4.2e+300 s" in err and "use at least 0.035 Mbit/s" in err
    assert main([*base, "--rho", "1e12"]) == 2
    assert "rho=1e+12 is above 100" in capsys.readouterr().err
    assert main([*base, "--set", "comm_timeout_s=1e-9"]) == 2
    assert "comm_timeout_s=1e-09 must be >= 1 s" in capsys.readouterr().err


def test_a_bad_plan_file_is_named_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, empty = tmp_path / "bad.json", tmp_path / "empty.json"
    bad.write_text("{")
    empty.write_text("{}")
    assert main(["pipeline", "train", "--plan", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert f"--plan {bad}: not a plan: invalid JSON" in capsys.readouterr().err
    assert main(["pipeline", "train", "--plan", str(empty), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"--plan {empty}: not a plan: unknown fields [], missing [" in err
    assert "write a plan with `frugal plan --out FILE`" in err
    assert main(["pipeline", "train", "--codec", "aqsgd:fw2,bw4:col"]) == 2
    assert "optionally followed by :row" in capsys.readouterr().err


@pytest.mark.distributed
def test_your_hugging_face_model_fine_tunes_on_your_jsonl_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.pipeline.test_hf_loader import _nontrivial, write_hf_folder
    from tests.pipeline.test_llama import TINY

    folder = write_hf_folder(tmp_path / "my-model", _nontrivial(TINY))
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"the cat {i} sat"}) + "\n" for i in range(300)))
    out = tmp_path / "run"
    base = ["pipeline", "train", "--model", "hf", "--set", f"dataset={corpus}", "--set",
            "hf.context=16", "--set", "num_train=64", "--stages", "2", "--steps", "4",
            "--out", str(out)]  # fmt: skip
    # Without the folder: one line that names the setting, before any launch.
    assert main(base) == 2
    assert "model='hf' needs hf.path" in capsys.readouterr().err
    assert main([*base, "--set", f"hf.path={tmp_path / 'nothing'}"]) == 1  # a FrugalError
    assert "no such model folder" in capsys.readouterr().err
    assert main([*base, "--set", f"hf.path={folder}", "--codec", "aqsgd", "--fw-bits", "4",
                 "--bw-bits", "8", "--set", "learning_rate=3e-3"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert summary["codec"] == "aqsgd:fw4,bw8" and summary["world_size"] == 2
    saved = json.loads((out / "train.json").read_text())
    assert len(saved["losses"]) == 4 and saved["losses"][-1] < saved["losses"][0]
    assert saved["summary"]["eval_loss"] < saved["summary"]["initial_eval_loss"]


def test_machines_that_do_not_split_the_job_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["pipeline", "train", "--stages", "2"]
    assert main([*base, "--nnodes", "3", "--rdzv-endpoint", "127.0.0.1:1"]) == 2
    assert "--nnodes 3 does not divide the job's 2 processes" in capsys.readouterr().err
    assert main([*base, "--nnodes", "2"]) == 2
    assert "--nnodes 2 needs --rdzv-endpoint HOST:PORT" in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.slow
def test_two_machines_train_like_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two `frugal pipeline train` commands on 127.0.0.1 stand for two machines (one rank each,
    # one rendezvous): the losses equal one machine's run of the same job, and only global
    # rank 0's machine writes train.json.
    import subprocess
    import sys

    from frugal.launch import free_port

    args = ["pipeline", "train", "--stages", "2", "--steps", "3", "--codec", "aqsgd",
            "--fw-bits", "2", "--bw-bits", "4", "--set", "num_train=64"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "frugal",
                *args,
                "--nnodes",
                "2",
                "--rdzv-endpoint",
                endpoint,
                "--out",
                str(tmp_path / f"node{n}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    written = [n for n in range(2) if (tmp_path / f"node{n}" / "train.json").exists()]
    assert len(written) == 1
    other = 1 - written[0]
    assert "the machine of global rank 0 writes train.json" in outputs[other][1]
    two = json.loads((tmp_path / f"node{written[0]}" / "train.json").read_text())
    one = json.loads((tmp_path / "one" / "train.json").read_text())
    assert two["losses"] == one["losses"] and two["summary"]["world_size"] == 2
