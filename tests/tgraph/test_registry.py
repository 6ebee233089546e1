"""Registries: model and protocol presets by name, user entries, fields honoured by the trainer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, replace

import numpy as np
import numpy.typing as npt
import pytest
from torch import nn

from frugal.data import TemporalEvents
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.models import (
    MODELS,
    GraphAttentionEmbedding,
    HeuristicModel,
    IdentityMessage,
    ModelInputs,
    TemporalGNN,
    TimeEncoder,
    heuristic_names,
    model_names,
    register_model,
)
from frugal.tgraph.protocol import (
    PROTOCOLS,
    ProtocolConfig,
    build_protocol,
    protocol_preset,
    register_protocol,
)
from frugal.tgraph.train import run_link_prediction

BUILT_IN = (
    "edgebank", "edgebank_window", "recency", "popularity", "jodie", "dyrep", "tgn", "tgat",
    "graphmixer",
)  # fmt: skip


@pytest.fixture(scope="module")
def stream() -> TemporalEvents:
    return generate_temporal_events(TemporalStreamConfig(num_events=1200, num_nodes=40))


@pytest.fixture
def user_models() -> Iterator[list[str]]:
    """Names registered by a test; unregistered afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        MODELS.unregister(name)


def _tiny(**changes: object) -> ProtocolConfig:
    base = replace(protocol_preset("frugal"), max_epochs=1, embedding_dim=8, num_neighbors=3)
    return replace(base, **changes)  # type: ignore[arg-type]


def _rows(result_rows: list[dict[str, object]]) -> dict[tuple[object, object], dict[str, object]]:
    return {(r["view"], r["negatives"]): r for r in result_rows}


def test_built_in_models_are_registered_in_order_with_their_kinds() -> None:
    assert model_names()[: len(BUILT_IN)] == BUILT_IN
    assert heuristic_names() == BUILT_IN[:4]
    native = {name: MODELS.get(name).native_neighbor_strategy for name in BUILT_IN}
    assert native == {name: "uniform" if name == "tgat" else "recent" for name in BUILT_IN}


def test_unknown_names_list_every_registered_entry(stream: TemporalEvents) -> None:
    from frugal.bench.tgraph import TgraphBenchConfig

    with pytest.raises(ValueError, match="choose one of") as error:
        MODELS.get("apan")
    message = str(error.value)
    assert message.startswith("model='apan' is not a registered tgraph model; choose one of ")
    assert all(name in message for name in BUILT_IN)
    with pytest.raises(ValueError, match=r"protocol='tgb' is not a registered tgraph protocol; "
                       r"choose one of frugal, benchtemp"):  # fmt: skip
        protocol_preset("tgb")
    with pytest.raises(ValueError, match=r"models\[1\] = 'apan' is not allowed: .* graphmixer, "
                       r"cawn, dygformer, nat, neurtw, or register it .* \(or name it as "
                       r"package\.module:attribute\)"):  # fmt: skip
        TgraphBenchConfig(models=("tgn", "apan"))
    protocol = build_protocol(stream, "synthetic", _tiny())
    with pytest.raises(ValueError, match=r"model='apan' is not a registered tgraph model"):
        run_link_prediction("apan", protocol, 0)


def test_protocol_name_of_an_unregistered_preset_is_refused_by_the_cli() -> None:
    from frugal.cli.main import build_parser
    from frugal.cli.tgraph import bench_config

    args = build_parser().parse_args(["tgraph", "bench", "--set", 'protocol.name="tgb"'])
    with pytest.raises(ValueError, match=r"protocol='tgb' .* choose one of frugal, benchtemp"):
        bench_config(args)


def test_presets_hold_the_published_choices() -> None:
    frugal = asdict(protocol_preset("frugal"))
    benchtemp = asdict(protocol_preset("benchtemp"))
    assert protocol_preset("frugal") == ProtocolConfig()  # the field defaults are frugal's
    assert ProtocolConfig.benchtemp() is protocol_preset("benchtemp")
    shared = {
        "val_quantile": 0.70, "test_quantile": 0.85, "mask_fraction": 0.1, "mask_seed": 2020,
        "negative_seed": 0, "train_batch_size": 200, "eval_batch_size": 200, "max_epochs": 50,
        "learning_rate": 1e-4, "dropout": 0.1, "num_neighbors": 10, "use_ranking": True,
        "num_ranking_candidates": 100,
    }  # fmt: skip
    assert frugal == {
        **shared,
        "name": "frugal",
        "split_cut": "timestamp_boundary",
        "mask_sampler": "numpy",
        "negative_sampler": "shared",
        "negative_strategies": ("random", "historical", "inductive"),
        "use_tie_holdback": True,
        "neighbor_bound": "batch",
        "eval_neighbor_events": "visible",
        "use_view_passes": False,
        "early_stopping_metric": "ap",
        "num_zero_edge_features": 0,
        "neighbor_sampling": "recent",
        "patience": 5,
        "tolerance": 1e-4,
        "embedding_dim": 100,
    }
    # Benchtemp (ICDE 2024, section III and its TGN-family scripts): linear time quantiles,
    # random.seed(2020) mask, RandEdgeSampler negatives, commit every batch, time-only
    # neighbour bound over all events, per-view passes, per-batch AP for early stopping,
    # 172 zero edge features, TGAT's uniform sampler, dims 172, patience 3, tolerance 1e-10.
    assert benchtemp == {
        **shared,
        "name": "benchtemp",
        "split_cut": "time_quantile",
        "mask_sampler": "python_random",
        "negative_sampler": "rand_edge_sampler",
        "negative_strategies": ("random",),
        "use_tie_holdback": False,
        "neighbor_bound": "time",
        "eval_neighbor_events": "all",
        "use_view_passes": True,
        "early_stopping_metric": "ap_per_batch",
        "num_zero_edge_features": 172,
        "neighbor_sampling": "native",
        "patience": 3,
        "tolerance": 1e-10,
        "embedding_dim": 172,
    }


