"""The one layer partitioner: even splits, speed-weighted stages, a heavy last stage."""

from __future__ import annotations

import itertools

import pytest

from frugal.parallel.partition import partition_layers, split_layers


def test_even_split_puts_the_remainder_first() -> None:
    assert split_layers(6, 4) == (2, 2, 1, 1)
    assert split_layers(24, 8) == (3,) * 8
    assert split_layers(5, 1) == (5,)


def _max_cost(layers: tuple[int, ...], cost: list[float], extra: list[float]) -> float:
    return max((n + e) * c for n, c, e in zip(layers, cost, extra, strict=True))


@pytest.mark.parametrize("num_layers", [4, 7, 12])
def test_weighted_partition_is_optimal_against_brute_force(num_layers: int) -> None:
    cost, extra = [1.0, 0.5, 2.0], [0.0, 0.0, 1.5]
    best = min(
        _max_cost(c, cost, extra)
        for c in itertools.product(range(1, num_layers + 1), repeat=3)
        if sum(c) == num_layers
    )
    got = partition_layers(num_layers, 3, seconds_per_layer=cost, extra_layers=extra)
    assert sum(got) == num_layers and min(got) >= 1
    assert _max_cost(got, cost, extra) == pytest.approx(best)


def test_a_heavy_last_stage_gets_fewer_layers() -> None:
    # SmolLM2: 30 blocks over 4 stages, the head and loss cost 8 blocks on the last stage.
    assert partition_layers(30, 4, extra_layers=[0, 0, 0, 8.0]) == (10, 10, 9, 1)
    # A half-speed device (2 s per layer) on stage 1 of 3 with 10 layers: costs 4, 3 x 2, 3.
    assert partition_layers(10, 3, seconds_per_layer=[1.0, 2.0, 1.0]) == (4, 2, 4)


def test_bad_input_names_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"num_stages=5 .* 4 blocks .* between 1 and 4"):
        split_layers(4, 5)
    with pytest.raises(ValueError, match="need 2 entries"):
        partition_layers(4, 2, seconds_per_layer=[1.0])
    with pytest.raises(ValueError, match="must be > 0"):
        partition_layers(4, 2, seconds_per_layer=[1.0, 0.0])
