"""Domain errors of `frugal.store`."""

from frugal import FrugalError

__all__ = [
    "CacheTooSmallError",
    "NonFiniteError",
    "StalenessTimeoutError",
    "StoreCorruptionError",
    "StoreError",
    "StoreLockedError",
]


class StoreError(FrugalError):
    """A store cannot do what was asked (incomplete store, I/O failure, closed store)."""


class StoreCorruptionError(StoreError):
    """Stored bytes fail a check (size, header, per-row checksum or id); nothing is repaired."""


class CacheTooSmallError(StoreError):
    """One call needs more rows at once than the cache holds (raise the memory budget).

    Attributes:
        wanted_rows: Rows the call needed resident at once (0: unknown, e.g. the error was
            rebuilt from its message on the other side of an RPC).
        capacity_rows: Rows the cache holds (0: unknown).
    """

    def __init__(self, message: str, *, wanted_rows: int = 0, capacity_rows: int = 0) -> None:
        super().__init__(message)
        self.wanted_rows = wanted_rows
        self.capacity_rows = capacity_rows


class StoreLockedError(StoreError):
    """Another process holds the store open for writing (the pid is in the message)."""


class StalenessTimeoutError(StoreError):
    """A get waited longer than `timeout_s` for rows to come within the staleness bound."""


class NonFiniteError(ValueError):
    """Rows or gradients passed to the store hold NaN or infinity."""