def test_protocol_registry_refuses_a_taken_name_and_contradictory_fields() -> None:
    with pytest.raises(ValueError, match=r"'benchtemp' is already registered"):
        register_protocol(replace(protocol_preset("frugal"), name="benchtemp"))
    with pytest.raises(ValueError, match=r"negative_sampler='rand_edge_sampler' draws random"):
        replace(protocol_preset("benchtemp"), negative_strategies=("random", "historical"))
    mine = register_protocol(replace(protocol_preset("frugal"), name="frugal_no_holdback",
                                     use_tie_holdback=False))  # fmt: skip
    try:
        assert protocol_preset("frugal_no_holdback") is mine
        assert PROTOCOLS.names()[:2] == ("frugal", "benchtemp")
    finally:
        PROTOCOLS.unregister("frugal_no_holdback")


def test_a_flipped_benchtemp_field_is_honoured_by_the_trainer(stream: TemporalEvents) -> None:
    # The frugal preset with Benchtemp's separate inductive passes: the inductive views are
    # scored from the backed-up state on their own events, so their AUC changes, while the
    # transductive view (one pass either way) is the same. Batches of 16, so that a pass
    # observes events before it scores later ones.
    config = _tiny(use_ranking=False, eval_batch_size=16)
    frugal = build_protocol(stream, "synthetic", config)
    passes = build_protocol(stream, "synthetic", replace(config, use_view_passes=True))
    assert passes.config.name == "frugal"  # a label only: the fields decide
    plain = _rows(run_link_prediction("popularity", frugal, 0).rows)
    separate = _rows(run_link_prediction("popularity", passes, 0).rows)
    assert separate["transductive", "random"]["auc"] == plain["transductive", "random"]["auc"]
    assert separate["inductive", "random"]["auc"] != plain["inductive", "random"]["auc"]


def test_zero_edge_features_and_native_sampling_reach_the_model(stream: TemporalEvents) -> None:
    from frugal.tgraph.train import model_inputs  # what run_link_prediction builds from

    tgat = MODELS.get("tgat")
    changed = _tiny(num_zero_edge_features=5, neighbor_sampling="native")
    model = tgat.build(model_inputs(build_protocol(stream, "synthetic", changed), tgat))
    assert isinstance(model, TemporalGNN)
    assert tuple(model.edge_msg.shape) == (stream.num_events, 5) and model.edge_features is None
    assert model.neighbor_strategy == "uniform"
    plain = tgat.build(model_inputs(build_protocol(stream, "synthetic", _tiny()), tgat))
    assert isinstance(plain, TemporalGNN)
    assert tuple(plain.edge_msg.shape) == (stream.num_events, 0)
    assert plain.neighbor_strategy == "recent"
    # The padding is in the weights' shapes: the edge projection takes F + T = 5 + 8 inputs.
    assert model.embedding.layers[0].edge.in_features == 13  # type: ignore[index,union-attr]
    assert plain.embedding.layers[0].edge.in_features == 8  # type: ignore[index,union-attr]


def _tgn_with_rnn_memory(inputs: ModelInputs) -> TemporalGNN:
    """A model assembled outside the package: TGN's attention over an RNN-cell memory."""
    d, edge_dim = inputs.embedding_dim, int(inputs.msg.shape[1])
    time_encoder = TimeEncoder(d)
    embedding = GraphAttentionEmbedding(
        d, edge_dim, time_encoder, num_layers=1, num_neighbors=inputs.num_neighbors
    )
    return TemporalGNN(
        inputs.num_nodes, inputs.msg, time_encoder=time_encoder, embedding=embedding,
        memory_updater=nn.RNNCell(3 * d + edge_dim, d), message=IdentityMessage(),
        time_origin=inputs.time_origin,
    )  # fmt: skip


class _Constant(HeuristicModel):
    """Scores every pair 0: AUC exactly 0.5, AP exactly 0.5 against one negative each."""

    def _score(
        self, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], t: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        return np.zeros(src.shape)


