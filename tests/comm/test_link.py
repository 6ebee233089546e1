"""TCP window limit and shared host NICs of the link emulation (`frugal.comm.link`)."""

from __future__ import annotations

import fcntl
import math
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from frugal.comm.link import (
    HostNics,
    LinkError,
    LinkShaper,
    LinkSpec,
    NicRoute,
    window_limited_bits_per_s,
)
from frugal.pipeline.train import RunSpec, rank_links

_MIB = 1 << 20


def test_window_limited_rate_by_hand() -> None:
    # Linux's default tcp_rmem max, 6 MiB = 6,291,456 B, over a 100 ms round trip:
    # 8 x 6,291,456 / 0.1 = 503,316,480 bit/s, below a 1 Gbit/s link, above a 100 Mbit/s one.
    assert window_limited_bits_per_s(1e9, 0.1, 6 * _MIB) == pytest.approx(503_316_480.0)
    assert window_limited_bits_per_s(100e6, 0.1, 6 * _MIB) == 100e6
    assert window_limited_bits_per_s(1e9, 0.0, 6 * _MIB) == 1e9  # no round trip: no limit
    assert window_limited_bits_per_s(1e9, 0.1, math.inf) == 1e9
    assert window_limited_bits_per_s(math.inf, 0.02, 1000.0) == pytest.approx(400_000.0)
    with pytest.raises(ValueError, match="window_bytes=0"):
        window_limited_bits_per_s(1e9, 0.1, 0.0)


def test_link_spec_limits_by_twice_its_one_way_latency() -> None:
    # RTT = 2 x 50 ms = 0.1 s; 5,000 B per round trip = 400,000 bit/s < 1 Mbit/s.
    spec = LinkSpec(bandwidth_bits_per_s=1e6, latency_s=0.05, window_bytes=5_000.0)
    assert spec.effective_bits_per_s == pytest.approx(400_000.0)
    assert LinkSpec(bandwidth_bits_per_s=1e6, latency_s=0.05).effective_bits_per_s == 1e6
    with pytest.raises(ValueError, match="window_bytes=-1"):
        LinkSpec(window_bytes=-1.0)


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_shaper_holds_a_window_limited_link() -> None:
    # 8,000 bit/s link, 0.5 s one way, 250 B window: RTT 1 s -> 2,000 bit/s = 250 B/s, so
    # 500 B hold the link [100, 102] and are released at 102.5 (unlimited: [100, 100.5]).
    clock = _FakeClock()
    spec = LinkSpec(bandwidth_bits_per_s=8_000.0, latency_s=0.5, window_bytes=250.0)
    shaper = LinkShaper(spec, clock=clock, sleep=lambda s: None)
    try:
        assert shaper.schedule(500) == (100.0, 102.5)
        assert shaper.schedule(250) == (102.0, 103.5)
    finally:
        shaper.close()


def _route(path: Path, src: int, dst: int, nic_bits_per_s: float = 8_000.0) -> NicRoute:
    return NicRoute(state_path=str(path), num_hosts=3, src_host=src, dst_host=dst,
                    out_bits_per_s=nic_bits_per_s, in_bits_per_s=nic_bits_per_s)  # fmt: skip


def test_host_nics_queue_out_and_in_independently_by_hand(tmp_path: Path) -> None:
    # Hosts A, B, C with 8,000 bit/s NICs: 1,000 B hold a NIC 1 s.
    path = tmp_path / "nics"
    nics = HostNics(str(path), 3)
    try:
        # A fresh file reads as free: A out and B in carry it over [100, 101].
        assert nics.reserve(_route(path, 0, 1), 1_000, 100.0) == 101.0
        # C -> B: C's out is free (done 101), B's in is busy until 101 (done 102).
        assert nics.reserve(_route(path, 2, 1), 1_000, 100.0) == 102.0
        # A -> C: A's out busy until 101 (done 102), C's in free (done 101).
        assert nics.reserve(_route(path, 0, 2), 1_000, 100.0) == 102.0
        # B -> A uses B's out and A's in: both free.
        assert nics.reserve(_route(path, 1, 0), 1_000, 100.0) == 101.0
        assert nics.reserve(_route(path, 0, 1), 1_000, 105.0) == 106.0  # all free by then
        # A second handle (another process's) sees the same state; an uncapped side is skipped.
        other = HostNics(str(path), 3)
        assert other.reserve(_route(path, 0, 1), 2_000, 100.0) == 108.0  # A out, B in: 106
        uncapped_in = NicRoute(state_path=str(path), num_hosts=3, src_host=2, dst_host=1,
                               out_bits_per_s=8_000.0)  # fmt: skip
        # C out is busy until 101; B in (busy until 108) is not queued on without a cap.
        assert other.reserve(uncapped_in, 1_000, 100.0) == 102.0
        other.close()
    finally:
        nics.close()


