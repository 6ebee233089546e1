"""frugal: train large models on the infrastructure people actually have.

Five published systems in one toolkit: disk-backed embedding storage (MLKV), a fair temporal
GNN benchmark (Benchtemp), hybrid sync/async recommender training (Persia), compressed
pipeline parallelism (AQ-SGD) and heterogeneity-aware placement (the DT-FM scheduler).

This module imports no subpackage, so that every subpackage can import `FrugalError` from it.
In a torchrun worker started by `frugal.launch.run_torchrun` it also asks the kernel to kill
the process when its agent dies (`frugal._libc.die_with_launcher`), so `kill -9` of a command
leaves no worker behind.
"""

from importlib.metadata import PackageNotFoundError, version

from frugal._libc import die_with_launcher

__all__ = ["ConfigError", "FrugalError", "__version__"]

try:
    __version__ = version("frugal")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

die_with_launcher()


class FrugalError(Exception):
    """Base class of frugal's errors (a missing dataset, a corrupt store, bad input, ...).

    The command line prints one line for each: exit 2 for a `ConfigError` (bad input), 1 for
    any other `FrugalError` (a domain failure). Any other exception is a bug and shows its
    traceback.
    """


class ConfigError(FrugalError, ValueError):
    """Bad user input: a setting, a command-line argument or a name that does not fit.

    Raised for an unknown key, a value of the wrong type, a value a Config's validation rejects,
    an unknown registry name or dataset id, or a flag that contradicts another. It is a
    `ValueError` too, so `except ValueError` keeps catching it; the command line prints it as
    one line and exits 2. `frugal.config` re-exports it.
    """
