"""Unpooled (sequence) features: a user's history, padded in order, pooled by DIN attention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from frugal.config import ConfigError
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.config import RecsysTrainConfig
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data, user_history
from frugal.recsys.launch import _check_features
from frugal.recsys.models import SequenceAttention, SequenceFeatures, WideDeepMLP, build_model
from frugal.recsys.ps import EmbeddingShard, default_owners
from frugal.recsys.transport import LocalTransport, ShardServer
from tests.recsys.test_ps import _batch  # a: [3, 3, 7], [], [7]; b: [3], [5, 5], [900]


def test_a_users_history_holds_their_earlier_items_most_recent_last() -> None:
    users = np.array([0, 1, 0, 0, 1])
    items = np.array([10, 20, 11, 12, 21])
    t = np.array([5, 1, 3, 3, 2])  # user 0: sample 2 (t 3), sample 3 (t 3, later index), 0
    values, offsets = user_history(users, items, t, length=2)
    bags = [values[offsets[i] : offsets[i + 1]].tolist() for i in range(5)]
    assert bags == [[11, 12], [], [], [11], [20]]
    values, offsets = user_history(users, items, t, length=1)  # only the most recent
    assert [values[offsets[i] : offsets[i + 1]].tolist() for i in range(5)] == [
        [12], [], [], [11], [20]
    ]  # fmt: skip


def test_movielens_history_is_movielens_with_each_users_earlier_movies() -> None:
    plain, _ = load_recsys_data(RecsysDataConfig(dataset="movielens100k"))
    train, _ = load_recsys_data(RecsysDataConfig(dataset="movielens100k_history"))
    assert train.keys == (*plain.keys, "history")
    assert train.num_embeddings == (*plain.num_embeddings, plain.num_embeddings[1])
    batch = train.batch(np.arange(2000), 0)
    history = batch.feature_values()[-1]
    lengths = batch.lengths.reshape(len(train.keys), 2000)[-1]
    assert lengths.max() == 20 and (lengths == 0).any()
    assert history.max() < plain.num_embeddings[1]  # movie ids


def test_attention_weighs_each_item_by_the_unit_and_skips_padding() -> None:
    attention = SequenceAttention(2, hidden=())
    with torch.no_grad():  # w = h . q: the unit reads only the h * q block
        attention.unit[0].weight.copy_(torch.tensor([[0.0, 0, 0, 0, 0, 0, 1, 1]]))
        attention.unit[0].bias.zero_()
    items = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]], [[0.5, 0.5], [0, 0], [0, 0]]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    query = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    pooled = attention(items, mask, query)
    # sample 0: weights 3 and 3 (the padded [9, 9] is left out): 3 * [1, 2] + 3 * [3, 0]
    # sample 1: weight 1: 1 * [0.5, 0.5]
    torch.testing.assert_close(pooled, torch.tensor([[12.0, 6.0], [0.5, 0.5]]))


def test_the_client_hands_sequences_unpooled_and_their_gradients_reach_the_rows(
    tmp_path: Path,
) -> None:
    shard = EmbeddingShard(tmp_path / "s", (1000, 1000), EmbeddingShard.Config(embedding_dim=3))
    transport = LocalTransport([ShardServer(shard, None, 0.0)], timeout_s=5)
    client = EmbeddingClient(transport, default_owners(1), 2, 3, "float32", sequence_features=(0,))
    try:
        result = client.wait(client.lookup(_batch()))
        features = client.pooled_features(result)
        assert features[0] is None and features[1] is not None  # b pooled (sum)
        ((padded, mask),) = client.sequences(result)
        assert padded.shape == (3, 3, 3)
        assert mask.tolist() == [[True, True, True], [False] * 3, [True, False, False]]
        row = {i: torch.from_numpy(shard.peek_table(0, np.array([i]))[0]) for i in (3, 7)}
        for slot, i in enumerate((3, 3, 7)):  # feature a's bag [3, 3, 7], in order
            torch.testing.assert_close(padded[0, slot], row[i])
        torch.testing.assert_close(padded[2, 0], row[7])
        assert not padded[1].any() and not padded[2, 1:].any()  # padding is zeros
        (padded * torch.arange(1.0, 4.0)[None, :, None]).sum().backward()  # weight = slot + 1
        grads = result.rows[0].grad
        assert grads is not None
        u = {int(i): k for k, i in enumerate(result.pending.unique_ids[:2])}  # table a's pairs
        # id 3 sits at slots 0 and 1 of sample 0: weights 1 + 2; id 7 at slot 2 and slot 0
        torch.testing.assert_close(grads[u[3]], torch.full((3,), 3.0))
        torch.testing.assert_close(grads[u[7]], torch.full((3,), 4.0))
    finally:
        transport.close()
        shard.close()


def test_the_wrapper_runs_the_model_on_attention_pooled_sequences() -> None:
    torch.manual_seed(0)
    base = WideDeepMLP(3, 4, dense_dim=1, hidden=(5,))
    model = SequenceFeatures(base, (4, 4, 4), sequence_features=(2,), target=0)
    features: list[torch.Tensor | None] = [torch.randn(6, 4), torch.randn(6, 4), None]
    items, mask = torch.randn(6, 5, 4), torch.rand(6, 5) > 0.3
    dense = torch.randn(6, 1)
    logits = model(features, [(items, mask)], dense)
    assert features[2] is None  # the caller's list is left as it was
    pooled = model.attention[0](items, mask, features[0])
    want = base(torch.stack([features[0], features[1], pooled], dim=1), dense)
    torch.testing.assert_close(logits, want)
    learned = SequenceFeatures(base, (4, 4, 4), sequence_features=(2,), target=None)
    assert len(learned.queries) == 1 and learned.queries[0].shape == (4,)
    assert learned(features, [(items, mask)], dense).shape == (6,)
    with pytest.raises(ValueError, match="sequence feature 2 has width 8, its target 0 4"):
        SequenceFeatures(base, (4, 4, 8), sequence_features=(2,), target=0)
    with pytest.raises(ValueError, match="must be a pooled feature"):
        SequenceFeatures(base, (4, 4, 4), sequence_features=(2,), target=2)
    wrapped = build_model("dlrm", 3, 4, 1, (5,), sequence_features=(2,), sequence_target=0)
    assert isinstance(wrapped, SequenceFeatures) and isinstance(wrapped.model, nn.Module)


def test_sequence_settings_are_checked_before_launch() -> None:
    data = RecsysDataConfig(dataset="movielens100k_history")
    ok = RecsysTrainConfig(data=data, sequence_features=("history",), sequence_target="movie_id")
    _check_features(ok)  # accepted
    cases = [
        ({"sequence_features": ("past",)}, "'past' is not a feature of movielens100k_history"),
        ({"sequence_features": ("history",), "sequence_target": "history"}, "is a sequence"),
        ({"sequence_target": "movie_id"}, "sequence_target='movie_id' needs sequence_features"),
        (
            {
                "sequence_features": ("history",),
                "sequence_target": "movie_id",
                "model": "mlp",
                "embedding_dims": (8, 16, 4, 4, 4, 8, 4, 8),
            },
            "sequence feature 7 has width 8, its target 1 16",
        ),
    ]
    for fields, message in cases:
        with pytest.raises(ConfigError, match=message):
            _check_features(RecsysTrainConfig(data=data, **fields))
