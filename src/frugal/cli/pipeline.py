"""`frugal pipeline train ...` and `frugal pipeline bench [--quick]`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from frugal.cli.options import add_config_arguments, output_folder

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the `pipeline` subcommand and its children to the top-level subparsers."""
    parser = commands.add_parser(
        "pipeline",
        help="compressed pipeline-parallel training over slow links (AQ-SGD)",
        description="frugal.pipeline: GPipe/1F1B over torch.distributed with activation codecs.",
    )
    children = parser.add_subparsers(dest="pipeline_command", metavar="ACTION")
    children.required = True
    train = children.add_parser(
        "train", help="train a model with one process per stage (torchrun, gloo, 127.0.0.1)"
    )
    train.add_argument(
        "--model",
        default=None,
        choices=["tiny-gpt", "smollm2-135m"],
        help="model to train (smollm2-135m: SmolLM2 from its bundled GGUF, with its preset)",
    )
    train.add_argument("--stages", type=int, default=None, metavar="S", help="pipeline stages")
    train.add_argument(
        "--codec",
        default=None,
        metavar="C",
        help="fp32, fp16, bf16, directq or aqsgd (bits via --fw-bits/--bw-bits, or "
        "directq:fw2,bw4 / aqsgd:fw2,bw4; suffix :row for per-row scales instead of "
        "per-channel, e.g. aqsgd:fw2,bw4:row)",
    )
    train.add_argument("--fw-bits", type=int, default=None, metavar="K", help="activation bits")
    train.add_argument("--bw-bits", type=int, default=None, metavar="J", help="gradient bits")
    link = train.add_mutually_exclusive_group()
    link.add_argument(
        "--bandwidth-mbps", type=float, default=None, metavar="MBPS", help="emulated link speed"
    )
    link.add_argument(
        "--rho",
        default=None,
        metavar="RHO",
        help="transfer/compute ratio, a number or a paper link: 10gbps, 1gbps, 500mbps, "
        "300mbps, 100mbps",
    )
    train.add_argument("--plan", default=None, metavar="FILE", help="planner Plan JSON to run")
    train.add_argument("--steps", type=int, default=None, metavar="N", help="optimizer steps")
    train.add_argument(
        "--dp-compress",
        default=None,
        choices=["none", "fp16", "powersgd", "ef-kbit", "qadam"],
        help="how the data-parallel replicas of a stage (a --plan with DP) agree on gradients",
    )
    train.add_argument(
        "--dp-bits", type=int, default=None, metavar="K", help="bits of ef-kbit / qadam (8)"
    )
    train.add_argument("--out", default="reports/pipeline-train", metavar="DIR", help="folder")
    add_config_arguments(train)
    train.set_defaults(handler=_train)
    bench = children.add_parser(
        "bench",
        help="FP32, fp16, DirectQ and AQ-SGD side by side at five link speeds",
        description=(
            "Without --quick this is the full benchmark (about 40 minutes on 2 cores): 11 "
            "codecs fine-tune the tiny GPT for quality and run 4 gloo ranks at five rho points "
            "for speed, then torch.distributed.pipelining head to head (GPipe and 1F1B), the "
            "data-parallel section (dp.*) and the LLM section (llm.*: pre-trained SmolLM2-135M, "
            "FP32 vs AQ-SGD fw2/bw4 at the slowest link). Settings: --set KEY=VALUE, e.g. "
            "--set llm.enabled=false."
        ),
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="small preset (5 methods, 512 windows, 1 pre-training + 6 epochs; no LLM section)",
    )
    bench.add_argument(
        "--out", default="reports/pipeline", metavar="DIR", help="folder for results.json"
    )
    add_config_arguments(bench)
    bench.set_defaults(handler=_bench)


def _codec(args: argparse.Namespace) -> str | None:
    codec: str | None = args.codec
    if codec in ("directq", "aqsgd"):
        if args.fw_bits is None or args.bw_bits is None:
            raise ValueError(f"--codec {codec} needs --fw-bits and --bw-bits (e.g. 2 and 4)")
        for flag, bits in (("--fw-bits", args.fw_bits), ("--bw-bits", args.bw_bits)):
            if not 1 <= bits <= 8:
                raise ValueError(
                    f"{flag} {bits}: bits must be in 1..8 (e.g. --fw-bits 2 --bw-bits 4)"
                )
        return f"{codec}:fw{args.fw_bits},bw{args.bw_bits}"
    if args.fw_bits is not None or args.bw_bits is not None:
        raise ValueError(
            f"--fw-bits/--bw-bits apply to --codec directq or aqsgd, not {codec or 'fp32'}"
        )
    return codec