def test_user_registered_models_run_through_the_trainer(
    stream: TemporalEvents, user_models: list[str]
) -> None:
    from frugal.bench.tgraph import TgraphBenchConfig

    register_model("tgn_rnn", _tgn_with_rnn_memory, description="TGN attention, RNN memory")
    register_model("constant", lambda inputs: _Constant(inputs.num_nodes), kind="heuristic")
    user_models.extend(["tgn_rnn", "constant"])
    assert TgraphBenchConfig(models=("tgn_rnn",)).models == ("tgn_rnn",)
    assert heuristic_names()[-1] == "constant"  # the bench always runs it beside the others
    protocol = build_protocol(stream, "synthetic", _tiny(use_ranking=False))
    result = run_link_prediction("tgn_rnn", protocol, 0, num_threads=1)
    assert isinstance(result.model, TemporalGNN)
    assert isinstance(result.model.updater, nn.RNNCell)
    assert len(result.history) == 1 and result.efficiency["params"] > 0
    head = _rows(result.rows)["transductive", "random"]
    assert 0 <= float(head["auc"]) <= 1 and head["num_events"] > 0  # type: ignore[arg-type,operator]
    # The same seed gives the same run: the builder runs under the trainer's torch seed.
    again = run_link_prediction("tgn_rnn", protocol, 0, num_threads=1)
    assert [h["loss"] for h in again.history] == [h["loss"] for h in result.history]
    constant = _rows(run_link_prediction("constant", protocol, 0).rows)["transductive", "random"]
    assert constant["auc"] == 0.5 and constant["ap"] == 0.5


def test_a_builder_of_the_wrong_kind_is_a_type_error(
    stream: TemporalEvents, user_models: list[str]
) -> None:
    register_model("not_learned", lambda inputs: _Constant(inputs.num_nodes))
    user_models.append("not_learned")
    protocol = build_protocol(stream, "synthetic", _tiny())
    with pytest.raises(TypeError, match=r"registered as kind='learned' .* returned a _Constant"):
        run_link_prediction("not_learned", protocol, 0)
    with pytest.raises(ValueError, match=r"'tgn' is already registered"):
        register_model("tgn", _tgn_with_rnn_memory)


def test_a_model_trains_with_its_own_settings_under_its_protocol(
    stream: TemporalEvents, user_models: list[str]
) -> None:
    from frugal.tgraph.models import ModelSpec
    from frugal.tgraph.models.tgn import build_tgn

    user_models.append("tgn_short")
    register_model("tgn_short", build_tgn, training={"tiny3": {"max_epochs": 1, "patience": 0}})
    spec = MODELS.get("tgn_short")
    tiny3 = register_protocol(replace(_tiny(max_epochs=3), name="tiny3"))
    try:
        assert spec.training_config(tiny3).max_epochs == 1
        other = replace(tiny3, name="benchtemp")
        assert spec.training_config(other) is other  # another protocol: untouched
        protocol = build_protocol(stream, "synthetic", tiny3)
    finally:
        PROTOCOLS.unregister("tiny3")
    short = run_link_prediction("tgn_short", protocol, 0)
    plain = run_link_prediction("tgn", protocol, 0)
    assert short.efficiency["epochs"] == 1 and plain.efficiency["epochs"] == 3
    assert short.efficiency["training_overrides"] == {"max_epochs": 1, "patience": 0}
    assert plain.efficiency["training_overrides"] == {}
    # The built-in walk and cache models carry Benchtemp's scripts' settings.
    assert MODELS.get("cawn").training_overrides("benchtemp") == {
        "train_batch_size": 32,
        "tolerance": 0.0,
    }
    assert MODELS.get("nat").training_overrides("benchtemp")["train_batch_size"] == 100
    assert MODELS.get("neurtw").training_overrides("benchtemp")["max_epochs"] == 30
    assert MODELS.get("cawn").training_overrides("frugal") == {}
    with pytest.raises(ValueError, match=r"sets \['eval_batch_size'\]; a model may change only"):
        ModelSpec(build_tgn, "learned", training={"benchtemp": {"eval_batch_size": 30}})


def test_the_bench_runs_every_model_but_the_hours_long_ones_by_default() -> None:
    from frugal.bench.tgraph import TgraphBenchConfig
    from frugal.tgraph.models import default_model_names

    slow = {"cawn", "dygformer", "neurtw"}
    assert set(model_names()) - set(default_model_names()) == slow
    assert set(TgraphBenchConfig().models) == set(default_model_names())
    assert "nat" in default_model_names() and "tgn" in default_model_names()


def test_a_setting_the_user_changed_wins_over_the_models_own() -> None:
    benchtemp = protocol_preset("benchtemp")
    nat = MODELS.get("nat")
    assert nat.applied_training(benchtemp) == {"train_batch_size": 100, "tolerance": 1e-3}
    mine = replace(benchtemp, train_batch_size=400)  # --set protocol.train_batch_size=400
    assert nat.applied_training(mine) == {"tolerance": 1e-3}
    assert nat.training_config(mine).train_batch_size == 400
    assert nat.training_config(mine).tolerance == 1e-3
