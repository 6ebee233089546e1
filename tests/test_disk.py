"""A full disk as one clear error: the path, the space needed and free, what to do."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from frugal.cli.main import main
from frugal.config import ConfigError
from frugal.disk import (
    DiskFullError,
    check_free_space,
    disk_filled_error,
    disk_full_error,
    free_bytes,
    human_bytes,
    is_disk_full,
    make_folder,
    mentions_disk_full,
)


def test_human_bytes_uses_binary_units() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1024) == "1 KiB"
    assert human_bytes(157 * 1024 + 512) == "158 KiB"  # 157.5 to 3 significant digits
    assert human_bytes(5 * 1024**3) == "5 GiB"


def test_free_bytes_measures_the_nearest_existing_parent(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet" / "here"
    assert free_bytes(missing) == free_bytes(tmp_path) > 0


def test_check_free_space_refuses_a_write_that_cannot_fit(tmp_path: Path) -> None:
    check_free_space(tmp_path, 1, what="a tiny file")  # fits: nothing raised
    too_much = free_bytes(tmp_path) + (1 << 40)
    with pytest.raises(DiskFullError) as info:
        check_free_space(tmp_path / "ck", too_much, what="checkpoint step-8", kept="step-4 intact")
    error = info.value
    assert error.path == tmp_path / "ck"
    assert error.needed_bytes == too_much
    message = str(error)
    assert message.startswith(f"checkpoint step-8: the disk holding {tmp_path / 'ck'} is full")
    assert f"about {human_bytes(too_much)} needed" in message
    assert "step-4 intact" in message
    assert message.endswith("choose a folder on a larger disk")


@pytest.mark.parametrize(
    ("code", "full"),
    [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EFBIG, True), (errno.EACCES, False)],
)
def test_is_disk_full_knows_the_errnos_of_a_full_disk(code: int, full: bool) -> None:
    assert is_disk_full(OSError(code, "x")) is full
    assert is_disk_full(ValueError("no")) is False


@pytest.mark.parametrize(
    ("text", "full"),
    [
        ("Exception: IO error: No space left on device: While pwrite to file", True),  # RocksDB
        ("StoreError: a background write-back failed: [Errno 28] No space left on device", True),
        ("OSError: [Errno 122] Disk quota exceeded", True),
        ("OSError: [Errno 27] File too large", True),
        ("OSError: Not enough free space to write 4096 bytes", True),  # numpy
        ("OSError: [Errno 13] Permission denied", False),
        ("ValueError: space must be > 0", False),
    ],
)
def test_mentions_disk_full_reads_an_error_text(text: str, full: bool) -> None:
    assert mentions_disk_full(text) is full


def test_disk_filled_error_gives_a_lower_bound_of_the_need(tmp_path: Path) -> None:
    free = free_bytes(tmp_path)
    for written in (3 * 1024**2, 2 * free):  # it needed more than it wrote and than it had
        error = disk_filled_error(
            tmp_path, what="the cell c", written_bytes=written, detail="IO error: x",
            kept="journal whole",
        )  # fmt: skip
        assert error.needed_bytes == max(written, error.free_bytes) and error.path == tmp_path
    message = str(error)
    need = human_bytes(2 * free)
    assert message.startswith(f"the cell c: the disk holding {tmp_path} is full (more than {need}")
    assert "; journal whole; " in message and message.endswith("[IO error: x]")


def test_disk_full_error_names_the_file_and_a_file_size_limit(tmp_path: Path) -> None:
    exc = OSError(errno.EFBIG, "File too large", str(tmp_path / "a.npz"))
    error = disk_full_error(exc, tmp_path, what="writing a.npz", needed_bytes=2048)
    assert "about 2 KiB needed" in str(error)
    assert "ulimit -f" in str(error)
    assert str(error).endswith(
        f"[File too large (a file-size limit, see `ulimit -f`): {exc.filename}]"
    )


def test_the_command_line_turns_a_full_disk_into_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "plan.json"

    def full(self: Path, *args: object, **kwargs: object) -> int:  # the disk fills up
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)  # the disk fills as the plan is written
    code = main(["plan", "--scenario", "world", "--out", str(target)])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith(f"frugal: writing plan.json: the disk holding {target} is full (")
    assert "free space there or choose a folder on a larger disk" in err
    assert err.endswith(".tmp]")  # the temporary file it was writing, removed again
    assert list(tmp_path.iterdir()) == []
    assert "Traceback" not in err


def test_make_folder_creates_parents_and_names_a_file_in_the_way(tmp_path: Path) -> None:
    made = make_folder(tmp_path / "a" / "b", what="--out")
    assert made.is_dir() and made == tmp_path / "a" / "b"
    assert make_folder(made, what="--out") == made  # an existing folder is fine
    afile = tmp_path / "f"
    afile.write_text("keep")
    with pytest.raises(ConfigError, match=r"^--out .*f is a file; give a folder"):
        make_folder(afile, what="--out", error=ConfigError)
    with pytest.raises(ValueError, match=r"^x .*/sub: cannot create the folder \(Not a dir"):
        make_folder(afile / "sub", what="x")
    assert afile.read_text() == "keep"


def test_lock_file_is_exclusive_names_its_holder_and_ends_with_its_descriptor(
    tmp_path: Path,
) -> None:
    from frugal.disk import lock_file

    first = lock_file(tmp_path / "JOB.lock")
    assert isinstance(first, int)
    assert (tmp_path / "JOB.lock").read_text() == str(os.getpid())
    assert lock_file(tmp_path / "JOB.lock") == str(os.getpid())  # held: the holder's pid
    os.close(first)  # released
    again = lock_file(tmp_path / "JOB.lock")
    assert isinstance(again, int)
    os.close(again)
