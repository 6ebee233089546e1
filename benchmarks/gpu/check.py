"""One short, prepared check of frugal's pipeline and codecs on one GPU (not run in CI).

    python benchmarks/gpu/check.py                      # one CUDA GPU, a few minutes
    python benchmarks/gpu/check.py --device cpu --tiny  # the same checks, tiny, on the CPU

1. Pipeline: the all-stages-in-one-process path (`frugal.pipeline.train.train_local`) trains a
   GPT-2-small-shaped tiny GPT (12 blocks, d 768, 12 heads, context 512, byte vocabulary,
   random weights, no download) in 2 stages in bfloat16 for `--steps` steps, once per codec
   (fp32 and AQ-SGD fw2/bw4), and prints tokens/s and the loss curve's start and end. A
   2-step float32 run gives the reference first-step loss.
2. Codecs on device tensors (bfloat16 and float32): every codec's round trip keeps dtype and
   device, stays within its error bound, sends the bytes `wire_bytes` promises and the same
   bytes as on the CPU; AQ-SGD's sender and receiver buffers stay on the device and agree;
   encode and decode are timed (median of `--repeats`).
3. A compact JSON summary last (also written to `--out`); the exit status is 1 if any check
   failed, else 0.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from frugal.comm.codecs import (
    ChannelQuantizeCodec,
    DeltaCodec,
    HalfCodec,
    IdentityCodec,
    QuantizeCodec,
)
from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.runtime import LocalTransport
from frugal.pipeline.train import PipelineTrainConfig, train_local

BF16_UNIT_ROUNDOFF = 2.0**-8
"""Rounding into bfloat16 (8 significant bits) moves a value v by at most 2^-8 |v|."""

GPT2_SMALL = TinyGPTConfig(
    context=512, hidden=768, num_heads=12, num_layers=12, activation="gelu_tanh"
)
TINY = TinyGPTConfig(context=32, hidden=64, num_heads=2, num_layers=2)


class Checks:
    """Named pass/fail results, printed as they come."""

    def __init__(self) -> None:
        self.results: dict[str, bool] = {}

    def __call__(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record and print one check; returns `ok`."""
        self.results[name] = bool(ok)
        print(f"  [{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
        return bool(ok)

    @property
    def ok(self) -> bool:
        """Whether every check so far passed."""
        return all(self.results.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm-up (kernels, lookup tables)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check_pipeline(args: argparse.Namespace, checks: Checks) -> dict[str, Any]:
    """Train the model once per codec in `args.dtype`; tokens/s, loss start/end, checks."""
    gpt = TINY if args.tiny else GPT2_SMALL
    base = PipelineTrainConfig(
        gpt=gpt,
        num_stages=2,
        num_train=32 if args.tiny else 256,
        num_eval=8 if args.tiny else 32,
        micro_batch_size=4 if args.tiny else 8,
        num_microbatches=2 if args.tiny else 4,
        steps=args.steps,
        learning_rate=1e-2 if args.tiny else 6e-4,  # 6e-4: GPT-3 small's, stable untuned
        device=args.device,
        dtype=args.dtype,
        drift_check_every=10,
    )
    tokens_per_step = base.micro_batch_size * base.num_microbatches * gpt.context
    print(
        f"pipeline: tiny GPT {gpt.num_layers} blocks, d {gpt.hidden}, context {gpt.context} "
        f"({gpt.num_params / 1e6:.1f} M params), 2 stages, {args.dtype}, {args.device}, "
        f"{tokens_per_step} tokens/step",
        flush=True,
    )
    # Every message between the stages: (header dtype id, device type).
    messages: list[tuple[int, str]] = []
    post = LocalTransport.post

    def record(self: LocalTransport, peer: int, tag: int, header: torch.Tensor, *a: Any, **k: Any):  # type: ignore[no-untyped-def]
        messages.append((int(header[7]), header.device.type))
        return post(self, peer, tag, header, *a, **k)

    LocalTransport.post = record  # type: ignore[method-assign]
    try:
        reference = train_local(_replace(base, steps=2, dtype="float32", codec="fp32"))
        messages.clear()
        runs = []
        for codec in args.codecs:
            stamps: list[float] = []
            t0 = time.perf_counter()
            result = train_local(
                _replace(base, codec=codec),
                progress=lambda step, loss, stamps=stamps: stamps.append(time.perf_counter()),
            )
            step_s = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
            steady = step_s[min(3, len(step_s) - 1) :]  # the first steps build kernels
            tokens_per_s = tokens_per_step / statistics.median(steady)
            losses = result.losses
            run = {
                "codec": codec,
                "tokens_per_s": round(tokens_per_s, 1),
                "median_step_ms": round(statistics.median(steady) * 1e3, 2),
                "loss_first": round(losses[0], 4),
                "loss_last": round(losses[-1], 4),
                "loss_last5_mean": round(statistics.fmean(losses[len(losses) // 2 :][-5:]), 4),
                "eval_loss": round(result.eval_loss, 4),
                "buffer_mib": round(result.buffer_bytes / 2**20, 1),
                "activation_bytes_per_step": sum(result.activation_bytes[0][-1]),
            }
            runs.append(run)
            print(
                f"  {codec}: {tokens_per_s:,.0f} tokens/s ({run['median_step_ms']} ms/step), "
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f} (mean of the last 5: "
                f"{run['loss_last5_mean']}), eval {result.eval_loss:.4f}",
                flush=True,
            )
            checks(f"pipeline {codec}: losses finite", all(math.isfinite(v) for v in losses))
            drop = 0.2 if not args.tiny else 0.05
            checks(
                f"pipeline {codec}: loss decreases",
                run["loss_last5_mean"] < losses[0] - drop,
                f"{losses[0]:.4f} -> {run['loss_last5_mean']:.4f} (mean of the last 5 steps of "
                f"the second half; needs a drop > {drop})",
            )
            gap = abs(losses[0] - reference.losses[0])
            checks(
                f"pipeline {codec}: first-step loss near float32's",
                gap < 0.05,
                f"|{losses[0]:.4f} - {reference.losses[0]:.4f}| = {gap:.4f} < 0.05",
            )
    finally:
        LocalTransport.post = post  # type: ignore[method-assign]
    want = {"float32": 1, "float16": 2, "bfloat16": 3}[args.dtype]
    kinds = sorted(set(messages))
    checks(
        "pipeline: boundary messages in the dtype, on the device",
        bool(messages) and kinds == [(want, torch.device(args.device).type)],
        f"(header dtype id, device) seen: {kinds}",
    )
    return {
        "model_params": gpt.num_params,
        "tokens_per_step": tokens_per_step,
        "float32_first_loss": round(reference.losses[0], 4),
        "runs": runs,
    }


def _replace(config: PipelineTrainConfig, **changes: Any) -> PipelineTrainConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


def check_codecs(args: argparse.Namespace, checks: Checks) -> list[dict[str, Any]]:
    """Round trips, bounds, bytes (device = CPU), dtype, device and timings of every codec."""
    device = torch.device(args.device)
    shape = (4, 32, 64) if args.tiny else (8, 512, 768)  # one micro-batch's boundary tensor
    rows: list[dict[str, Any]] = []
    print(f"codecs: {shape} on {device}", flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        x_cpu = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
        x = x_cpu.to(device)
        codecs = [
            IdentityCodec(),
            HalfCodec(torch.bfloat16),
            HalfCodec(torch.float16),
            QuantizeCodec(2),
            QuantizeCodec(4),
            ChannelQuantizeCodec(2),
            ChannelQuantizeCodec(4),
        ]
        for codec in codecs:
            encoded = codec.encode(x)
            out = codec.decode(encoded)
            label = f"{codec.name} {name}"
            checks(
                f"codec {label}: dtype and device kept",
                out.dtype == dtype and out.device.type == device.type and out.shape == x.shape,
                f"{out.dtype} on {out.device}",
            )
            checks(
                f"codec {label}: wire bytes as promised",
                encoded.nbytes == codec.wire_bytes(shape),
                f"{encoded.nbytes} B",
            )
            cpu = codec.encode(x_cpu)
            same = all(
                torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8))
                for a, b in zip(encoded.tensors, cpu.tensors, strict=True)
            )
            checks(f"codec {label}: same bytes as on the CPU", same)
            error = (out.float() - x.float()).abs()
            if isinstance(codec, QuantizeCodec):
                rows_x = x.float().reshape(-1, shape[-1])
                step = (rows_x.amax(dim=1) - rows_x.amin(dim=1)) / ((1 << codec.bits) - 1)
                bound = step.reshape(*shape[:-1], 1) / 2 + 1e-6
                if dtype != torch.float32:  # the result's one rounding into bfloat16
                    bound = bound + BF16_UNIT_ROUNDOFF * out.float().abs()
                checks(f"codec {label}: error <= step / 2", bool((error <= bound).all()))
            elif isinstance(codec, ChannelQuantizeCodec):
                # Levels code x s / 2^(k-1), code in [-2^(k-1), 2^(k-1) - 1], s the channel's
                # abs-max as fp16: values up to the top level (plus half a step) are within
                # half a step; above it the reference clips (its asymmetric top level).
                half = 1 << (codec.bits - 1)
                step_c = encoded.tensors[0].float() / half
                top = (half - 1) * step_c
                inside = x.float() <= top + step_c / 2
                bound = step_c / 2 + 2.0**-10 * out.float().abs() + 1e-6  # fp16 scale rounding
                if dtype != torch.float32:
                    bound = bound + BF16_UNIT_ROUNDOFF * out.float().abs()
                checks(
                    f"codec {label}: error <= step / 2 below the top level",
                    bool((error <= bound)[inside].all()),
                )
            elif isinstance(codec, IdentityCodec) or (
                isinstance(codec, HalfCodec) and codec.dtype == dtype
            ):
                checks(f"codec {label}: lossless", bool(torch.equal(out, x)))
            encode_ms = _median_ms(lambda c=codec, x=x: c.encode(x), device, args.repeats)
            decode_ms = _median_ms(lambda c=codec, e=encoded: c.decode(e), device, args.repeats)
            rows.append(
                {
                    "codec": codec.name,
                    "dtype": name,
                    "wire_bytes": encoded.nbytes,
                    "max_abs_error": float(error.max()),
                    "encode_ms": round(encode_ms, 3),
                    "decode_ms": round(decode_ms, 3),
                }
            )
            print(
                f"  {label}: {encoded.nbytes:,} B, max error {float(error.max()):.3g}, encode "
                f"{encode_ms:.3f} ms, decode {decode_ms:.3f} ms",
                flush=True,
            )
        rows.append(_check_aqsgd(x, dtype, device, args, checks))
    return rows


def _check_aqsgd(
    x: torch.Tensor, dtype: torch.dtype, device: torch.device, args: argparse.Namespace,
    checks: Checks,
) -> dict[str, Any]:  # fmt: skip
    """AQ-SGD fw2 over 3 visits of the same examples: buffers on the device, in agreement."""
    name = str(dtype).removeprefix("torch.")
    sender, receiver = DeltaCodec(2), DeltaCodec(2)
    ids = torch.arange(x.shape[0])
    gen = torch.Generator().manual_seed(1)
    out = x
    for visit in range(3):
        drift = 0.01 * visit * torch.randn(x.shape, generator=gen).to(device)
        x_visit = (x.float() + drift).to(dtype)
        out = receiver.decode(sender.encode(x_visit, ids, visit), ids, visit)
    assert sender.buffer is not None
    assert receiver.buffer is not None
    table = getattr(sender.buffer, "table", None)
    checks(
        f"aqsgd2 {name}: output dtype and device kept",
        out.dtype == dtype and out.device.type == device.type,
        f"{out.dtype} on {out.device}",
    )
    checks(
        f"aqsgd2 {name}: buffers on the device",
        table is not None and table.device.type == device.type,
        f"{None if table is None else table.device}",
    )
    checks(
        f"aqsgd2 {name}: sender and receiver buffers agree",
        sender.rows_checksum(ids) == receiver.rows_checksum(ids)
        and torch.equal(sender.buffer.peek(ids), receiver.buffer.peek(ids)),
    )
    # Timing only from here: repeated calls move the buffers on, which costs the same.
    x_next = (x.float() + 0.03 * torch.randn(x.shape, generator=gen).to(device)).to(dtype)
    encode_ms = _median_ms(lambda: sender.encode(x_next, ids, 3), device, args.repeats)
    encoded = sender.encode(x_next, ids, 3)
    decode_ms = _median_ms(lambda: receiver.decode(encoded, ids, 3), device, args.repeats)
    print(
        f"  aqsgd2 {name}: {encoded.nbytes:,} B, encode {encode_ms:.3f} ms, decode "
        f"{decode_ms:.3f} ms",
        flush=True,
    )
    return {
        "codec": "aqsgd2",
        "dtype": name,
        "wire_bytes": encoded.nbytes,
        "encode_ms": round(encode_ms, 3),
        "decode_ms": round(decode_ms, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the checks; print and write the JSON summary; 0 if every check passed, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--tiny", action="store_true", help="tiny model and tensors (CPU test)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (50; tiny 8)")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats (20; tiny 2)")
    parser.add_argument(
        "--codecs", nargs="+", default=["fp32", "aqsgd:fw2,bw4"], help="pipeline codecs"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.steps = args.steps or (8 if args.tiny else 50)
    args.repeats = args.repeats or (2 if args.tiny else 20)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA GPU; run on a GPU machine, or use --device cpu "
              "--tiny", file=sys.stderr)  # fmt: skip
        return 2
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(1)
    started = time.perf_counter()
    checks = Checks()
    summary: dict[str, Any] = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "tiny": args.tiny,
    }
    summary["pipeline"] = check_pipeline(args, checks)
    summary["codecs"] = check_codecs(args, checks)
    summary["failed"] = [name for name, ok in checks.results.items() if not ok]
    summary["num_checks"] = len(checks.results)
    summary["ok"] = checks.ok
    summary["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.device == "cuda":
        summary["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    text = json.dumps(summary, separators=(",", ":"))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1))
    print(text)
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
