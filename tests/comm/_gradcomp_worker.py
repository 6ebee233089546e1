"""Worker of tests/comm/test_gradcomp.py (run by torchrun, 2 gloo ranks): writes rank{r}.json.

1. The sharded k-bit exchange on hand-picked vectors (step 0) and on random dyadic vectors
   (exact arithmetic): per-step outputs and the final worker and server residuals.
2. `GradientSync` of every method on a small two-layer model: bytes handed to the
   collectives per step, the synchronised gradients and the qadam parameters.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from frugal.comm.gradcomp import DP_METHODS, GradientSync, ShardedExchange


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=30))
    result: dict[str, object] = {"rank": rank}

    # 1. Exchange: 2 bits, buckets of 2, float32 residuals (exact for dyadic inputs).
    exchange = ShardedExchange(4, group, bits=2, bucket_size=2, residual_dtype=torch.float32)
    first = [[1.0, -0.5, 0.25, 0.5], [0.5, 0.5, -1.0, 0.25]][rank]
    gen = torch.Generator().manual_seed(rank)
    inputs = [torch.tensor(first)] + [
        torch.randint(-8, 9, (4,), generator=gen).float() / 8 for _ in range(5)
    ]
    outputs, nbytes = [], []
    for step, x in enumerate(inputs):
        mean, sent = exchange.mean(x, step)
        outputs.append(mean.tolist())
        nbytes.append(sent)
    result["exchange"] = {
        "inputs": [x.tolist() for x in inputs],
        "outputs": outputs,
        "bytes": nbytes,
        "chunk_bytes": exchange.chunk_bytes,
        "worker_residual": exchange.worker.residual.tolist(),
        "server_residual": exchange.server.residual.tolist(),
    }

    # 2. GradientSync of every method on a small model; each rank its own data.
    syncs = {}
    for method in DP_METHODS:
        torch.manual_seed(0)
        layers = (torch.nn.Linear(64, 48), torch.nn.Tanh(), torch.nn.Linear(48, 8))
        model = torch.nn.Sequential(*layers)
        sync = GradientSync(
            method, list(model.parameters()), group, bits=8, warmup_steps=1, learning_rate=1e-2
        )
        data = torch.Generator().manual_seed(100 + rank)
        rows = []
        for step in range(4):
            model.zero_grad()
            x = torch.randn(16, 64, generator=data)
            (model(x).pow(2).mean() / 2).backward()  # / 2: two replicas, sum = mean
            local = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]
            exact = local.clone()
            dist.all_reduce(exact, group=group)
            reference = copy.deepcopy(model)  # torch's AdamW on the exact summed gradient
            offset = 0
            for p in reference.parameters():
                p.grad = exact[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0).step()
            sent = sync.step(step)
            if sync.owns_optimizer:
                sync.apply()
                after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            else:
                after = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]
            rows.append(
                {
                    "bytes": sent,
                    "analytic": sync.wire_bytes(step),
                    "after": after.tolist(),
                    "exact_sum": exact.tolist(),
                    "adamw_first_step": torch.cat(
                        [p.detach().reshape(-1) for p in reference.parameters()]
                    ).tolist(),
                }
            )
        syncs[method] = rows
    result["sync"] = syncs
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
