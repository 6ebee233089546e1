"""Check frugal's KGE quality against PyKEEN's own training of the same models (not run in CI).

PyKEEN is not a frugal dependency; install it beside the pinned torch and frugal, then run:

    python3.11 -m venv /tmp/pykeen-venv
    /tmp/pykeen-venv/bin/pip install torch==2.13.0 pykeen==1.11.1 tomli-w rich
    /tmp/pykeen-venv/bin/pip install -e . --no-deps
    /tmp/pykeen-venv/bin/python benchmarks/store/check_kge_against_pykeen.py --seeds 0 1

For each dataset (UMLS, Kinships: the files inside the pykeen wheel, which
`frugal.data.load_triples` reads too) and model (DistMult, ComplEx, TransE) it trains

- frugal: `frugal.store.kge.train_kge`, entity rows in an on-disk `EmbeddingStore` (1 MiB
  cache, lookahead 4, as `examples/store_kge.py`), relations in a `RamTable`;
- PyKEEN "matched": `pykeen.pipeline.pipeline`, sLCWA, `BasicNegativeSampler`, Adagrad, with
  the loss, initialisation and constraints set to frugal's: `NSSALoss(margin=0 (TransE: gamma),
  adversarial_temperature=0)` is exactly `-(mean log sigma(pos) + mean log sigma(-neg)) / 2`
  (uniform weights over the negatives), rows uniform in [-1/sqrt(D), 1/sqrt(D)), no entity
  constrainer, no regularizer;
- PyKEEN "softplus" (`--variants`): "matched" with `SoftplusLoss`, the mean over all positive
  and negative scores, so positives weigh 1/(1 + num_negs_per_pos) of the loss, not 1/2;
- PyKEEN "defaults" (`--variants`): "softplus" with PyKEEN's own initialisers and constrainers
  (DistMult and TransE renormalise entities to unit length after every step), no regularizer;
- frugal "frugal-elementwise" (`--variants`, a diagnostic): frugal with element-wise Adagrad
  rows (`kind="adagrad"`, D accumulators per row) instead of its row-wise Adagrad;

with the same dimension (floats per row: PyKEEN's ComplEx gets D/2 complex numbers), batch
size, number of steps (epochs x full batches; the last partial batch is dropped by both) and
learning rate. Both are evaluated with filtered ranks over head and tail ("realistic" rank,
ties count half): PyKEEN with its `RankBasedEvaluator`, frugal with `evaluate_kge`; the PyKEEN
model is also ranked by `evaluate_kge` (printed per run as "frugal eval MRR"), which checks
the two evaluators against each other. What still differs, by construction: frugal's
negatives are shared by a chunk of positives and corrupt tails on even steps and heads on odd
steps, PyKEEN draws `num_negs_per_pos` per positive and corrupts heads for one half of the
batch and tails for the other; frugal's Adagrad keeps one accumulator per row
(`a += mean(g^2)`), PyKEEN's (`torch.optim.Adagrad`) one per value; the random streams.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pykeen.version
import torch
import torch._dynamo  # torch.optim imports it on first use: keep that out of PyKEEN's time
from pykeen.datasets import get_dataset
from pykeen.losses import NSSALoss, SoftplusLoss
from pykeen.pipeline import pipeline
from pykeen.training.callbacks import TrainingCallback

from frugal.data import load_triples
from frugal.data.triples import KnowledgeGraph
from frugal.store import EmbeddingStore
from frugal.store.baselines import RamTable
from frugal.store.kge import KGE_MODELS, KGEConfig, KGESampler, evaluate_kge, kge_row_spec
from frugal.store.kge import train_kge as frugal_train_kge

PYKEEN_MODELS = {"distmult": "DistMult", "complex": "ComplEx", "transe": "TransE"}
METRICS = ("mrr", "hits@1", "hits@3", "hits@10")
_PYKEEN_METRIC = {
    "mrr": "both.realistic.inverse_harmonic_mean_rank",
    "hits@1": "both.realistic.hits_at_1",
    "hits@3": "both.realistic.hits_at_3",
    "hits@10": "both.realistic.hits_at_10",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """What both trainers share."""

    embedding_dim: int
    batch_size: int
    epochs: int
    lr: float
    neg_sample_size: int
    neg_chunk_size: int
    num_negs_per_pos: int
    gamma: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One trained model's filtered test metrics and training time."""

    trainer: str
    dataset: str
    model: str
    seed: int
    steps: int
    train_s: float
    """Wall seconds of training (PyKEEN: its `train_seconds`)."""
    train_cpu_s: float
    """CPU seconds of the process over training, all threads (steadier on a busy machine)."""
    metrics: dict[str, float]
    frugal_eval: dict[str, float] | None = None