def _rho(text: str) -> float:
    from frugal.comm.link import RHO_POINTS

    if text.lower() in RHO_POINTS:
        return RHO_POINTS[text.lower()]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"--rho {text!r}: give a number > 0 or one of {', '.join(RHO_POINTS)}")
    return value


def _train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from frugal.config import config_to_dict, load_config
    from frugal.pipeline.train import PipelineTrainConfig, RunSpec, launch_torchrun, make_layout

    cli: dict[str, Any] = {}
    for key, value in (
        ("model", args.model),
        ("num_stages", args.stages),
        ("codec", _codec(args)),
        ("bandwidth_mbps", args.bandwidth_mbps),
        ("rho", _rho(args.rho) if args.rho is not None else None),
        ("plan", str(Path(args.plan).resolve()) if args.plan else None),
        ("steps", args.steps),
        ("dp_compression", args.dp_compress),
        ("dp_bits", args.dp_bits),
    ):
        if value is not None:
            cli[key] = value
    preset = None
    if args.model == "smollm2-135m":
        from frugal.pipeline.zoo import smollm2_train_config

        preset = config_to_dict(smollm2_train_config())
    base = config_to_dict(
        load_config(PipelineTrainConfig, args.config, args.overrides, base=preset)
    )
    config = load_config(PipelineTrainConfig, base={**base, **cli}, base_source="command line")
    world_size = config.num_stages
    if config.plan:
        from frugal.planner.plan import Plan

        if Path(config.plan).is_dir():
            raise ValueError(f"--plan {args.plan} is a folder; give the plan's JSON file")
        if not Path(config.plan).is_file():
            raise ValueError(
                f"--plan {args.plan}: no such file; write one with `frugal plan --out FILE`"
            )
        try:
            plan = Plan.from_json(Path(config.plan).read_text())
        except ValueError as exc:
            raise ValueError(f"--plan {args.plan}: {exc}") from exc
        if args.stages is not None and args.stages != plan.num_stages:
            raise ValueError(
                f"--stages {args.stages} but the plan has {plan.num_stages} stages; drop "
                "--stages (the plan decides) or plan again"
            )
        world_size = plan.world_size
    layout = make_layout(config, world_size)  # a plan that does not fit fails here
    per_step = sum(layout.num_microbatches) * config.micro_batch_size
    if per_step > config.num_train:
        raise ValueError(
            f"one step needs {per_step} training windows ({sum(layout.num_microbatches)} "
            f"micro-batches of {config.micro_batch_size}) but num_train={config.num_train}; "
            f"raise it (--set num_train={per_step}) or plan a smaller global batch"
        )
    if args.dp_bits is not None and config.dp_compression not in ("ef-kbit", "qadam"):
        raise ValueError(
            f"--dp-bits {args.dp_bits} applies to --dp-compress ef-kbit or qadam, not "
            f"{config.dp_compression} (fp16 sends 16 bits, powersgd a rank-r factorisation); "
            "drop --dp-bits or choose ef-kbit/qadam"
        )
    if config.dp_compression != "none" and layout.num_replicas == 1:
        raise ValueError(
            f"--dp-compress {config.dp_compression} needs data-parallel replicas: give a --plan "
            "with num_replicas >= 2 ("
            + ("this plan has" if config.plan else "the linear layout has")
            + " one pipeline)"
        )
    if config.bandwidth_mbps > 0 or config.latency_ms > 0:  # too slow for the timeout
        import math

        from frugal.comm.message import CodecSpec, message_wire_bytes
        from frugal.pipeline.zoo import boundary_shape

        shape = boundary_shape(config)
        first = message_wire_bytes(CodecSpec.parse(config.codec), 0, shape, num_new=shape[0])
        num_messages = max(layout.num_microbatches)
        transfer_s = 8.0 * first / (config.bandwidth_mbps * 1e6) if config.bandwidth_mbps else 0
        queued_s = num_messages * (transfer_s + config.latency_ms / 1e3)
        if queued_s > config.comm_timeout_s:
            need = f"{queued_s:,.0f}" if queued_s < 1e9 else f"{queued_s:.3g}"
            link = (
                f"at {f'{config.bandwidth_mbps:g} Mbit/s' if transfer_s else 'full speed'} "
                f"and {config.latency_ms:g} ms latency a "
                f"step's {num_messages} first-visit activation messages of {first:,} bytes "
                f"need {need} s on one link, over comm_timeout_s={config.comm_timeout_s:g}"
            )
            if queued_s <= 86_400:
                fix = (
                    "raise the bandwidth, lower latency_ms, or --set "
                    f"comm_timeout_s={math.ceil(2 * queued_s)}"
                )
            else:  # no sensible timeout covers it: the link itself is the mistake
                spare_s = config.comm_timeout_s / num_messages - config.latency_ms / 1e3
                fix = (
                    f"lower latency_ms below {1e3 * config.comm_timeout_s / num_messages:,.0f}"
                    if spare_s <= 0
                    else f"use at least {8.0 * first / (spare_s * 1e6):,.3g} Mbit/s"
                )
            raise ValueError(f"{link}; {fix}")
    if config.init_weights:  # a file that cannot start the model fails here, not in every rank
        from frugal.pipeline.zoo import build_model

        build_model(config)
    out = output_folder(args.out)
    for stale in ("train.json", "loss_curve.png"):  # a failed run must not leave old results
        (out / stale).unlink(missing_ok=True)
    run = RunSpec(
        label=config.codec,
        codec=config.codec,
        steps=config.steps,
        rho=config.rho,
        bandwidth_mbps=config.bandwidth_mbps,
        latency_ms=config.latency_ms,
        dp_compression=config.dp_compression,
        dp_bits=config.dp_bits,
    )
    losses: list[float] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(f"{config.codec}, {world_size} ranks", total=config.steps, loss="-")

        def on_progress(event: dict[str, Any]) -> None:
            if event["run"] != run.label:
                return
            losses.append(float(event["loss"]))
            bar.update(task, completed=event["step"] + 1, loss=f"{event['loss']:.4f}")

        ranks = launch_torchrun(
            config,
            [run],
            out,
            nproc=world_size,
            timeout_s=max(600.0, 30.0 * config.steps),
            on_progress=on_progress,
        )
    last = next(r for r in ranks if r["runs"][0]["eval_loss"] is not None)["runs"][0]
    summary = {
        "codec": config.codec,
        "world_size": world_size,
        "steps": config.steps,
        "final_train_loss": last["losses"][-1],
        "initial_eval_loss": last.get("initial_eval_loss"),
        "eval_loss": last["eval_loss"],
        "bandwidth_bits_per_s": last["bandwidth_bits_per_s"],
        "median_step_s": sorted(last["step_s"])[len(last["step_s"]) // 2],
        "bytes_sent_per_rank": [
            sum(map(sum, r["runs"][0]["activation_bytes"]))
            + sum(map(sum, r["runs"][0]["gradient_bytes"]))
            for r in ranks
        ],
        "dp_compression": config.dp_compression,
        "dp_bytes_last_step_per_rank": [(r["runs"][0]["dp_bytes"] or [0])[-1] for r in ranks],
    }
    (out / "train.json").write_text(json.dumps({"summary": summary, "losses": last["losses"]}))
    _plot_losses(last["losses"], config.codec, out / "loss_curve.png")
    print(json.dumps(summary, indent=1))
    print(f"wrote {out / 'train.json'} and {out / 'loss_curve.png'}", file=sys.stderr)
    return 0


def _plot_losses(losses: list[float], label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bench(args: argparse.Namespace) -> int:
    from frugal.bench.pipeline import PipelineBenchConfig, run_pipeline_bench
    from frugal.config import config_to_dict, load_config

    preset = config_to_dict(PipelineBenchConfig.quick()) if args.quick else None
    config = load_config(PipelineBenchConfig, args.config, args.overrides, base=preset)
    out = output_folder(args.out)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    document = run_pipeline_bench(config, out, progress=progress).document
    print(json.dumps(document["summary"], indent=1))
    print(f"wrote {out / 'results.json'}", file=sys.stderr)
    return 0
