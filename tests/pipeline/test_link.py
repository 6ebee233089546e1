"""Link emulation: rho -> bandwidth, the shaper's FIFO arithmetic, and that it really sleeps."""

from __future__ import annotations

import threading

import pytest

from frugal.comm.link import (
    RHO_POINTS,
    LinkShaper,
    LinkSpec,
    bandwidth_from_rho,
    link_table,
    transfer_time_s,
)


def test_bandwidth_from_rho_matches_the_brief() -> None:
    # Tier A: S = 8 x 64 x 128 x 4 = 262,144 B, c = 0.068 s; rho 0.33 -> 16 S / (rho c)
    # = 4,194,304 / 0.02244 = 186.9 Mbit/s (the brief's 187 Mbps).
    assert bandwidth_from_rho(0.33, 262_144, 0.068) == pytest.approx(186.91e6, rel=1e-4)
    assert bandwidth_from_rho(3.3, 262_144, 0.068) == pytest.approx(18.691e6, rel=1e-4)
    assert list(RHO_POINTS) == ["10gbps", "1gbps", "500mbps", "300mbps", "100mbps"]
    with pytest.raises(ValueError, match="rho=0"):
        bandwidth_from_rho(0, 1, 1.0)


def test_transfer_time_and_link_table() -> None:
    assert transfer_time_s(1_000_000, 8e6) == 1.0  # 8 Mbit over 8 Mbit/s
    slow = LinkSpec(bandwidth_bits_per_s=1e6, latency_s=0.01)
    table = link_table(3, LinkSpec(), {(0, 1): slow})
    assert table[(0, 1)] is slow and not table[(1, 0)].is_shaped and len(table) == 6
    with pytest.raises(ValueError, match=r"link \(0, 0\)"):
        link_table(2, LinkSpec(), {(0, 0): slow})
    with pytest.raises(ValueError, match="bandwidth_bits_per_s=0"):
        LinkSpec(bandwidth_bits_per_s=0)


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_shaper_fifo_arithmetic() -> None:
    clock = _FakeClock()
    spec = LinkSpec(bandwidth_bits_per_s=8_000.0, latency_s=0.5)  # 1,000 bytes per second
    shaper = LinkShaper(spec, clock=clock, sleep=lambda s: None)
    try:
        # At t=100: 2,000 B hold the link [100, 102]; released at 102.5.
        assert shaper.schedule(2_000) == (100.0, 102.5)
        # Submitted at 100.5 while busy: starts at 102, holds 1 s, released at 103.5.
        clock.now = 100.5
        assert shaper.schedule(1_000) == (102.0, 103.5)
        # After the link went idle: starts now.
        clock.now = 110.0
        assert shaper.schedule(500) == (110.0, 111.0)
        assert shaper.busy_s == pytest.approx(3.5) and shaper.sent_bytes == 3_500
    finally:
        shaper.close()


def test_shaper_sleeps_until_release_then_sends_in_order() -> None:
    clock = _FakeClock()
    sent: list[tuple[int, float]] = []
    done = threading.Event()
    shaper = LinkShaper(LinkSpec(bandwidth_bits_per_s=8_000.0), clock=clock, sleep=clock.sleep)
    try:
        first = shaper.submit(1_000, lambda: sent.append((1, clock.now)))
        second = shaper.submit(3_000, lambda: (sent.append((2, clock.now)), done.set()))
        assert done.wait(5)
        first.wait(5)
        second.wait(5)
        assert sent == [(1, 101.0), (2, 104.0)]  # 1 s, then 3 more s: sleeps, no busy loop
        assert clock.sleeps == [1.0, 3.0]
    finally:
        shaper.close()
