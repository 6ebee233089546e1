"""One filled-in example of every bench Summary (shared by the harness and reproduce tests)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from frugal.bench.harness import Summary
from frugal.bench.pipeline import PipelineSummary, TorchPipeliningSummary
from frugal.bench.pipeline_dp import DPSectionSummary
from frugal.bench.pipeline_llm import LLMSectionSummary
from frugal.bench.planner import PlannerSummary, PlanValidationSummary
from frugal.bench.recsys import RecsysDatasetSummary, RecsysSummary
from frugal.bench.store import StoreStalenessPoint, StoreSummary, StoreWorkloadSummary
from frugal.bench.tgraph import (
    TgraphDatasetSummary,
    TgraphModelSummary,
    TgraphReferenceSummary,
    TgraphSummary,
)


def store_summary(**changes: Any) -> StoreSummary:
    summary = StoreSummary(
        speedup_vs_rocksdb_offload={"0.1": 4.5},
        speedup_vs_mlkv={"0.1": 1.5},
        fraction_of_ram={"0.25": 0.4},
        bit_identical_at_staleness_0={"criteo_zipf": True, "collegemsg": None},
        staleness_study=[
            StoreStalenessPoint(
                staleness_bound="unbounded", samples_per_s=900.0, final_loss=0.6, staleness_max=8
            )
        ],
        budget_violations=[],
        lookahead=4,
        median_note="samples_per_s = batch samples / median step time after warm-up",
        reference_hit_ratios={"criteo_zipf": {"0.1": {"capacity_rows": 10.0, "lru_demand": 0.5}}},
        workloads={
            "kge_freebase": StoreWorkloadSummary(
                lookahead=4,
                speedup_vs_rocksdb_offload={"0.1": 9.0},
                speedup_vs_mlkv={"0.1": 1.2},
                fraction_of_ram={},
                quality_metric="sampled_mrr",
                quality={"0.1": {"frugal": 0.2, "mlkv": 0.2}},
            )
        },
    )
    return replace(summary, **changes)


def tgraph_summary(**changes: Any) -> TgraphSummary:
    tgn = TgraphModelSummary(
        auc=0.9,
        ap=0.88,
        mrr=None,
        ranking=None,
        sampled_mrr=None,
        inductive_auc=0.85,
        historical_auc=0.7,
        s_per_epoch=1.5,
        train_events_per_s=4000.0,
        num_seeds=2,
    )
    edgebank = replace(tgn, s_per_epoch=None, train_events_per_s=None, num_seeds=1)
    summary = TgraphSummary(
        protocols={"sp_hospital": {"protocol_hash": "ab12", "name": "frugal"}},
        datasets={
            "sp_hospital": TgraphDatasetSummary(
                models={"tgn": tgn, "edgebank": edgebank},
                best_model_by_ap="tgn",
                best_heuristic_by_ap="edgebank",
            )
        },
        tgn_vs_pyg_reference=TgraphReferenceSummary(
            dataset="collegemsg",
            ours_train_events_per_s=4000.0,
            pyg_train_events_per_s=2000.0,
            speedup=2.0,
            error=None,
        ),
    )
    return replace(summary, **changes)


def recsys_summary(**changes: Any) -> RecsysSummary:
    entry = RecsysDatasetSummary(
        auc_gap_hybrid_vs_sync=-0.001,
        throughput_hybrid_over_sync=2.5,
        auc_gap_async_vs_sync=-0.005,
        throughput_async_over_sync=2.6,
        max_abs_auc_gap_hybrid_k_le_16=0.0015,
        max_abs_auc_gap_hybrid_k_le_16_seed_mean=0.0012,
        mean_auc_gap_hybrid_minus_async_k_ge_16=0.0085,
        sync_test_auc=0.7,
        teacher_test_auc=0.8,
    )
    summary = RecsysSummary(
        rtt_ms=5.0,
        staleness=4,
        async_staleness=16,
        datasets={"criteo_zipf": entry},
        staleness_within_bound=True,
        max_staleness_seen=4,
    )
    return replace(summary, **changes)


def pipeline_summary(**changes: Any) -> PipelineSummary:
    summary = PipelineSummary(
        slowest_link="100mbps",
        speedup_at_slowest=3.5,
        speedup_by_link={"10gbps": 1.0, "100mbps": 3.5},
        speedup_monotone=True,
        speedup_range_by_link={"10gbps": [0.95, 1.05], "100mbps": [3.4, 3.6]},
        speedup_monotone_within_noise=True,
        loss_gap_aqsgd_fw2=0.004,
        loss_gap_directq_fw2=0.02,
        loss_gap_ours_fw2=None,
        speedup_at_slowest_ours=None,
        loss_gap_ours_fv8=None,
        loss_gap_ours_ef=None,
        fp32_final_eval_loss=2.0,
        max_sim_gap=0.2,
        median_sim_gap=0.1,
        bytes_match_analytic=True,
        sim_speedup_free_codec_at_slowest=4.0,
        sim_num_cores=2.0,
        calibration_ms=[12.0, 13.0],
        quality_start="fine-tune",
        pretraining={"windows": 32, "steps": 2},
    )
    return replace(summary, **changes)


def plan_validation_summary(**changes: Any) -> PlanValidationSummary:
    summary = PlanValidationSummary(
        tau_ref_s=0.01,
        compute_share=0.5,
        compute_sharing="cores",
        sim_vs_measured_max_error=0.25,
        analytic_vs_measured_max_error=0.3,
        unshared_sim_vs_measured_max_error=0.4,
        replay_sim_vs_measured_max_error=0.1,
        replay_analytic_vs_measured_max_error=0.2,
        predicted_ranking=["ours", "megatron_default"],
        analytic_ranking=["ours", "megatron_default"],
        measured_ranking=["ours", "megatron_default"],
        ranking_matches=True,
        analytic_ranking_matches=True,
        all_executed_as_planned=True,
    )
    return replace(summary, **changes)


def planner_summary(**changes: Any) -> PlannerSummary:
    summary = PlannerSummary(
        speedup_of_ours={"world/L24/B1024/vs_megatron_random": 5.0},
        world_speedup_vs_megatron_random=5.0,
        search_s_world=2.0,
        world_speedup_vs_megatron_random_by_cell={"L24/B1024": 5.0},
        objective="iteration (analytic GPipe model; see frugal.planner.iteration)",
        convergence_paper_cost={"world/ours": 5.0},
        convergence_memetic_vs_swap={"world": 1.1},
        convergence_gap_of_ours={"world": 0.05},
        validation=plan_validation_summary(),
        sim_vs_measured_max_error=0.25,
    )
    return replace(summary, **changes)


def every_summary() -> list[Summary]:
    """One of each Summary class, nested sections filled in."""
    torch = TorchPipeliningSummary(
        torch_pipelining_tokens_per_s={"gpipe": 100.0},
        fp32_head_to_head_tokens_per_s_by_schedule={"gpipe": 120.0},
        speedup_vs_torch_pipelining_by_schedule={"gpipe": 1.2},
        fp32_unshaped_tokens_per_s=130.0,
        fp32_head_to_head_tokens_per_s=120.0,
        speedup_vs_torch_pipelining=1.2,
        torch_pipelining_skipped=None,
    )
    dp = DPSectionSummary(
        dp_setup="2 stages x 2 replicas",
        dp_speedup_at_slowest=2.5,
        dp_speedup_aqsgd_only_at_slowest=2.0,
        dp_bytes_match_analytic=True,
    )
    llm = LLMSectionSummary(
        llm_model="smollm2-135m",
        llm_slowest_link="100mbps",
        llm_speedup_at_slowest=3.2,
        llm_speedup_range=[3.0, 3.4],
        llm_tokens_per_s={"fp32@100mbps": 10.0},
        llm_calibration_ms=[40.0],
        llm_bytes_match_analytic=True,
        llm_layers=[8, 8, 7, 7],
    )
    full_pipeline = PipelineSummary(
        **(pipeline_summary().to_dict() | torch.to_dict() | dp.to_dict() | llm.to_dict())
    )
    return [
        store_summary(),
        tgraph_summary(),
        tgraph_summary(tgn_vs_pyg_reference=None),
        recsys_summary(),
        pipeline_summary(),
        full_pipeline,
        torch,
        dp,
        llm,
        plan_validation_summary(),
        planner_summary(),
        planner_summary(validation=None, sim_vs_measured_max_error=None),
    ]
