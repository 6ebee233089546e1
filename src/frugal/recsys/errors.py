"""Domain errors of `frugal.recsys`."""

from frugal import FrugalError

__all__ = ["BadBatchError", "PSUnavailableError", "RecsysError", "StalenessBoundError"]


class RecsysError(FrugalError):
    """Recommender training cannot go on (a peer is gone, a bound is broken, bad data)."""


class BadBatchError(RecsysError):
    """A batch fails validation (id out of range, NaN, bad label); nothing was applied."""


class PSUnavailableError(RecsysError):
    """A parameter-server shard did not answer within the timeout."""


class StalenessBoundError(RecsysError):
    """A measured read staleness exceeded the bound the mode guarantees (a bug, not bad luck)."""
