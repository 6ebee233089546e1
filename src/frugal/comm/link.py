"""Link emulation: a per-link shaper in the send path (bandwidth, latency; it sleeps).

CPU compute is 100-1000x slower than the paper's GPUs, so literal link speeds would make every
run compute-bound. We match the paper's transfer/compute ratio instead:
rho = (FP32 forward + backward transfer time) / (forward + backward compute) per micro-batch and
stage; with S the FP32 bytes of one boundary tensor and c the median forward+backward seconds of
the slowest stage, rho = 16 S / (B c), so B = 16 S / (rho c) bit/s. The five rho points come
from the paper's GPT2-XL setup and carry the labels of the links they stand for.

Shaper (one FIFO and one thread per directed link): a message of L bytes submitted at `now`
starts at t0 = max(now, free_at), holds the link until free_at = t0 + 8 L / B and is handed to
the real transport at free_at + latency; its handle completes with that real send. Waiting is
`threading.Event.wait` / `time.sleep`: no busy loop, so four ranks on two cores still overlap.

Two effects of real wide-area links are emulated on request:

- TCP window: one connection never carries more than a window per round trip, so B is
  replaced by `window_limited_bits_per_s(B, 2 x latency, window_bytes)` (the round trip
  assumed symmetric: twice the link's one-way latency; queueing delay not counted).
- Host NICs: the ranks of one emulated host share its NIC, also across processes. A message
  on a link whose `LinkSpec.nic` names the two hosts' NICs also queues on each of them (a
  state file holding each NIC's next free time per direction, locked with `fcntl.flock`):
  each NIC, a FIFO queue of its own, carries it from max(t0, NIC free) for 8 L / NIC, and
  the message is released at max(free_at, out NIC done, in NIC done) + latency. This is
  `frugal.planner.sim`'s NIC queue rule, on the shared monotonic clock of the machine the
  processes run on.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5, the network settings).
"""

from __future__ import annotations

import fcntl
import math
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from frugal import FrugalError

__all__ = [
    "RHO_POINTS",
    "HostNics",
    "LinkError",
    "LinkShaper",
    "LinkSpec",
    "NicRoute",
    "SendHandle",
    "bandwidth_from_rho",
    "link_table",
    "transfer_time_s",
    "window_limited_bits_per_s",
]

RHO_POINTS: Mapping[str, float] = {
    "10gbps": 0.03,
    "1gbps": 0.33,
    "500mbps": 0.65,
    "300mbps": 1.1,
    "100mbps": 3.3,
}
"""Transfer/compute ratio of each paper link (GPT2-XL, 8 stages, micro-batch 1, fp32:
S = 6.55 MB per boundary tensor, c ~ 0.32 s per stage forward+backward)."""


class LinkError(FrugalError):
    """A shaped send failed in the real transport (its cause is chained)."""


