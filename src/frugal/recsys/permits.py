"""K permits per trainer: a batch's permit returns when every shard acknowledged its push.

References:
    Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to 100
    Trillion Parameters, KDD 2022, arXiv 2111.05897 (section 3.2: bounded staleness).
"""

from __future__ import annotations

import functools
import threading

from frugal.recsys.errors import PSUnavailableError, StalenessBoundError
from frugal.recsys.transport import Handle

__all__ = ["Permits"]


class Permits:
    """K permits; a batch's permit returns when all of its pushes are acknowledged."""

    def __init__(self, count: int, bound: int, timeout_s: float) -> None:
        self.count, self.bound, self.timeout_s = count, bound, timeout_s
        self.semaphore = threading.Semaphore(count)
        self.errors: list[BaseException] = []
        self.max_lag = 0
        self.lock = threading.Lock()

    def acquire(self) -> None:
        """Take a permit, waiting at most timeout_s (then `PSUnavailableError`)."""
        if not self.semaphore.acquire(timeout=self.timeout_s):
            raise PSUnavailableError(
                f"no permit came back within {self.timeout_s} s: a push was never acknowledged"
            )

    def release_when_acked(self, handles: list[Handle]) -> None:
        """Return one permit once every handle finished; record lags and errors.

        A lag above the bound or a failed push is kept and raised by `check`.
        """
        remaining = [len(handles)]
        if not handles:
            self.semaphore.release()
            return

        def done(handle: Handle) -> None:
            try:
                lag = int(handle.wait())
                with self.lock:
                    self.max_lag = max(self.max_lag, lag)
                if lag > self.bound:
                    raise StalenessBoundError(
                        f"a pushed row was {lag} updates stale, above the bound {self.bound}"
                    )
            except BaseException as exc:
                self.errors.append(exc)
            with self.lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self.semaphore.release()

        for handle in handles:
            handle.add_done_callback(functools.partial(done, handle))

    def check(self) -> None:
        """Raise the first error a push reported, if any."""
        if self.errors:
            raise self.errors[0]

    def drain(self) -> None:
        """Wait for every outstanding push (all permits back)."""
        for _ in range(self.count):
            self.acquire()
        for _ in range(self.count):
            self.semaphore.release()
        self.check()
