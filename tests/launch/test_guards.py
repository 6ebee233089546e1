"""Resource guards: a job's memory estimate against the machine's memory, and `--force`."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from frugal.config import ConfigError
from frugal.launch import (
    FORCE_ENV,
    MemoryEstimate,
    MemoryWarning,
    TorchrunJob,
    check_memory,
    check_process_count,
    machine_memory_bytes,
    run_torchrun,
)
from frugal.launch.guards import forced

_GIB = 1 << 30


def test_an_estimate_sums_its_terms_and_names_them() -> None:
    estimate = MemoryEstimate((("a", 3 * _GIB), ("b", _GIB // 2), ("none", 0)))
    assert estimate.total_bytes == 3 * _GIB + _GIB // 2
    assert estimate.describe() == "about 3.5 GiB (a: 3 GiB, b: 512 MiB)"  # 0-byte terms left out
    with pytest.raises(ValueError, match=r"memory term 'x' = -1 bytes must be >= 0"):
        MemoryEstimate((("x", -1),))


def test_a_job_that_fits_in_free_memory_starts_without_a_word() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_memory(MemoryEstimate((("a", _GIB),)), total_bytes=8 * _GIB, available_bytes=_GIB)


def test_more_than_free_memory_warns_with_the_estimate() -> None:
    estimate = MemoryEstimate((("a", 3 * _GIB),))
    with pytest.warns(MemoryWarning, match=r"about 3 GiB \(a: 3 GiB\), more than the 2 GiB free"):
        check_memory(estimate, total_bytes=8 * _GIB, available_bytes=2 * _GIB)


def test_more_than_the_machine_has_is_refused_unless_forced() -> None:
    estimate = MemoryEstimate((("buffers", 10 * _GIB),), fix="keep them on disk (--set x=y)")
    with pytest.raises(ConfigError) as info:
        check_memory(
            estimate, what="the job", total_bytes=8 * _GIB, available_bytes=8 * _GIB, env={}
        )
    message = str(info.value)
    assert message.startswith("the job would need about 10 GiB (buffers: 10 GiB) but this")
    assert "has 8 GiB of memory; keep them on disk (--set x=y), use fewer processes" in message
    assert message.endswith("pass --force (or set FRUGAL_FORCE=1) to start it anyway")
    for override in ({"force": True, "env": {}}, {"env": {FORCE_ENV: "1"}}):  # both accepted
        with pytest.warns(MemoryWarning):  # it starts, with the warning
            check_memory(estimate, total_bytes=8 * _GIB, available_bytes=8 * _GIB, **override)


def test_force_also_lifts_the_process_count_limit() -> None:
    with pytest.raises(ConfigError):
        check_process_count(64, cores=2, env={})
    with pytest.warns(UserWarning, match="64 processes"):
        check_process_count(64, cores=2, force=True, env={})


def test_machine_memory_is_positive_and_available_within_total() -> None:
    total, available = machine_memory_bytes()
    assert 0 < available <= total
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():  # MemTotal may exceed total only by a cgroup limit below it
        mem_total_kib = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
        assert total <= mem_total_kib * 1024 * 1.01


def test_run_torchrun_refuses_a_job_over_the_machines_memory_before_starting(
    tmp_path: Path,
) -> None:
    total, _ = machine_memory_bytes()
    job = TorchrunJob(
        target=["frugal.no_such_worker"], nproc=1, timeout_s=5, log_dir=tmp_path / "logs",
        memory_estimate=MemoryEstimate((("tables", 2 * total),)),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"would need about .* \(tables: "):
        run_torchrun(job)
    assert not (tmp_path / "logs").exists()  # nothing was started or written


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("yes", True), ("TRUE", True), ("on", True), ("0", False), ("", False),
     ("no", False), ("False", False)],
)  # fmt: skip
def test_the_force_variable_is_a_yes_no_value(value: str, expected: bool) -> None:
    assert forced(env={FORCE_ENV: value}) is expected
    assert forced(force=True, env={FORCE_ENV: value}) is True


def test_a_force_value_that_is_not_yes_or_no_is_an_error_whose_fix_works() -> None:
    with pytest.raises(
        ConfigError, match=r"FRUGAL_FORCE='maybe' is not a yes/no value; set it to 1"
    ):
        forced(env={FORCE_ENV: "maybe"})
    assert forced(env={FORCE_ENV: "1"})  # the value the message suggests