def window_limited_bits_per_s(
    bandwidth_bits_per_s: float, rtt_s: float, window_bytes: float
) -> float:
    """Throughput of one TCP connection: min(bandwidth, 8 window / RTT), bit/s.

    A sender keeps at most one receive window of unacknowledged bytes in flight, so a
    connection moves at most `window_bytes` per round trip: 8 W / RTT bit/s, whatever the
    link's bandwidth (the bandwidth-delay product B x RTT is the window a link needs to be
    full). Linux caps the window at `net.ipv4.tcp_rmem`'s max (6 MiB by default); e.g.
    W = 6 MiB over RTT = 100 ms gives 503 Mbit/s.

    Args:
        bandwidth_bits_per_s: The link's bandwidth, bit/s, > 0 (inf allowed).
        rtt_s: Round-trip time, seconds; <= 0 means no limit.
        window_bytes: Largest window, bytes, > 0; inf means no limit.

    Returns:
        The limited bandwidth, bit/s.

    Raises:
        ValueError: If the bandwidth or the window is not > 0.

    References:
        TCP Extensions for High Performance, RFC 7323, section 1 (the window limits
        throughput to window / RTT; the bandwidth-delay product). Linux
        Documentation/networking/ip-sysctl.rst, tcp_rmem (the default maximum, 6 MiB).
    """
    if not (bandwidth_bits_per_s > 0 and window_bytes > 0):
        raise ValueError(
            f"bandwidth_bits_per_s={bandwidth_bits_per_s} and window_bytes={window_bytes} "
            "must be > 0 (inf = no limit)"
        )
    if rtt_s <= 0 or math.isinf(window_bytes):
        return bandwidth_bits_per_s
    return min(bandwidth_bits_per_s, 8.0 * window_bytes / rtt_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class NicRoute:
    """The two host NICs a cross-host link's messages pass (`HostNics` state file)."""

    state_path: str
    """The job's NIC state file, shared by every process of the job (one machine)."""
    num_hosts: int
    """Hosts in the file, >= 1."""
    src_host: int
    """Sender's host, in [0, num_hosts)."""
    dst_host: int
    """Receiver's host, in [0, num_hosts), != src_host."""
    out_bits_per_s: float = math.inf
    """Capacity of the sender host's NIC (outgoing), bit/s, > 0."""
    in_bits_per_s: float = math.inf
    """Capacity of the receiver host's NIC (incoming), bit/s, > 0."""

    def __post_init__(self) -> None:
        if not (0 <= self.src_host < self.num_hosts and 0 <= self.dst_host < self.num_hosts):
            raise ValueError(
                f"src_host={self.src_host} and dst_host={self.dst_host} must lie in [0, "
                f"num_hosts={self.num_hosts})"
            )
        if self.src_host == self.dst_host:
            raise ValueError(f"src_host = dst_host = {self.src_host}: a NIC route joins two hosts")
        if not (self.out_bits_per_s > 0 and self.in_bits_per_s > 0):
            raise ValueError(
                f"out_bits_per_s={self.out_bits_per_s} and in_bits_per_s={self.in_bits_per_s} "
                "must be > 0 (inf = no cap)"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """One directed link's emulated network."""

    bandwidth_bits_per_s: float = math.inf
    """Bandwidth in bit/s, > 0; inf = not shaped."""
    latency_s: float = 0.0
    """One-way latency in seconds, >= 0."""
    window_bytes: float = math.inf
    """TCP window, bytes, > 0: the link moves at most `window_limited_bits_per_s(bandwidth,
    2 latency, window)` (RTT assumed twice the one-way latency); inf = no limit."""
    nic: NicRoute | None = None
    """The host NICs its messages also queue on (a cross-host link); None = none."""

    def __post_init__(self) -> None:
        if not self.bandwidth_bits_per_s > 0:
            raise ValueError(
                f"bandwidth_bits_per_s={self.bandwidth_bits_per_s} must be > 0 (inf = unshaped)"
            )
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s={self.latency_s} must be finite and >= 0")
        if not self.window_bytes > 0:
            raise ValueError(f"window_bytes={self.window_bytes} must be > 0 (inf = no limit)")

    @property
    def effective_bits_per_s(self) -> float:
        """The bandwidth a message gets: window-limited with RTT = 2 x latency."""
        return window_limited_bits_per_s(
            self.bandwidth_bits_per_s, 2.0 * self.latency_s, self.window_bytes
        )

    @property
    def is_shaped(self) -> bool:
        """Whether sends on this link are delayed at all."""
        return (
            math.isfinite(self.effective_bits_per_s) or self.latency_s > 0 or self.nic is not None
        )


_FREE_AT = struct.Struct("<d")
_LOCK_POLL_S = 0.0005


class HostNics:
    """Every emulated host's NIC, shared by the processes of a job through one small file.

    The file holds 2 H little-endian float64: the time (`time.monotonic`, which all
    processes of one machine share) each host's NIC is free again, outgoing then incoming.
    A missing or short file reads as zeros (free since boot), so any process may create it.
    Each reservation is one read-modify-write under `fcntl.flock`; the lock is polled, so a
    process never waits longer than `lock_timeout_s` (a dead holder's lock is released by the
    kernel with its file descriptor).

    Args:
        path: The state file (created if missing; the job removes it when it ends).
        num_hosts: H, >= 1.
        lock_timeout_s: Longest wait for the lock, seconds, > 0.
    """

    def __init__(self, path: str, num_hosts: int, *, lock_timeout_s: float = 30.0) -> None:
        if num_hosts < 1 or not lock_timeout_s > 0:
            raise ValueError(
                f"num_hosts={num_hosts} must be >= 1 and lock_timeout_s={lock_timeout_s} > 0"
            )
        self.path = path
        self.num_hosts = num_hosts
        self.lock_timeout_s = lock_timeout_s
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def reserve(self, route: NicRoute, num_bytes: int, earliest_s: float) -> float:
        """Queue a message on the route's two NICs from `earliest_s`: return when both carried it.

        Each NIC is its own FIFO queue: out_done = max(earliest_s, out_free(src host)) +
        8 L / out capacity, in_done likewise on the dst host's incoming side; each NIC is then
        busy until its done time, and the message has crossed both at max(out_done, in_done).
        An uncapped (inf) side is not queued on.

        Raises:
            LinkError: If the lock is not obtained within `lock_timeout_s`.
        """
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LinkError(
                        f"the NIC state {self.path} stayed locked for {self.lock_timeout_s} s"
                    ) from None
                time.sleep(_LOCK_POLL_S)
        try:
            done = earliest_s
            for offset, bits_per_s in (
                (_FREE_AT.size * route.src_host, route.out_bits_per_s),
                (_FREE_AT.size * (self.num_hosts + route.dst_host), route.in_bits_per_s),
            ):
                if math.isfinite(bits_per_s):
                    nic_done = max(earliest_s, self._read(offset)) + transfer_time_s(
                        num_bytes, bits_per_s
                    )
                    os.pwrite(self._fd, _FREE_AT.pack(nic_done), offset)
                    done = max(done, nic_done)
            return done
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self, offset: int) -> float:
        raw = os.pread(self._fd, _FREE_AT.size, offset)
        return _FREE_AT.unpack(raw)[0] if len(raw) == _FREE_AT.size else 0.0

    def close(self) -> None:
        """Close the file (it stays for the job's other processes)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def transfer_time_s(num_bytes: int, bandwidth_bits_per_s: float) -> float:
    """Seconds that `num_bytes` hold a link of the given bandwidth: 8 L / B (0 if unshaped).

    Raises:
        ValueError: If num_bytes < 0 or the bandwidth is not > 0.
    """
    if num_bytes < 0:
        raise ValueError(f"num_bytes={num_bytes} must be >= 0")
    if not bandwidth_bits_per_s > 0:
        raise ValueError(f"bandwidth_bits_per_s={bandwidth_bits_per_s} must be > 0")
    return 8.0 * num_bytes / bandwidth_bits_per_s


def bandwidth_from_rho(rho: float, boundary_bytes: int, compute_s: float) -> float:
    """Bandwidth that gives transfer/compute ratio `rho`: B = 16 S / (rho c) bit/s.

    Args:
        rho: FP32 forward+backward transfer time over forward+backward compute, > 0.
        boundary_bytes: S, FP32 bytes of one boundary tensor (one micro-batch), > 0.
        compute_s: c, median forward+backward seconds of the slowest stage, > 0.

    Returns:
        Bandwidth in bit/s.

    Raises:
        ValueError: If an argument is not > 0.

    References:
        Fine-tuning Language Models over Slow Networks using Activation Compression with
        Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5; rho matched, see module doc).
    """
    if not (rho > 0 and boundary_bytes > 0 and compute_s > 0):
        raise ValueError(
            f"rho={rho}, boundary_bytes={boundary_bytes}, compute_s={compute_s} must all be > 0"
        )
    return 16.0 * boundary_bytes / (rho * compute_s)


def link_table(
    world_size: int,
    default: LinkSpec,
    overrides: Mapping[tuple[int, int], LinkSpec] | None = None,
) -> dict[tuple[int, int], LinkSpec]:
    """The spec of every directed pair (src, dst) of ranks: `default` unless overridden.

    Raises:
        ValueError: If an override names a rank outside [0, world_size) or src == dst.
    """
    table = {
        (src, dst): default for src in range(world_size) for dst in range(world_size) if src != dst
    }
    for (src, dst), spec in (overrides or {}).items():
        if (src, dst) not in table:
            raise ValueError(
                f"link ({src}, {dst}) is not a pair of distinct ranks in [0, {world_size})"
            )
        table[(src, dst)] = spec
    return table


class SendHandle:
    """Completes when the shaped message has been handed over and its real send finished."""

    def __init__(self, num_bytes: int) -> None:
        self.num_bytes = num_bytes
        self.emulated_start_s = 0.0
        self.emulated_arrival_s = 0.0
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        """Whether the send finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout_s: float) -> None:
        """Block until the send finished.

        Raises:
            TimeoutError: If it did not finish within `timeout_s`.
            LinkError: If the real send failed.
        """
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"a {self.num_bytes}-byte send did not finish in {timeout_s} s")
        if self._error is not None:
            raise LinkError(f"send of {self.num_bytes} bytes failed: {self._error}") from (
                self._error
            )


