"""Is each bundled dataset installed, and does it verify? What `frugal data list` reports."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from frugal import FrugalError
from frugal.data.errors import DatasetMissingError
from frugal.data.loaders import DataConfig, verify_dataset
from frugal.data.records import DATASETS, DatasetInfo, DatasetStats
from frugal.data.source import UnpinnedSourceWarning, locate_files

__all__ = ["DatasetStatus", "check_dataset", "check_datasets"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetStatus:
    """The state of one bundled dataset on this machine."""

    info: DatasetInfo
    """The dataset's record."""
    text: str
    """One line for a table: installed, verified, absent (optional), MISSING or FAILED."""
    stats: DatasetStats | None
    """Statistics measured on the parsed data (with `verify`), else None."""
    failed: bool
    """Whether this dataset makes `frugal data list` exit 1 (a required one is unusable)."""


def check_dataset(info: DatasetInfo, *, verify: bool, config: DataConfig) -> DatasetStatus:
    """Locate a dataset's files and, with `verify`, hash them, load it and check its counts.

    Args:
        info: The dataset's record.
        verify: Hash every file and measure the statistics; otherwise only locate the files.
        config: Cache and hashing settings.

    Returns:
        Its status; a missing optional dataset is not a failure.

    Raises:
        FrugalError: If a file's checksum or the measured statistics do not match the record.
    """
    stats = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnpinnedSourceWarning)
        try:
            if verify:
                stats = verify_dataset(info, config)
            else:
                locate_files(info)
        except DatasetMissingError:
            if info.optional:
                text = f"absent (optional: {info.source.install_command()})"
                return DatasetStatus(info=info, text=text, stats=None, failed=False)
            text = f"MISSING: {info.source.install_command()}"
            return DatasetStatus(info=info, text=text, stats=None, failed=True)
    if any(issubclass(w.category, UnpinnedSourceWarning) for w in caught):
        text = "installed, other version (checksum not checked)"
        return DatasetStatus(info=info, text=text, stats=stats, failed=False)
    text = "verified" if verify else "installed"
    return DatasetStatus(info=info, text=text, stats=stats, failed=False)


def check_datasets(*, verify: bool, config: DataConfig) -> list[DatasetStatus]:
    """The status of every bundled dataset, in `DATASETS` order (see `check_dataset`).

    A dataset that fails its checks is reported as FAILED with the reason, not raised, so one
    bad dataset does not hide the others.
    """
    statuses = []
    for info in DATASETS:
        try:
            statuses.append(check_dataset(info, verify=verify, config=config))
        except FrugalError as exc:
            statuses.append(
                DatasetStatus(info=info, text=f"FAILED: {exc}", stats=None, failed=True)
            )
    return statuses
