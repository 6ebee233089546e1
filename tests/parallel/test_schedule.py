"""Schedules: hand-written action lists, the in-flight peak, and a user's registered schedule."""

from __future__ import annotations

import pytest

from frugal.parallel.schedule import SCHEDULES, build_schedule, peak_in_flight, register_schedule


def test_1f1b_warms_up_then_alternates_by_hand() -> None:
    # p = 4, m = 3: stage 0 warms up with 3 forwards, the last stage with none.
    assert build_schedule("1f1b", 4, 0, 3) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2),
    ]  # fmt: skip
    assert build_schedule("1f1b", 4, 3, 3) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2),
    ]  # fmt: skip
    assert build_schedule("1f1b", 4, 1, 5)[:4] == [("F", 0), ("F", 1), ("F", 2), ("B", 0)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_microbatch_runs_forward_before_backward(schedule: str) -> None:
    for stage in range(4):
        actions = build_schedule(schedule, 4, stage, 6)
        assert sorted(actions) == [(op, j) for op in ("B", "F") for j in range(6)]
        assert all(actions.index(("F", j)) < actions.index(("B", j)) for j in range(6))


def test_peak_in_flight_is_m_for_gpipe_and_p_minus_s_for_1f1b() -> None:
    assert [peak_in_flight(build_schedule("gpipe", 4, s, 16)) for s in range(4)] == [16] * 4
    assert [peak_in_flight(build_schedule("1f1b", 4, s, 16)) for s in range(4)] == [4, 3, 2, 1]
    assert [peak_in_flight(build_schedule("1f1b", 4, s, 2)) for s in range(4)] == [2, 2, 2, 1]


def test_bad_arguments_and_unknown_schedules_are_named() -> None:
    with pytest.raises(ValueError, match="stage=4"):
        build_schedule("gpipe", 4, 4, 1)
    with pytest.raises(ValueError, match=r"schedule='zb' is not a registered .*gpipe, 1f1b"):
        build_schedule("zb", 2, 0, 2)


def test_a_registered_schedule_runs_everywhere_and_is_checked() -> None:
    def backwards_first(num_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
        return (
            [("B", 0), ("F", 0)] + [("F", j) for j in range(1, m)] + [("B", j) for j in range(1, m)]
        )

    def reversed_gpipe(num_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
        return [("F", j) for j in reversed(range(m))] + [("B", j) for j in range(m)]

    register_schedule("bad", backwards_first)  # type: ignore[arg-type]
    register_schedule("rev", reversed_gpipe)  # type: ignore[arg-type]
    try:
        with pytest.raises(ValueError, match="forward once, before its backward"):
            build_schedule("bad", 2, 0, 3)
        assert build_schedule("rev", 2, 1, 3)[:3] == [("F", 2), ("F", 1), ("F", 0)]
        from frugal.planner.sim import simulate_step

        # The pipeline's step simulator replays the registered order: 2 stages, f = 1, g = 2.
        step = simulate_step(
            schedule="rev",
            num_microbatches=2,
            forward_s=[1.0, 1.0],
            backward_s=[2.0, 2.0],
            activation_bytes=[[0, 0]],
            gradient_bytes=[[0, 0]],
            bandwidth_bits_per_s=float("inf"),
        )
        # Stage 0: F1 0-1, F0 1-2; stage 1: F1 1-2, F0 2-3, B0 3-5, B1 5-7; stage 0: B0 5-7,
        # B1 7-9.
        assert step.step_time_s == pytest.approx(9.0)
    finally:
        SCHEDULES.unregister("bad")
        SCHEDULES.unregister("rev")
