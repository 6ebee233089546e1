"""Domain errors of `frugal.data`."""

from frugal import FrugalError

__all__ = ["DatasetChecksumError", "DatasetMissingError", "DatasetStatsError"]


class DatasetMissingError(FrugalError):
    """The package or system file that carries a dataset is not installed.

    The message names the exact command that installs it.
    """


class DatasetChecksumError(FrugalError):
    """A dataset file's SHA-256 (or size) differs from the one pinned in its `DatasetInfo`.

    The message names the file, the expected and the actual digest.
    """


class DatasetStatsError(FrugalError):
    """A parsed dataset's counts differ from the ones pinned in its `DatasetInfo`.

    The file's checksum matched, so this points at a parser bug, not at a bad file.
    """
