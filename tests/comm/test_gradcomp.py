"""DP gradient compression: the bucket quantizer, error feedback, wire bytes, and 2 gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from frugal.comm.gradcomp import (
    BucketQuantizer,
    ErrorFeedback,
    dp_wire_bytes,
    powersgd_numel,
)
from frugal.launch import TorchrunJob, run_torchrun

WORKER = Path(__file__).with_name("_gradcomp_worker.py")
SHAPES = [(48, 64), (48,), (8, 48), (8,)]  # the worker's two-layer model


def test_bucket_quantizer_payload_layout_and_error_bound() -> None:
    q = BucketQuantizer(8, bucket_size=512)
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0))
    payload, x_hat = q.encode(x)
    # 1,024 values = 2 columns of 512: 2 fp16 scales (4 B) + 1,024 one-byte codes.
    assert payload.numel() == q.payload_bytes(1024) == 4 + 1024
    assert torch.equal(q.decode(payload, 1024), x_hat)
    # Reference layout: column j = values j, j + 2, j + 4, ... (strided), abs-max scale.
    amax = x.view(512, 2).abs().amax(dim=0)
    scale = amax.half().float()  # the fp16 scale that travels
    error = (x - x_hat).abs().view(512, 2)
    # One step s / 2^(k-1) at most (the top code is clipped), plus the scale's fp16 rounding.
    assert bool((error <= scale / 128 + (amax - scale).abs() + 1e-6).all())
    with pytest.raises(ValueError, match="multiple of bucket_size"):
        q.payload_bytes(1000)


def test_error_feedback_by_hand() -> None:
    # 2 bits, one scale for the four values: levels -s, -s/2, 0, s/2 (round half to even).
    ef = ErrorFeedback(BucketQuantizer(2, bucket_size=4), 4)
    x = torch.tensor([1.0, -1.0, 0.25, 0.0])
    _, sent1 = ef.compress(x)  # s = 1: 1 -> s/2 (top level), 0.25 * 2 = 0.5 -> 0
    assert sent1.tolist() == [0.5, -1.0, 0.0, 0.0]
    assert ef.residual.tolist() == [0.5, 0.0, 0.25, 0.0]
    _, sent2 = ef.compress(x)  # x + e = [1.5, -1, 0.5, 0], s = 1.5, step 0.75
    assert sent2.tolist() == [0.75, -0.75, 0.75, 0.0]
    assert ef.residual.tolist() == [0.75, -0.25, -0.25, 0.0]
    # Invariant: what was sent plus what is owed equals what was given.
    assert (sent1 + sent2 + ef.residual.float()).tolist() == (2 * x).tolist()


def test_wire_bytes_by_hand() -> None:
    # PowerSGD rank 1: (48, 64) -> P 48 + Q 64; (8, 48) -> 8 + 48; vectors stay as they are
    # ((n + 1) x 2 >= n): 112 + 48 + 56 + 8 = 224 values.
    assert powersgd_numel(SHAPES, 1) == 224
    n = 48 * 64 + 48 + 8 * 48 + 8  # 3,512
    assert dp_wire_bytes("none", SHAPES, 2, 5) == 4 * n
    assert dp_wire_bytes("fp16", SHAPES, 2, 5) == 2 * n
    assert dp_wire_bytes("powersgd", SHAPES, 2, 1) == 4 * n  # torch's hook starts at iter 2
    assert dp_wire_bytes("powersgd", SHAPES, 2, 2) == 4 * 224
    # qadam / ef-kbit, K = 2, 8 bits, buckets of 512: padded to 4,096, chunks of 2,048:
    # 4 fp16 scales + 2,048 codes = 2,056 B per chunk, S = 2 x 2,056.
    assert dp_wire_bytes("qadam", SHAPES, 2, 3, warmup_steps=1) == 2 * 2056
    assert dp_wire_bytes("qadam", SHAPES, 2, 0, warmup_steps=1) == 4 * n
    # 4 bits: 4 scales + 2,048 x 4 bits per chunk.
    assert dp_wire_bytes("ef-kbit", SHAPES, 2, 0, bits=4) == 2 * (8 + 1024)
    with pytest.raises(ValueError, match="choose one of"):
        dp_wire_bytes("topk", SHAPES, 2, 0)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_two_gloo_ranks_exchange_and_sync(tmp_path: Path) -> None:
    result = run_torchrun(
        TorchrunJob([str(WORKER), str(tmp_path)], nproc=2, timeout_s=200, module=False)
    )
    assert result.ok, result.format()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    a, b = (r["exchange"] for r in ranks)
    # Step 0 by hand (2 bits, buckets of 2, chunk 0 on rank 0, chunk 1 on rank 1):
    # workers send [.5, -.5 | .25, .25] and [.25, .25 | -1, 0]; servers average to
    # [.375, -.125] and [-.375, .125] and send them at 2 bits with s = .375.
    assert a["outputs"][0] == b["outputs"][0] == [0.1875, -0.1875, -0.375, 0.1875]
    assert a["outputs"] == b["outputs"]  # every rank decodes the same bytes
    # Two-sided error feedback: sum of outputs + server residuals + mean worker residual
    # = sum of the true means (dyadic inputs, float32 residuals: exact).
    out = torch.tensor(a["outputs"]).sum(0)
    server = torch.tensor(a["server_residual"] + b["server_residual"])
    worker = (torch.tensor(a["worker_residual"]) + torch.tensor(b["worker_residual"])) / 2
    truth = (torch.tensor(a["inputs"]) + torch.tensor(b["inputs"])).sum(0) / 2
    assert torch.equal(out + server + worker, truth)
    assert a["chunk_bytes"] == 2 + 1 and a["bytes"] == [6] * 6  # 1 fp16 scale + 4 x 2 bits

    for method in ("none", "fp16", "powersgd", "ef-kbit", "qadam"):
        rows = [r["sync"][method] for r in ranks]
        for step, (x, y) in enumerate(zip(*rows, strict=True)):
            assert x["bytes"] == x["analytic"] == y["bytes"], (method, step)
            assert x["after"] == y["after"], (method, step)  # replicas stay identical
            got, exact = torch.tensor(x["after"]), torch.tensor(x["exact_sum"])
            if method == "none" or (method in ("ef-kbit", "powersgd") and step == 0):
                torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-7)
            # fp16 rounds each value (~1e-3 relative); 8 bits with error feedback carry the
            # previous step's residual into this one (a few % per step, zero on average).
            if method == "qadam" and step == 0:  # warm-up: exactly torch's AdamW step
                first = torch.tensor(x["adamw_first_step"])
                torch.testing.assert_close(got, first, rtol=1e-6, atol=1e-7)
            bound = {"fp16": 2e-3, "ef-kbit": 0.06}.get(method)
            if bound is not None:
                assert float((got - exact).norm() / exact.norm()) < bound, (method, step)


def test_qadam_update_is_adam_with_frozen_variance_and_a_clipped_ratio() -> None:
    from frugal.comm.gradcomp import qadam_update

    # t = 3 Adam steps, w = 1 variance step; lr 0.01. Element 0: m 0.02, v 4e-7 ->
    # m_hat = 0.02 / (1 - 0.9^3) = 0.073801, v_hat = 4e-7 / 0.001 = 4e-4, sqrt 0.02 ->
    # ratio 3.69004 (under the bound). Element 1: v = 0 (never a gradient in the warm-up):
    # m / eps would be 7.4e6; clipped to the Adam bound 7.2703. Element 2: m = 0 -> 0.
    m = torch.tensor([0.02, -0.02, 0.0])
    v = torch.tensor([4e-7, 0.0, 1e-6])
    update = qadam_update(m, v, adam_steps=3, variance_steps=1, learning_rate=0.01)
    expected_first = -0.01 * (0.02 / (1 - 0.9**3)) / ((4e-7 / 0.001) ** 0.5 + 1e-8)
    torch.testing.assert_close(
        update, torch.tensor([expected_first, 0.072703, 0.0]), rtol=1e-5, atol=1e-9
    )
    assert torch.isfinite(update).all()
