"""frugal: train large models on the infrastructure people actually have.

Five published systems in one toolkit: disk-backed embedding storage (MLKV), a fair temporal
GNN benchmark (Benchtemp), hybrid sync/async recommender training (Persia), compressed
pipeline parallelism (AQ-SGD) and heterogeneity-aware placement (the DT-FM scheduler).

This module imports no subpackage, so that every subpackage can import `FrugalError` from it.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["FrugalError", "__version__"]

try:
    __version__ = version("frugal")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"


class FrugalError(Exception):
    """Base class of frugal's domain failures (a missing dataset, a corrupt store, ...).

    Bad input raises `ValueError` or `TypeError` instead; the command line exits 1 on a
    `FrugalError` and 2 on bad input.
    """