def test_two_links_of_one_host_share_its_nic(tmp_path: Path) -> None:
    # Two links from host 0 to host 1 (8,000 bit/s each, 0.1 s latency) through 8,000 bit/s
    # NICs: 1,000 B hold a NIC 1 s, so the second link's message crosses them after the first.
    # A 4,000 bit/s NIC also slows one message alone: 1,000 B take 2 s on the link.
    clock = _FakeClock()
    spec = LinkSpec(bandwidth_bits_per_s=8_000.0, latency_s=0.1, nic=_route(tmp_path / "n", 0, 1))
    first, second = (LinkShaper(spec, clock=clock, sleep=lambda s: None) for _ in range(2))
    try:
        assert first.schedule(1_000) == (100.0, pytest.approx(101.1))
        # Its own link starts at once, but both NICs carry it only over [101, 102].
        assert second.schedule(1_000) == (100.0, pytest.approx(102.1))
        # Without the NIC the two links are independent.
        free = LinkShaper(LinkSpec(bandwidth_bits_per_s=8_000.0), clock=clock, sleep=lambda s: None)
        assert free.schedule(1_000) == (100.0, 101.0)
        free.close()
        slow_nic = LinkSpec(bandwidth_bits_per_s=8_000.0, nic=_route(tmp_path / "s", 0, 1, 4_000.0))
        slow = LinkShaper(slow_nic, clock=clock, sleep=lambda s: None)
        assert slow.schedule(1_000) == (100.0, 102.0)
        slow.close()
    finally:
        first.close()
        second.close()


def test_a_stuck_nic_lock_times_out(tmp_path: Path) -> None:
    path = tmp_path / "nics"
    nics = HostNics(str(path), 3, lock_timeout_s=0.05)
    holder = os.open(path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process holding the lock and never returning
    try:
        t0 = time.monotonic()
        with pytest.raises(LinkError, match="stayed locked"):
            nics.reserve(_route(path, 0, 1), 1_000, 0.0)
        assert time.monotonic() - t0 < 5.0
    finally:
        os.close(holder)
        nics.close()


def test_rank_links_window_and_nic_only_between_hosts() -> None:
    # Ranks 0, 1 on host a (NIC 10 Mbit/s), rank 2 on host b (no cap).
    hosts = (("a", 10.0), ("a", 10.0), ("b", 0.0))
    run = RunSpec(label="x", codec="fp32", steps=1, bandwidth_mbps=100.0, latency_ms=10.0,
                  tcp_window_bytes=50_000.0, hosts=hosts)  # fmt: skip
    table = rank_links(run, 3, 100e6, "/tmp/nics")
    assert table[(0, 1)] == LinkSpec(bandwidth_bits_per_s=100e6, latency_s=0.01)  # same host
    cross = table[(1, 2)]
    assert cross.window_bytes == 50_000.0
    assert cross.effective_bits_per_s == pytest.approx(20e6)  # 8 x 50,000 / 0.02 s
    assert cross.nic == NicRoute(state_path="/tmp/nics", num_hosts=2, src_host=0, dst_host=1,
                                 out_bits_per_s=10e6, in_bits_per_s=math.inf)  # fmt: skip
    assert rank_links(run, 3, 100e6)[(1, 2)].nic is None  # no state file: no NIC
    with pytest.raises(ValueError, match="lists 3 ranks"):
        rank_links(run, 4, 100e6)


def _send_at(path: str, barrier: Any, num_bytes: int, out: Any) -> None:
    route = NicRoute(state_path=path, num_hosts=2, src_host=0, dst_host=1,
                     out_bits_per_s=8e6, in_bits_per_s=math.inf)  # fmt: skip
    shaper = LinkShaper(LinkSpec(bandwidth_bits_per_s=80e6, nic=route))  # each its own link
    barrier.wait(60)  # every process submits at about the same time
    t0 = time.monotonic()
    shaper.submit(num_bytes, lambda: None).wait(30.0)
    out.put((t0, time.monotonic()))
    shaper.close()


def _span_s(path: Path, num_processes: int) -> float:
    """Seconds from the first submission to the last completion, over the processes."""
    context = multiprocessing.get_context("spawn")
    queue, barrier = context.Queue(), context.Barrier(num_processes)
    procs = [
        context.Process(target=_send_at, args=(str(path), barrier, 200_000, queue))
        for _ in range(num_processes)
    ]
    for p in procs:
        p.start()
    try:
        times = [queue.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return max(done for _, done in times) - min(t0 for t0, _ in times)


@pytest.mark.distributed
def test_two_processes_of_one_host_share_its_nic(tmp_path: Path) -> None:
    # 200 kB hold an 8 Mbit/s NIC 0.2 s (each process has its own 80 Mbit/s link, which is
    # not the limit): one process alone finishes after ~0.2 s, two at once after ~0.4 s.
    alone = _span_s(tmp_path / "alone", 1)
    pair = _span_s(tmp_path / "pair", 2)
    assert 0.15 < alone < 0.5
    assert 0.35 < pair < 1.0
    assert pair > 1.5 * alone
