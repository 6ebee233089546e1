"""The `file` backend's dense log: packing, sector-shared appends, recovery, old formats."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec, StoreCorruptionError
from frugal.store.backends.file import HEADER_BYTES, FileBackend, _runs

ADAM16 = RowSpec(embedding_dim=16, optimizer=OptimizerConfig(kind="adam"))  # 49 floats: 196 B


def _rows(ids: np.ndarray, value: float, width: int = ADAM16.width) -> np.ndarray:
    """Row i holds value + i in every column (so a row read from the wrong place shows)."""
    return (value + ids.astype(np.float32)).reshape(-1, 1).repeat(width, axis=1)


def test_records_are_packed_at_their_natural_size(tmp_path: Path) -> None:
    # 196 B row + 16 B footer = 212, rounded up to 8: 216 B per record (format 2: 512 B).
    with EmbeddingStore.create(tmp_path / "s", num_rows=1000, spec=ADAM16) as store:
        store.put(np.arange(1000), _rows(np.arange(1000), 0.5))
        store.flush()
        assert store.backend.stride == 216  # type: ignore[attr-defined]
        # 1000 x 216 = 216,000 B of records, written out to the next 512 B sector: 216,064.
        assert (tmp_path / "s" / "log.0.dat").stat().st_size == HEADER_BYTES + 216_064
    with EmbeddingStore.open(tmp_path / "s") as store:
        assert np.array_equal(store.peek(np.arange(1000)), _rows(np.arange(1000), 0.5))


def test_runs_read_whole_sectors_and_merge_records_that_share_them() -> None:
    # stride 216, sectors of 512: records 0-2 span bytes 0..648 (sectors 0-1), record 3
    # (648..864) shares sector 1, record 40 (8640..8856) is far away (sectors 16-17).
    offsets = np.array([0, 216, 432, 648, 8640], dtype=np.int64)
    runs, positions, total = _runs(offsets, 216, 512)
    assert runs == [(0, 0, 1024, 864), (1024, 8192, 1024, 664)]
    assert positions.tolist() == [0, 216, 432, 648, 1024 + 448]
    assert total == 2048
    # 200 adjacent records: one run of 64 records at most (MAX_RUN_ROWS), in 4 reads.
    runs, positions, total = _runs(np.arange(200, dtype=np.int64) * 216, 216, 512)
    assert [count for _, _, _, count in runs][:1] == [64 * 216]  # first run: records 0-63
    assert len(runs) == 4 and positions[64] == runs[1][0] + 64 * 216 - runs[1][1]


@pytest.mark.parametrize("align_bytes", [512, 4096])
def test_concurrent_small_appends_never_lose_a_neighbour_in_a_shared_sector(
    tmp_path: Path, align_bytes: int
) -> None:
    # Four writers append 3 rows at a time (648 B: most appends share a sector with the
    # previous one) while a reader reads rows already written. Every row must read back as
    # the last value written to it.
    backend = FileBackend(tmp_path, 2000, ADAM16.width, None, align_bytes=align_bytes)
    try:
        assert backend.align == align_bytes
        done = threading.Event()
        errors: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                for rnd in range(2):
                    for first in range(k * 500, (k + 1) * 500, 3):
                        ids = np.arange(first, min(first + 3, (k + 1) * 500), dtype=np.int64)
                        backend.write_rows(ids, _rows(ids, 10.0 * (rnd + 1)))
            except BaseException as exc:  # reported below
                errors.append(exc)

        def reader() -> None:
            out = np.empty((2000, ADAM16.width), dtype=np.float32)
            try:
                while not done.is_set():
                    ids = np.flatnonzero(backend.location >= 0).astype(np.int64)
                    present = backend.read_rows(ids, out[: len(ids)])
                    assert present.all()
                    got = out[: len(ids), 0] - ids  # 10.0 or 20.0 (round 1 or 2)
                    assert np.isin(got, (10.0, 20.0)).all()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        watcher = threading.Thread(target=reader)
        watcher.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        watcher.join()
        assert errors == []
        ids = np.arange(2000, dtype=np.int64)
        out = np.empty((2000, ADAM16.width), dtype=np.float32)
        assert backend.read_rows(ids, out).all()
        assert np.array_equal(out, _rows(ids, 20.0))
        assert backend.tail == 2 * 2000  # 2 rounds of 2000 records, no padding records
    finally:
        backend.close()


@pytest.mark.parametrize("align_bytes", [512, 4096])
def test_recovery_cuts_the_log_mid_sector_and_later_appends_keep_the_checkpoint(
    tmp_path: Path, align_bytes: int
) -> None:
    backend = FileBackend(tmp_path, 100, ADAM16.width, None, align_bytes=align_bytes)
    first = np.arange(7, dtype=np.int64)
    backend.write_rows(first, _rows(first, 1.0))
    backend.sync()
    info = backend.checkpoint(1)
    later = np.arange(7, 30, dtype=np.int64)
    backend.write_rows(later, _rows(later, 2.0))  # after the checkpoint: to be dropped
    backend.sync()
    backend.close()
    # 7 records end at 4096 + 7 x 216 = 5608: inside a sector, for both sector sizes.
    assert (HEADER_BYTES + 7 * 216) % align_bytes != 0
    backend = FileBackend(
        tmp_path, 100, ADAM16.width, 1, manifest_info=info, align_bytes=align_bytes
    )
    try:
        assert backend.tail == 7
        assert (tmp_path / "log.0.dat").stat().st_size == HEADER_BYTES + 7 * 216
        more = np.arange(50, 53, dtype=np.int64)  # rewrites the sector holding record 6's end
        backend.write_rows(more, _rows(more, 3.0))
        ids = np.concatenate([first, later, more])
        out = np.empty((len(ids), ADAM16.width), dtype=np.float32)
        present = backend.read_rows(ids, out)
        assert present.tolist() == [True] * 7 + [False] * 23 + [True] * 3
        assert np.array_equal(out[:7], _rows(first, 1.0))
        assert np.array_equal(out[30:], _rows(more, 3.0))
    finally:
        backend.close()


def test_a_store_of_the_previous_log_format_is_refused_with_the_version_and_the_fix(
    tmp_path: Path,
) -> None:
    # A format-3 store as frugal 0.3 wrote it: one log file per generation, its MANIFEST's
    # backend_info {generation, tail, stride} and a log header saying format_version 3.
    directory = tmp_path / "s"
    with EmbeddingStore.create(directory, num_rows=10, spec=ADAM16) as store:
        store.put(np.arange(3), _rows(np.arange(3), 1.0))
    manifest = json.loads((directory / "MANIFEST").read_text())
    del manifest["manifest_sha256"], manifest["file_sha256"]
    manifest["format_version"] = 1
    manifest["backend_info"] = {"generation": 0, "tail": 3, "stride": 216}
    (directory / "MANIFEST").write_text(json.dumps(manifest))
    log = directory / "log.0.dat"
    blob = log.read_bytes()
    header = json.loads(blob[:HEADER_BYTES].rstrip(b"\0"))
    header = {k: header[k] for k in ("magic", "num_rows", "width", "stride")}
    header["format_version"] = 3
    log.write_bytes(json.dumps(header).encode().ljust(HEADER_BYTES, b"\0") + blob[HEADER_BYTES:])
    with pytest.raises(StoreCorruptionError) as info:
        EmbeddingStore.open(directory)
    message = str(info.value)
    assert "log.0.dat: log format_version 3, but this frugal reads version 4 only" in message
    assert "open the store with the frugal that wrote it" in message and "`put`" in message


def test_a_corrupt_row_found_by_a_prefetch_is_a_store_corruption_error(tmp_path: Path) -> None:
    # Row 5's record fails its checksum; the lookahead's background read finds it first, and
    # the get that follows must still say "corrupt", not only "a background read failed".
    directory = tmp_path / "s"
    with EmbeddingStore.create(directory, num_rows=100, spec=ADAM16) as store:
        store.put(np.arange(10), _rows(np.arange(10), 1.0))
    address = int(np.load(directory / "index.1.npy")[5])
    log = directory / "log.0.dat"
    blob = bytearray(log.read_bytes())
    blob[HEADER_BYTES + address * 216 + 3] ^= 0x01  # inside row 5's first float
    log.write_bytes(bytes(blob))
    with EmbeddingStore.open(directory) as store:
        store.lookahead(np.array([5]), step=1)
        with pytest.raises(StoreCorruptionError, match=r"row id 5 at offset .* restore it"):
            store.get(np.array([5]), step=1)
        store.close(checkpoint=False)


def _small_segments(
    directory: Path, num_rows: int, epoch: int | None = None, **kw: object
) -> FileBackend:
    """A backend of 1,024-record segments that cleans as soon as the bound is passed."""
    return FileBackend(
        directory, num_rows, ADAM16.width, epoch, segment_shift=10, clean_min_records=0,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("log.*.dat"))


def test_rewriting_rows_keeps_the_log_within_its_space_bound_and_every_row_intact(
    tmp_path: Path,
) -> None:
    # 5,000 rows written once, then 40 rounds of rewriting 2,000 random ones: 85,000 records
    # for 5,000 live. Without cleaning that is 84 segments; with it, disk records stay below
    # 1.5 x 5,000 + 2 segments (+ the tail segment being filled) after every write.
    rng = np.random.default_rng(0)
    backend = _small_segments(tmp_path, 5000)
    expected = np.zeros(5000, dtype=np.float32)
    try:
        ids = np.arange(5000, dtype=np.int64)
        backend.write_rows(ids, _rows(ids, 0.0))
        for rnd in range(1, 41):
            ids = np.sort(rng.choice(5000, size=2000, replace=False)).astype(np.int64)
            backend.write_rows(ids, _rows(ids, 1000.0 * rnd))
            expected[ids] = 1000.0 * rnd
            assert backend.live_records() == 5000
            # A write never runs more than two segments past the bound, whatever the
            # cleaner thread is doing; once it has caught up, the log is within the bound.
            assert backend.disk_records() <= 1.5 * 5000 + 5 * 1024
            backend.wait_for_cleaning(timeout_s=60)
            assert backend.disk_records() <= 1.5 * 5000 + 3 * 1024
        assert backend.cleaned_segments > 0 and backend.cleaned_records > 0
        # Only the segments in use are on disk; the live counts match a recount.
        assert len(_segment_files(tmp_path)) == len(backend._segments)
        assert backend.live_per_slot.sum() == 5000
        every = np.arange(5000, dtype=np.int64)
        out = np.empty((5000, ADAM16.width), dtype=np.float32)
        assert backend.read_rows(every, out).all()
        assert np.array_equal(out, _rows(every, 0.0) + expected[:, None])
    finally:
        backend.close()


def test_cleaning_keeps_the_checkpoints_segments_until_the_next_checkpoint(
    tmp_path: Path,
) -> None:
    # Checkpoint 1 points into segments 0-1; rewriting random rows makes the cleaner empty
    # them. They must stay on disk (retired) so that a crash recovers checkpoint 1,
    # and go once checkpoint 2 no longer needs them.
    backend = _small_segments(tmp_path, 2000)
    ids = np.arange(2000, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 1.0))
    backend.sync()
    info = backend.checkpoint(1)
    backend.finish_checkpoint(1)
    assert sorted(info["segments"]) == ["0", "1"]
    rng = np.random.default_rng(1)
    for rnd in range(40):  # 40 x 600 random rows: garbage spread over the segments
        part = np.sort(rng.choice(2000, size=600, replace=False)).astype(np.int64)
        backend.write_rows(part, _rows(part, 100.0 + rnd))
    backend.wait_for_cleaning(timeout_s=60)
    assert backend.cleaned_segments > 0 and backend.deleted_segments > 0
    assert {0, 1} <= backend._retired  # emptied, but checkpoint 1 reads them
    assert {"log.0.dat", "log.1.dat"} <= set(_segment_files(tmp_path))
    backend.sync()
    backend.close()  # a crash: no checkpoint 2

    backend = _small_segments(tmp_path, 2000, 1, manifest_info=info)
    try:
        out = np.empty((2000, ADAM16.width), dtype=np.float32)
        assert backend.read_rows(ids, out).all()
        assert np.array_equal(out, _rows(ids, 1.0))
        # Recovery deleted every segment begun after the checkpoint.
        assert _segment_files(tmp_path) == ["log.0.dat", "log.1.dat"]
        for rnd in range(12):
            backend.write_rows(ids, _rows(ids, 200.0 + rnd))
        backend.sync()
        info2 = backend.checkpoint(2)
        backend.finish_checkpoint(2)
        assert "0" not in info2["segments"] and not (tmp_path / "log.0.dat").exists()
        assert len(_segment_files(tmp_path)) == len(info2["segments"])
    finally:
        backend.close()
    backend = _small_segments(tmp_path, 2000, 2, manifest_info=info2)
    try:
        assert backend.read_rows(ids, out).all()
        assert np.array_equal(out, _rows(ids, 211.0))
    finally:
        backend.close()


def test_readers_running_while_the_cleaner_deletes_segments_read_every_row(
    tmp_path: Path,
) -> None:
    # One thread rewrites all rows (the cleaner deletes segments under the readers); two
    # readers read every row throughout. A reader must see one of the written values, never
    # a corruption error from a segment closed or reused under it.
    backend = _small_segments(tmp_path, 3000, io_threads=4)
    ids = np.arange(3000, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 0.0))
    done = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        out = np.empty((3000, ADAM16.width), dtype=np.float32)
        try:
            while not done.is_set():
                assert backend.read_rows(ids, out).all()
                got = out[:, 0] - ids
                assert np.isin(got, np.arange(0.0, 31.0)).all()
                assert (out == out[:, :1]).all()  # whole rows, never a mix
        except BaseException as exc:  # reported below
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    try:
        for thread in readers:
            thread.start()
        rng = np.random.default_rng(2)
        for rnd in range(1, 31):
            for _ in range(4):  # 4 x 500 random rows per round
                part = np.sort(rng.choice(3000, size=500, replace=False)).astype(np.int64)
                backend.write_rows(part, _rows(part, float(rnd)))
    finally:
        done.set()
        for thread in readers:
            thread.join()
        backend.close()
    assert errors == []
    assert backend.cleaned_segments > 0 and backend.deleted_segments > 5


def test_space_amplification_must_exceed_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_space_amplification=1.0 must be > 1"):
        FileBackend(tmp_path, 10, 4, None, max_space_amplification=1.0)
    with pytest.raises(ValueError, match=r"max_space_amplification=0.5 must be > 1"):
        EmbeddingStore.Config(max_space_amplification=0.5)


def test_the_store_config_sets_the_logs_space_bound(tmp_path: Path) -> None:
    config = EmbeddingStore.Config(max_space_amplification=1.2)
    with EmbeddingStore.create(tmp_path / "s", num_rows=10, spec=ADAM16, config=config) as store:
        assert store.backend.max_space_amplification == 1.2  # type: ignore[attr-defined]
        store.put(np.arange(4), _rows(np.arange(4), 1.0))
        store.flush()
        assert store.stats()["backend"]["live_records"] == 4


def test_an_empty_checkpoint_pins_no_segment_and_recovers_a_fresh_tail(tmp_path: Path) -> None:
    # Checkpoint 0 of a new table points at no record: it pins nothing, so the cleaner may
    # delete segment 0; recovering checkpoint 0 then begins an empty tail segment anew.
    backend = _small_segments(tmp_path, 2000)
    info = backend.checkpoint(0)
    backend.finish_checkpoint(0)
    assert info["segments"] == {} and info["tail"] == 0
    rng = np.random.default_rng(3)
    ids = np.arange(2000, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 1.0))
    for rnd in range(30):
        part = np.sort(rng.choice(2000, size=600, replace=False)).astype(np.int64)
        backend.write_rows(part, _rows(part, 10.0 + rnd))
    # The first segment (sequence 0) was deleted (its slot may hold a newer one).
    backend.wait_for_cleaning(timeout_s=60)
    assert backend.deleted_segments > 0
    assert all(segment.sequence > 0 for segment in backend._segments.values())
    assert backend.disk_records() <= 1.5 * 2000 + 3 * 1024
    backend.close()  # a crash
    backend = _small_segments(tmp_path, 2000, 0, manifest_info=info)
    try:
        assert _segment_files(tmp_path) == ["log.0.dat"] and backend.tail == 0
        out = np.empty((2000, ADAM16.width), dtype=np.float32)
        assert not backend.read_rows(ids, out).any()  # every row at its initial value
        backend.write_rows(ids[:5], _rows(ids[:5], 7.0))
        assert backend.read_rows(ids[:5], out[:5]).all()
        assert np.array_equal(out[:5], _rows(ids[:5], 7.0))
    finally:
        backend.close()


def test_a_checkpoint_being_taken_keeps_its_segments_from_the_cleaner(tmp_path: Path) -> None:
    # Between checkpoint() and finish_checkpoint() (the store fsyncs the MANIFEST between
    # them) the cleaner may empty the segments the new index points into; it must retire
    # them, not delete them, or a crash right after the MANIFEST is written loses the rows.
    backend = _small_segments(tmp_path, 2000)
    ids = np.arange(2000, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 1.0))
    backend.sync()
    info = backend.checkpoint(1)  # not finished: checkpoint 1 is being taken
    rng = np.random.default_rng(4)
    for rnd in range(40):
        part = np.sort(rng.choice(2000, size=600, replace=False)).astype(np.int64)
        backend.write_rows(part, _rows(part, 100.0 + rnd))
    backend.wait_for_cleaning(timeout_s=60)
    assert backend.cleaned_segments > 0
    assert {0, 1} <= backend._retired
    backend.sync()
    backend.close()  # a crash before finish_checkpoint
    backend = _small_segments(tmp_path, 2000, 1, manifest_info=info)
    try:
        out = np.empty((2000, ADAM16.width), dtype=np.float32)
        assert backend.read_rows(ids, out).all()
        assert np.array_equal(out, _rows(ids, 1.0))
    finally:
        backend.close()


def test_rows_rewritten_while_the_cleaner_copies_them_keep_their_newest_value(
    tmp_path: Path,
) -> None:
    # Many small writes race the cleaner thread's copies; its compare-and-set must never
    # put back an older record over a newer one.
    backend = _small_segments(tmp_path, 3000)
    expected = np.zeros(3000, dtype=np.float32)
    ids = np.arange(3000, dtype=np.int64)
    rng = np.random.default_rng(5)
    try:
        backend.write_rows(ids, _rows(ids, 0.0))
        for rnd in range(1, 401):
            part = np.sort(rng.choice(3000, size=150, replace=False)).astype(np.int64)
            backend.write_rows(part, _rows(part, 10.0 * rnd))
            expected[part] = 10.0 * rnd
        backend.wait_for_cleaning(timeout_s=60)
        assert backend.cleaned_records > 0
        out = np.empty((3000, ADAM16.width), dtype=np.float32)
        assert backend.read_rows(ids, out).all()
        assert np.array_equal(out, _rows(ids, 0.0) + expected[:, None])
        assert backend.live_per_slot.sum() == 3000
        assert backend.disk_records() <= 1.5 * 3000 + 3 * 1024
    finally:
        backend.close()


@pytest.mark.parametrize("where", [3, 216 - 16], ids=["row", "footer id"])
def test_a_corrupt_record_found_by_the_cleaner_fails_the_next_write(
    tmp_path: Path, where: int
) -> None:
    # The cleaner reads segments in order and finds live records by their footer's id; a
    # damaged footer hides the record from that pass, and the index finds it instead.
    backend = _small_segments(tmp_path, 2000)
    ids = np.arange(2000, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 1.0))
    backend.sync()
    address = int(backend.location[7])  # row 7, in segment 0
    with (tmp_path / "log.0.dat").open("r+b") as fh:
        fh.seek(HEADER_BYTES + address * 216 + where)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x01]))
    rest = ids[ids != 7]
    rng = np.random.default_rng(6)

    def rewrite_until_the_cleaner_copies_row_7() -> None:
        for rnd in range(200):
            part = np.sort(rng.choice(rest, size=600, replace=False))
            backend.write_rows(part, _rows(part, 10.0 + rnd))
            backend.wait_for_cleaning(timeout_s=60)

    try:
        with pytest.raises(StoreCorruptionError, match=r"row id 7 at offset .* restore it"):
            rewrite_until_the_cleaner_copies_row_7()
        # The cleaner stopped; every write after it says so too.
        with pytest.raises(StoreCorruptionError, match=r"row id 7"):
            backend.write_rows(rest[:3], _rows(rest[:3], 0.0))
    finally:
        backend.close()


class _Interleaved(FileBackend):
    """Runs `hook` once where `read_rows` has read the addresses but not the segment map."""

    hook: Callable[[], None] | None = None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[dict[int, Any]]:
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        with super()._reading() as segments:
            yield segments


@pytest.mark.parametrize("reuse", [True, False], ids=["slot reused", "segment gone"])
def test_a_read_whose_segment_is_deleted_under_it_reads_the_rows_new_address(
    tmp_path: Path, reuse: bool
) -> None:
    # Row 5's address is read, then (before the reader takes the segment map) its segment
    # is emptied and deleted, and with `reuse` its slot begun again with other rows at that
    # index. The read must return the row's newest value: no false corruption error, never
    # an older record.
    backend = _Interleaved(
        tmp_path, 1024, ADAM16.width, None, segment_shift=10, clean_min_records=0
    )
    ids = np.arange(1024, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 1000.0))  # segment 0, row i at index i

    def rewrite() -> None:
        backend.write_rows(ids, _rows(ids, 2000.0))
        backend.write_rows(ids, _rows(ids, 3000.0))
        if reuse:  # slot 0 again, rows in reverse order
            backend.write_rows(ids[::-1].copy(), _rows(ids[::-1].copy(), 4000.0))

    backend.hook = rewrite
    out = np.empty((1, ADAM16.width), dtype=np.float32)
    try:
        assert backend.read_rows(np.array([5]), out).all()
        assert out[0, 0] == (4005.0 if reuse else 3005.0)
        assert (0 in backend._segments) == reuse
    finally:
        backend.close()


def test_deleted_segments_are_closed_while_other_reads_keep_running(tmp_path: Path) -> None:
    # Two readers read back to back, so some read is always running; a deleted segment's fd
    # must still be closed once the reads that began before its deletion have ended.
    backend = _small_segments(tmp_path, 5000)
    ids = np.arange(5000, dtype=np.int64)
    backend.write_rows(ids, _rows(ids, 0.0))
    done = threading.Event()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        out = np.empty((512, ADAM16.width), dtype=np.float32)
        while not done.is_set():
            backend.read_rows(np.sort(rng.choice(5000, 512, replace=False)), out)

    threads = [threading.Thread(target=reader, args=(s,)) for s in (1, 2)]
    most_open = 0
    try:
        for thread in threads:
            thread.start()
        rng = np.random.default_rng(0)
        for _ in range(150):
            some = np.sort(rng.choice(5000, 2000, replace=False)).astype(np.int64)
            backend.write_rows(some, _rows(some, 1.0))
            most_open = max(most_open, len(backend._closing))
    finally:
        done.set()
        for thread in threads:
            thread.join()
    try:
        assert backend.deleted_segments > 50
        assert most_open < 20  # (it grew without bound: ~900 after 10 s)
        assert backend._closing == []  # no read runs: every deleted fd is closed
    finally:
        backend.close()


def test_a_checkpoints_index_points_at_durable_records_only(tmp_path: Path) -> None:
    # The cleaner may append after the store's sync(); checkpoint() syncs what it finds.
    backend = _small_segments(tmp_path, 2000)
    ids = np.arange(2000, dtype=np.int64)
    try:
        backend.write_rows(ids, _rows(ids, 1.0))  # not synced
        assert backend._unsynced
        backend.checkpoint(1)
        assert backend._unsynced == set()
    finally:
        backend.close()