def _check_same_ids(graph: KnowledgeGraph, dataset: Any) -> None:
    """PyKEEN and frugal number entities and relations the same (sorted names)."""
    factory = dataset.training
    if list(factory.entity_to_id) != list(graph.entity_names) or list(
        factory.relation_to_id
    ) != list(graph.relation_names):
        raise SystemExit("PyKEEN and frugal number the entities or relations differently")
    for name, split in (("training", graph.train), ("testing", graph.test)):
        ours = np.unique(split, axis=0)
        theirs = np.unique(getattr(dataset, name).mapped_triples.numpy(), axis=0)
        if not np.array_equal(ours, theirs):
            raise SystemExit(f"PyKEEN's {name} triples differ from frugal's")


def run_frugal(
    graph: KnowledgeGraph, model: str, setting: Setting, seed: int, *, elementwise: bool = False
) -> Run:
    """Train and evaluate with frugal (entity rows on disk), as examples/store_kge.py.

    `elementwise` swaps the rows' row-wise Adagrad for element-wise Adagrad (D accumulators
    per row, torch.optim.Adagrad's rule): a diagnostic of that one difference, not frugal's
    recipe.
    """
    config = KGEConfig(
        model=model,
        embedding_dim=setting.embedding_dim,
        batch_size=setting.batch_size,
        neg_sample_size=setting.neg_sample_size,
        neg_chunk_size=setting.neg_chunk_size,
        lr=setting.lr,
        gamma=setting.gamma,
        p_norm=2,
        seed=seed,
    )
    steps = setting.epochs * (len(graph.train) // setting.batch_size)
    spec = kge_row_spec(config)
    if elementwise:
        spec = dataclasses.replace(
            spec, optimizer=dataclasses.replace(spec.optimizer, kind="adagrad")
        )
    store_config = EmbeddingStore.Config(memory_budget_bytes=1 << 20)
    with (
        tempfile.TemporaryDirectory() as scratch,
        EmbeddingStore.create(
            Path(scratch) / "entities",
            num_rows=graph.num_entities,
            spec=spec,
            config=store_config,
            seed=2 * seed,
        ) as entities,
    ):
        relations = RamTable(graph.num_relations, spec, seed=2 * seed + 1)
        t0, c0 = time.perf_counter(), time.process_time()
        frugal_train_kge(
            KGESampler(graph, config), entities, relations, num_steps=steps, lookahead=4
        )
        train_s = time.perf_counter() - t0
        train_cpu_s = time.process_time() - c0
        metrics = evaluate_kge(
            KGE_MODELS.get(model)(config),
            lambda ids: entities.peek(ids, cols="emb"),
            lambda ids: relations.table[ids, : config.embedding_dim],
            graph.test,
            num_entities=graph.num_entities,
            num_relations=graph.num_relations,
            known=graph.all_triples(),
        )
    return Run(
        trainer="frugal-elementwise" if elementwise else "frugal",
        dataset=graph.name,
        model=model,
        seed=seed,
        steps=steps,
        train_s=train_s,
        train_cpu_s=train_cpu_s,
        metrics={k: metrics[k] for k in METRICS},
    )


def _rows(representation: Any) -> np.ndarray:
    """PyKEEN's vectors as frugal rows (ComplEx: real half, then imaginary half)."""
    with torch.no_grad():
        x = representation(indices=None).detach()
    if x.is_complex():
        x = torch.cat([x.real, x.imag], dim=-1)
    return np.ascontiguousarray(x.numpy().astype(np.float32))


class _CpuClock(TrainingCallback):
    """CPU seconds from the first batch to the end of PyKEEN's training."""

    def __init__(self) -> None:
        super().__init__()
        self.start: float | None = None
        self.cpu_s = 0.0

    def pre_batch(self, **kwargs: Any) -> None:
        if self.start is None:
            self.start = time.process_time()

    def post_train(self, losses: list[float], **kwargs: Any) -> None:
        assert self.start is not None
        self.cpu_s = time.process_time() - self.start


def run_pykeen(
    dataset: Any, graph: KnowledgeGraph, model: str, setting: Setting, seed: int, variant: str
) -> Run:
    """Train and evaluate with PyKEEN's pipeline (variant "matched", "softplus", "defaults")."""
    d = setting.embedding_dim
    model_kwargs: dict[str, Any] = {
        "embedding_dim": d // 2 if model == "complex" else d,  # floats per row, as frugal
        "regularizer": None,
    }
    if model == "transe":
        model_kwargs["scoring_fct_norm"] = 2
    if variant in ("matched", "softplus"):
        bound = 1.0 / math.sqrt(d)
        init = functools.partial(torch.nn.init.uniform_, a=-bound, b=bound)
        model_kwargs["entity_initializer"] = init
        model_kwargs["relation_initializer"] = init
        if model != "complex":
            model_kwargs["entity_constrainer"] = None
    loss: Any = SoftplusLoss()
    if variant == "matched":
        loss = NSSALoss(
            margin=setting.gamma if model == "transe" else 0.0, adversarial_temperature=0.0
        )
    steps = setting.epochs * (dataset.training.num_triples // setting.batch_size)
    clock = _CpuClock()
    result = pipeline(
        dataset=dataset,
        model=PYKEEN_MODELS[model],
        model_kwargs=model_kwargs,
        loss=loss,
        optimizer="Adagrad",
        optimizer_kwargs={"lr": setting.lr, "eps": 1e-10},
        training_loop="sLCWA",
        negative_sampler="basic",
        negative_sampler_kwargs={"num_negs_per_pos": setting.num_negs_per_pos},
        epochs=setting.epochs,
        training_kwargs={
            "batch_size": setting.batch_size,
            "drop_last": True,
            "use_tqdm": False,
            "callbacks": clock,
        },
        evaluator="RankBasedEvaluator",
        evaluation_kwargs={"batch_size": 256, "use_tqdm": False},
        random_seed=seed,
        device="cpu",
        use_tqdm=False,
    )
    metrics = {k: float(result.metric_results.get_metric(v)) for k, v in _PYKEEN_METRIC.items()}
    trained = result.model
    config = KGEConfig(model=model, embedding_dim=d, gamma=setting.gamma, p_norm=2)
    entities = _rows(trained.entity_representations[0])
    relations = _rows(trained.relation_representations[0])
    ours = evaluate_kge(
        KGE_MODELS.get(model)(config),
        lambda ids: entities[ids],
        lambda ids: relations[ids],
        graph.test,
        num_entities=graph.num_entities,
        num_relations=graph.num_relations,
        known=graph.all_triples(),
    )
    return Run(
        trainer=f"pykeen-{variant}",
        dataset=graph.name,
        model=model,
        seed=seed,
        steps=steps,
        train_s=float(result.train_seconds),
        train_cpu_s=clock.cpu_s,
        metrics=metrics,
        frugal_eval={k: ours[k] for k in METRICS},
    )


def _mean(runs: list[Run], key: str) -> float:
    return float(np.mean([r.metrics[key] for r in runs]))


def main(argv: list[str] | None = None) -> None:
    """Train every (dataset, model, trainer, seed) and print the side-by-side table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["umls", "kinships"])
    parser.add_argument("--models", nargs="+", default=list(PYKEEN_MODELS))
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["matched", "frugal-elementwise"],
        choices=["matched", "softplus", "defaults", "frugal-elementwise"],
        help="besides frugal: PyKEEN matched / softplus / defaults, frugal element-wise Adagrad",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--neg-sample-size", type=int, default=64, help="frugal's K")
    parser.add_argument("--neg-chunk-size", type=int, default=64, help="frugal's chunk")
    parser.add_argument("--num-negs-per-pos", type=int, default=64, help="PyKEEN's")
    parser.add_argument("--gamma", type=float, default=6.0, help="TransE margin (both)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write every run here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setting = Setting(
        embedding_dim=args.embedding_dim,
        batch_size=args.batch_size,
        epochs=args.epochs,
        lr=args.lr,
        neg_sample_size=args.neg_sample_size,
        neg_chunk_size=args.neg_chunk_size,
        num_negs_per_pos=args.num_negs_per_pos,
        gamma=args.gamma,
    )
    versions = {"pykeen": pykeen.version.get_version(), "torch": torch.__version__}
    print(f"{versions}, {setting}, seeds {args.seeds}", flush=True)
    runs: list[Run] = []
    for name in args.datasets:
        graph = load_triples(name)
        graph = KnowledgeGraph(
            train=graph.train,
            valid=graph.valid,
            test=graph.test,
            entity_names=graph.entity_names,
            relation_names=graph.relation_names,
            name=name,
        )
        dataset = get_dataset(dataset=name)
        _check_same_ids(graph, dataset)
        for model in args.models:
            for seed in args.seeds:
                for variant in ["frugal", *args.variants]:
                    if variant == "frugal":
                        run = run_frugal(graph, model, setting, seed)
                    elif variant == "frugal-elementwise":
                        run = run_frugal(graph, model, setting, seed, elementwise=True)
                    else:
                        run = run_pykeen(dataset, graph, model, setting, seed, variant)
                    runs.append(run)
                    extra = ""
                    if run.frugal_eval is not None:
                        extra = f" (frugal eval MRR {run.frugal_eval['mrr']:.4f})"
                    print(
                        f"{name:9s} {model:9s} seed {seed} {run.trainer:16s} "
                        + " ".join(f"{k} {run.metrics[k]:.4f}" for k in METRICS)
                        + f" train {run.train_s:.1f} s ({run.train_cpu_s:.1f} CPU s)"
                        + f", {run.steps} steps{extra}",
                        flush=True,
                    )
    # the first run of a process pays one-time costs, and the machine may be shared: the
    # fastest of the seeds is the steadiest time
    print("\nmetrics: means over seeds; times: the fastest seed")
    print(
        "| dataset | model | trainer | MRR | Hits@1 | Hits@3 | Hits@10 | train wall s "
        "| train CPU s | MRR - frugal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.datasets:
        for model in args.models:
            cell = [r for r in runs if r.dataset == name and r.model == model]
            base = _mean([r for r in cell if r.trainer == "frugal"], "mrr")
            for trainer in dict.fromkeys(r.trainer for r in cell):
                group = [r for r in cell if r.trainer == trainer]
                wall_s = min(r.train_s for r in group)
                cpu_s = min(r.train_cpu_s for r in group)
                print(
                    f"| {name} | {model} | {trainer} | "
                    + " | ".join(f"{_mean(group, k):.3f}" for k in METRICS)
                    + f" | {wall_s:.1f} | {cpu_s:.1f} | {_mean(group, 'mrr') - base:+.3f} |"
                )
    if args.out is not None:
        payload = {
            "versions": versions,
            "setting": asdict(setting),
            "runs": [asdict(r) for r in runs],
        }
        args.out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
