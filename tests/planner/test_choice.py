"""The planner chooses what a workload leaves open and records it in the plan.

Codec, schedule and micro-batches per step; an explicit value pins its setting.
"""

from __future__ import annotations

import numpy as np
import pytest

from frugal.planner.choice import (
    codec_candidates,
    microbatch_candidates,
    price,
    reference_workload,
)
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.topology import Device, Topology

AQSGD = ("fp16", "aqsgd:fw2,bw4", "aqsgd:fw4,bw8")


def _two_sites(gbps: float = 0.1) -> Topology:
    """4 devices, 2 per site: 10 Gbps inside a site, `gbps` and 20 ms between sites."""
    devices = tuple(Device(name=f"d{i}", host=f"h{i}", site="ab"[i // 2]) for i in range(4))
    site = np.array([0, 0, 1, 1])
    same = site[:, None] == site[None, :]
    return Topology(
        devices=devices,
        delay_ms=np.where(same, 1.0, 20.0),
        bandwidth_gbps=np.where(same, 10.0, gbps),
    )


def _workload(**settings: object) -> WorkloadConfig:
    base = {"num_layers": 4, "hidden_size": 256, "seq_len": 256, "global_batch_size": 32,
            "microbatch_size": 2, "microbatches_per_step": 8, "tau_ref_s": 0.002}  # fmt: skip
    return WorkloadConfig(**{**base, **settings})  # type: ignore[arg-type]


def test_candidates_by_hand() -> None:
    # 32 sequences over 2 replicas in micro-batches of 2: 8 per replica per iteration, so M is
    # one of its divisors 8, 4, 2, 1; the reference is the largest <= 64.
    open_m = _workload(microbatches_per_step=0)
    assert microbatch_candidates(open_m, 2) == (8, 4, 2, 1)
    assert microbatch_candidates(_workload(), 2) == (8,)
    assert reference_workload(open_m, 2).microbatches_per_step == 8
    # bf16 ties fp16 (same bytes) and fp32 is larger both ways: only fp16 is priced.
    assert codec_candidates(_workload(codec="auto")) == ("fp16",)
    # One epoch: AQ-SGD's forward is the fp32 first visit (4 B a value against fp16's 2) but
    # its backward is 4 or 8 bits, so fp16 and fw2,bw4 each win one way; fw2,bw4 beats
    # fw4,bw8 (same forward, smaller backward).
    one = _workload(codec="auto", codec_candidates=AQSGD)
    assert codec_candidates(one) == ("fp16", "aqsgd:fw2,bw4")
    # Ten epochs: fw2,bw4 beats fp16 and fw4,bw8 both ways.
    many = _workload(codec="auto", codec_candidates=AQSGD, num_epochs=10)
    assert codec_candidates(many) == ("aqsgd:fw2,bw4",)
    ref = reference_workload(_workload(codec="auto", schedule="auto"), 2)
    assert (ref.codec, ref.schedule) == ("fp16", "1f1b")  # 1F1B: fewest activations held


def test_build_plan_records_the_cheapest_choice_and_a_pinned_value_stays() -> None:
    top = _two_sites()
    grid = {"num_stages": 2, "num_replicas": 2, "budget": 50}
    pinned = build_plan(top, PlannerConfig(**grid, workload=_workload()))  # type: ignore[arg-type]
    assert (pinned.codec, pinned.schedule) == ("fp16", "gpipe")
    assert pinned.num_microbatches_per_replica == (8, 8)
    open_all = _workload(codec="auto", schedule="auto", microbatches_per_step=0, num_epochs=10,
                         codec_candidates=AQSGD)  # fmt: skip
    chosen = build_plan(top, PlannerConfig(**grid, workload=open_all))  # type: ignore[arg-type]
    assert chosen.codec == "aqsgd:fw2,bw4"  # 10 epochs: its deltas pay on a 0.1 Gbps link
    assert chosen.predicted_cost_s < pinned.predicted_cost_s
    assert chosen.schedule in ("gpipe", "1f1b") and len(chosen.dp_collective) == 2
    # The recorded choice is what the plan's prediction prices, and no candidate is cheaper.
    resolved = _workload(codec=chosen.codec, schedule=chosen.schedule, num_epochs=10,
                         microbatches_per_step=chosen.num_microbatches_per_replica[0])  # fmt: skip
    mesh = np.array(chosen.mesh)
    again = price(top, mesh, chosen.num_layers_per_stage, resolved)
    assert again.total_s == pytest.approx(chosen.predicted_cost_s)
    assert again.collective == chosen.dp_collective
    for codec in AQSGD:
        for schedule in ("gpipe", "1f1b"):
            for m in (8, 4, 2, 1):
                other = _workload(codec=codec, schedule=schedule, microbatches_per_step=m,
                                  num_epochs=10)  # fmt: skip
                cost = price(top, mesh, chosen.num_layers_per_stage, other).total_s
                assert cost >= chosen.predicted_cost_s - 1e-12
    # One epoch, same link: AQ-SGD's fp32 first visits cost more than they save here.
    once = build_plan(top, PlannerConfig(**grid, workload=_workload(  # type: ignore[arg-type]
        codec="auto", codec_candidates=AQSGD)))  # fmt: skip
    assert once.codec == "fp16"


def test_candidates_given_with_a_pinned_codec_warn() -> None:
    workload = _workload(codec_candidates=AQSGD)
    with pytest.warns(UserWarning, match="codec_candidates=.* is ignored"):
        build_plan(_two_sites(), PlannerConfig(num_stages=2, num_replicas=2, budget=5,
                                               workload=workload))  # fmt: skip