_Job = tuple[SendHandle, Callable[[], None], float]


class LinkShaper:
    """FIFO shaper of one directed link: a thread that sleeps until each message may leave.

    `submit(num_bytes, send)` returns at once; the thread calls `send()` (the real transport
    call, which must block until its send completed) when the emulated transfer and latency
    have passed. Messages leave in submission order.

    Args:
        spec: Bandwidth, latency, window and NICs of the link.
        clock: Monotonic clock in seconds (tests inject one; with `spec.nic`, every process of
            the job must share it: the default).
        sleep: Sleep function in seconds (tests inject one).
        name: Names the thread.
    """

    def __init__(
        self,
        spec: LinkSpec,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        name: str = "link",
    ) -> None:
        self.spec = spec
        self._bits_per_s = spec.effective_bits_per_s
        self._nics = (
            HostNics(spec.nic.state_path, spec.nic.num_hosts) if spec.nic is not None else None
        )
        self._clock = clock
        self._sleep = sleep
        self._free_at = -math.inf
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.busy_s = 0.0
        """Total emulated transfer seconds (8 L / B summed)."""
        self.sent_bytes = 0
        self._thread = threading.Thread(target=self._run, name=f"frugal-{name}", daemon=True)
        self._thread.start()

    def schedule(self, num_bytes: int) -> tuple[float, float]:
        """Reserve the link for `num_bytes` now: return (start, release) times on the clock.

        start = max(now, free_at); the link is busy until free_at = start + 8 L / B (B
        window-limited) and the message is released to the real transport at free_at +
        latency, or, with `spec.nic`, at max(free_at, both NICs done) + latency
        (`HostNics.reserve` from start).

        Raises:
            LinkError: If the NIC state stays locked (`HostNics.reserve`).
        """
        with self._lock:
            now = self._clock()
            hold_s = _hold_s(num_bytes, self._bits_per_s)
            start = max(now, self._free_at)
            self._free_at = start + hold_s
            done = self._free_at
            if self._nics is not None and self.spec.nic is not None:
                done = max(done, self._nics.reserve(self.spec.nic, num_bytes, start))
            self.busy_s += hold_s
            self.sent_bytes += num_bytes
            return start, done + self.spec.latency_s

    def submit(self, num_bytes: int, send: Callable[[], None]) -> SendHandle:
        """Queue a message of `num_bytes`; `send` performs (and waits for) the real send."""
        handle = SendHandle(num_bytes)
        handle.emulated_start_s, release = self.schedule(num_bytes)
        handle.emulated_arrival_s = release
        self._jobs.put((handle, send, release))
        return handle

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            handle, send, release = job
            delay = release - self._clock()
            if delay > 0:
                self._sleep(delay)
            try:
                send()
            except BaseException as exc:
                handle._finish(exc)
            else:
                handle._finish()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread after the queued messages left (waits at most `timeout_s`)."""
        self._jobs.put(None)
        self._thread.join(timeout_s)
        if self._nics is not None:
            self._nics.close()


def _hold_s(num_bytes: int, bits_per_s: float) -> float:
    """8 L / B, 0 on an uncapped (inf) resource."""
    return transfer_time_s(num_bytes, bits_per_s) if math.isfinite(bits_per_s) else 0.0
