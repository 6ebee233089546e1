"""`frugal pipeline train ...` and `frugal pipeline bench [--quick]`."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.cli.bench import BenchEntry, add_bench
from frugal.cli.options import (
    add_config_arguments,
    add_force_argument,
    add_overwrite_argument,
    output_folder,
    refuse_earlier_output,
    with_config,
)
from frugal.config import ConfigError

if TYPE_CHECKING:
    from frugal.pipeline.train import PipelineTrainConfig
    from frugal.registry import Registry

__all__ = ["add_actions", "train_config"]


class _RegistryNames:
    """A flag's choices: the names in a registry (`--model`, `--dp-compress`).

    Read only when an argument is checked or help is shown (the registries import torch), so
    building the parser stays fast.

    Args:
        module: The module that holds the registry, e.g. "frugal.pipeline.zoo".
        registry: Its name there, e.g. "MODELS".
    """

    def __init__(self, module: str, registry: str) -> None:
        self._module, self._registry = module, registry

    def _names(self) -> Registry[Any]:
        names: Registry[Any] = getattr(importlib.import_module(self._module), self._registry)
        return names

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names().names())


def add_actions(children: Any) -> None:
    """Add the actions of `frugal pipeline` to its subparsers."""
    train = children.add_parser(
        "train",
        help="train a model with one process per stage (torchrun; gloo on CPU, NCCL on GPUs)",
    )
    train.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        choices=_RegistryNames("frugal.pipeline.zoo", "MODELS"),
        help="model to train, one of %(choices)s (smollm2-135m: SmolLM2 from its bundled "
        "GGUF, with its preset)",
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
        "--device",
        default=None,
        choices=("auto", "cpu", "cuda"),
        help="where the stages run: cpu (gloo), cuda (rank r on GPU "
        "cuda:LOCAL_RANK, NCCL; each process of a machine needs a GPU of its own) or auto "
        "(cuda when that holds, else cpu)",
    )
    train.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="compute and activation dtype (autocast; weights, optimizer state and loss stay "
        "float32; float16 adds a static loss scale)",
    )
    train.add_argument(
        "--dp-compress",
        default=None,
        choices=_RegistryNames("frugal.comm.gradcomp", "DP_METHODS"),
        help="how the data-parallel replicas of a stage (a --plan with DP) agree on gradients",
    )
    train.add_argument(
        "--dp-bits", type=int, default=None, metavar="K", help="bits of ef-kbit / qadam (8)"
    )
    train.add_argument("--out", default="reports/pipeline-train", metavar="DIR", help="folder")
    train.add_argument(
        "--nnodes",
        type=int,
        default=1,
        metavar="N",
        help="machines in the job; run the same command on each, with the same --rdzv-endpoint",
    )
    train.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="rendezvous address every machine reaches (with --nnodes > 1)",
    )
    add_overwrite_argument(train, "train.json")
    add_force_argument(train)
    add_config_arguments(train)
    train.set_defaults(handler=_train)
    add_bench(
        children,
        _bench,
        help="FP32, fp16, DirectQ and AQ-SGD side by side at five link speeds",
        description=(
            "Without --quick this is the full benchmark (about 40 minutes on 2 cores): 11 "
            "codecs fine-tune the tiny GPT for quality and run 4 gloo ranks at five rho points "
            "for speed, then torch.distributed.pipelining head to head (GPipe and 1F1B), the "
            "data-parallel section (dp.*) and the LLM section (llm.*: pre-trained SmolLM2-135M, "
            "FP32 vs AQ-SGD fw2/bw4 at the slowest link). Settings: --set KEY=VALUE, e.g. "
            "--set llm.enabled=false."
        ),
        quick_help="small preset (5 methods, 512 windows, 1 pre-training + 6 epochs; no LLM "
        "section)",
        out="reports/pipeline",
    )


def _codec(args: argparse.Namespace) -> str | None:
    codec: str | None = args.codec
    if codec in ("directq", "aqsgd"):
        if args.fw_bits is None or args.bw_bits is None:
            raise ConfigError(f"--codec {codec} needs --fw-bits and --bw-bits (e.g. 2 and 4)")
        for flag, bits in (("--fw-bits", args.fw_bits), ("--bw-bits", args.bw_bits)):
            if not 1 <= bits <= 8:
                raise ConfigError(
                    f"{flag} {bits}: bits must be in 1..8 (e.g. --fw-bits 2 --bw-bits 4)"
                )
        return f"{codec}:fw{args.fw_bits},bw{args.bw_bits}"
    if args.fw_bits is not None or args.bw_bits is not None:
        raise ConfigError(
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
        raise ConfigError(f"--rho {text!r}: give a number > 0 or one of {', '.join(RHO_POINTS)}")
    return value


def train_config(args: argparse.Namespace) -> PipelineTrainConfig:
    """The `PipelineTrainConfig` of parsed `pipeline train` arguments.

    The model's preset (`--model smollm2-135m`), then `--config` and `--set`, then the flags.

    Raises:
        ConfigError: On an invalid setting or flags that contradict each other.
    """
    from frugal.config import load_config
    from frugal.pipeline.train import PipelineTrainConfig

    flags = {
        "model": args.model,
        "num_stages": args.stages,
        "codec": _codec(args),
        "bandwidth_mbps": args.bandwidth_mbps,
        "rho": _rho(args.rho) if args.rho is not None else None,
        "plan": str(Path(args.plan).resolve()) if args.plan else None,
        "steps": args.steps,
        "dp_compression": args.dp_compress,
        "dp_bits": args.dp_bits,
        "device": args.device,
        "dtype": args.dtype,
    }
    preset = None
    if args.model is not None:
        from frugal.pipeline.zoo import MODELS

        make_preset = MODELS.get(args.model).preset
        preset = make_preset() if make_preset is not None else None
    config = load_config(PipelineTrainConfig, args.config, args.overrides, base=preset, flags=flags)
    if args.dp_bits is not None:
        from frugal.comm.gradcomp import DP_METHODS

        method = DP_METHODS.get(config.dp_compression)
        if not method.uses_bits:
            users = [name for name in DP_METHODS if DP_METHODS.get(name).uses_bits]
            raise ConfigError(
                f"--dp-bits {args.dp_bits} applies to --dp-compress {' or '.join(users)}, not "
                f"{config.dp_compression} ({method.description}); drop --dp-bits or choose "
                f"{'/'.join(users)}"
            )
    return config


@with_config(train_config)
def _train(args: argparse.Namespace, config: PipelineTrainConfig) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from frugal.launch import check_job
    from frugal.pipeline.job import check_nodes, check_training, run_training

    job = check_training(config, num_stages=args.stages)
    nproc = check_nodes(job, args.nnodes)
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError(
            f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT, an address every machine "
            "reaches (the same on all of them)"
        )
    out = output_folder(args.out)
    refuse_earlier_output(out / "train.json", args)
    memory = job.memory.per_machine(args.nnodes)
    check_job(nproc, memory, force=args.force)  # before the progress bar
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(f"{config.codec}, {job.world_size} ranks", total=config.steps, loss="-")

        def on_step(step: int, loss: float) -> None:
            bar.update(task, completed=step + 1, loss=f"{loss:.4f}")

        summary = run_training(
            job,
            out,
            on_step=on_step,
            force=args.force,
            nnodes=args.nnodes,
            rdzv_endpoint=args.rdzv_endpoint,
        )
    if summary is None:
        print(
            f"this machine's {nproc} ranks finished; the machine of global rank 0 writes "
            "train.json",
            file=sys.stderr,
        )
        return 0
    print(json.dumps(asdict(summary), indent=1))
    print(f"wrote {out / 'train.json'} and {out / 'loss_curve.png'}", file=sys.stderr)
    return 0


def _bench() -> BenchEntry:
    from frugal.bench.pipeline import PipelineBenchConfig, run_pipeline_bench

    return BenchEntry(
        config_class=PipelineBenchConfig, quick=PipelineBenchConfig.quick, run=run_pipeline_bench
    )
