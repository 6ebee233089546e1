"""Worker of tests/comm/test_collectives.py (torchrun, 3 gloo ranks): writes rank{r}.json.

1. Every plan collective sums the same dyadic vector (exact arithmetic, 7 values: not a
   multiple of 3, so `seq_peer` pads) over all 3 ranks and over the group {1, 2} (whose
   lowest rank, the `central_ps` server, is not 0).
2. `GradientSync` of a user-registered method ("fp32-copy", the plain float32 sum registered
   from outside the package) on each collective, against the built-in "none".
3. The same sums as messages through emulated links (`ShapedGroup`, 80 Mbit/s and 1 ms on
   every pair), with the bytes each member sent; and `GradientSync` of each DP method shaped
   against unshaped.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from frugal.comm.collectives import COLLECTIVES
from frugal.comm.gradcomp import GradientSync, NoCompressionMethod, register_dp_method
from frugal.comm.link import LinkSpec, link_table
from frugal.comm.shaped import ShapedGroup


class Fp32Copy(NoCompressionMethod):
    """The plain float32 sum under another name."""

    description = "a copy of none"


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=30)
    dist.init_process_group("gloo", timeout=timeout)
    groups = {"all": dist.new_group([0, 1, 2], timeout=timeout)}
    groups["upper"] = dist.new_group([1, 2], timeout=timeout)  # every rank creates every group
    register_dp_method("fp32-copy", Fp32Copy())
    result: dict[str, object] = {"rank": rank}

    # 1. Each collective's sum of x_r = (r + 1) / 8 * [1, -2, 3, -4, 5, -6, 7].
    x = torch.tensor([1.0, -2, 3, -4, 5, -6, 7]) * (rank + 1) / 8
    sums: dict[str, dict[str, list[float]]] = {}
    for label, group in groups.items():
        if label == "upper" and rank == 0:
            continue
        sums[label] = {}
        for name in COLLECTIVES:
            flat = x.clone()
            COLLECTIVES.get(name).sum_(flat, group, what=name, timeout_s=30.0)
            sums[label][name] = flat.tolist()
    result["sums"] = sums

    # 2. GradientSync of fp32-copy and none on each collective, 2 steps of a small model.
    syncs: dict[str, list[object]] = {}
    for method in ("none", "fp32-copy"):
        for name in COLLECTIVES:
            torch.manual_seed(0)
            model = torch.nn.Linear(5, 3)
            sync = GradientSync(method, list(model.parameters()), groups["all"], collective=name)
            data = torch.Generator().manual_seed(100 + rank)
            rows = []
            for step in range(2):
                model.zero_grad()
                model(torch.randn(4, 5, generator=data)).pow(2).mean().backward()
                sent = sync.step(step)
                grads = torch.cat(
                    [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
                )
                rows.append(
                    {"bytes": sent, "analytic": sync.wire_bytes(step), "grads": grads.tolist()}
                )
            syncs[f"{method}/{name}"] = rows
    result["syncs"] = syncs

    # 3. Shaped: the same sums as messages, and each DP method shaped vs unshaped.
    links = link_table(3, LinkSpec(bandwidth_bits_per_s=80e6, latency_s=0.001), {})
    shaped_sums: dict[str, dict[str, object]] = {}
    for label, group in groups.items():
        if label == "upper" and rank == 0:
            continue
        shaped_sums[label] = {}
        for name in COLLECTIVES:
            shaped = ShapedGroup(group, links, timeout_s=30.0)
            flat = x.clone()
            COLLECTIVES.get(name).shaped_sum_(flat, shaped, what=name)
            shaped_sums[label][name] = {
                "sum": flat.tolist(),
                "sent": sum(shaped.sent_bytes.values()),
            }
            shaped.close()
    result["shaped_sums"] = shaped_sums
    shaped_syncs: dict[str, object] = {}
    for method in ("none", "fp16", "ef-kbit", "qadam", "powersgd"):
        grads_by_mode = {}
        for mode in ("plain", "shaped"):
            torch.manual_seed(0)
            model = torch.nn.Linear(5, 3)
            shaped = ShapedGroup(groups["all"], links, timeout_s=30.0) if mode == "shaped" else None
            sync = GradientSync(
                method, list(model.parameters()), groups["all"], warmup_steps=1, shaped=shaped
            )
            data = torch.Generator().manual_seed(100 + rank)
            rows = []
            for step in range(3):
                model.zero_grad()
                model(torch.randn(4, 5, generator=data)).pow(2).mean().backward()
                sync.step(step)
                if sync.owns_optimizer:
                    sync.apply()
                # What the replicas agree on: the summed gradients, or qadam's weights.
                agreed = [p if sync.owns_optimizer else p.grad for p in model.parameters()]
                rows.append([v for t in agreed for v in t.detach().reshape(-1).tolist()])
            grads_by_mode[mode] = rows
            sync.close()
        shaped_syncs[method] = grads_by_mode
    result["shaped_syncs"] = shaped_syncs
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
