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

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5, the network settings).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from frugal import FrugalError

__all__ = [
    "RHO_POINTS",
    "LinkError",
    "LinkShaper",
    "LinkSpec",
    "SendHandle",
    "bandwidth_from_rho",
    "link_table",
    "transfer_time_s",
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


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """One directed link's emulated network."""

    bandwidth_bits_per_s: float = math.inf
    """Bandwidth in bit/s, > 0; inf = not shaped."""
    latency_s: float = 0.0
    """One-way latency in seconds, >= 0."""

    def __post_init__(self) -> None:
        if not self.bandwidth_bits_per_s > 0:
            raise ValueError(
                f"bandwidth_bits_per_s={self.bandwidth_bits_per_s} must be > 0 (inf = unshaped)"
            )
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s={self.latency_s} must be finite and >= 0")

    @property
    def is_shaped(self) -> bool:
        """Whether sends on this link are delayed at all."""
        return math.isfinite(self.bandwidth_bits_per_s) or self.latency_s > 0


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
        spec: Bandwidth and latency of the link.
        clock: Monotonic clock in seconds (tests inject one).
        sleep: Sleep function in seconds (tests inject one).
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

        start = max(now, free_at); the link is busy until start + 8 L / B; the message is
        released to the real transport at start + 8 L / B + latency.
        """
        with self._lock:
            now = self._clock()
            hold_s = (
                transfer_time_s(num_bytes, self.spec.bandwidth_bits_per_s)
                if math.isfinite(self.spec.bandwidth_bits_per_s)
                else 0.0
            )
            start = max(now, self._free_at)
            self._free_at = start + hold_s
            self.busy_s += hold_s
            self.sent_bytes += num_bytes
            return start, self._free_at + self.spec.latency_s

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
