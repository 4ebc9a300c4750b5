"""The journaled apply: dry-run writes nothing, a fault at any step leaves the host exactly at the
target or exactly at its snapshot, a kill mid-apply is rolled back by recover(), and a rollback
that cannot be completed is flagged needs_attention."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from agent.tuning import journal as journal_module
from agent.tuning.apply import FAILED, NOTHING_TO_DO, PLANNED, REFUSED, apply_settings, recover
from agent.tuning.base import Tree
from agent.tuning.fake import KernelTree
from agent.tuning.journal import Journal
from agent.tuning.os_settings import os_actuators
from agent.tuning.targets import OsTargets
from tests.agent.tuning.host_tree import NR_HUGEPAGES, SWAPPINESS, TARGET, contents, make_host, stamps

THREE = OsTargets(sysctls={"vm.swappiness": 10, "kernel.numa_balancing": 0}, hugepages=16)


class Killed(BaseException):
    """The process dies here: nothing after it runs (no rollback), as with SIGKILL."""


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path / "host")


@pytest.fixture
def at_target(tmp_path: Path) -> dict[str, bytes]:
    """The bytes of a host that reached TARGET cleanly."""
    root = make_host(tmp_path / "reference")
    result = apply_settings(os_actuators(), TARGET, KernelTree(root), tmp_path / "reference-journal")
    assert result.state == "applied" and len(result.changes) == 6, result
    return contents(root)


def journals(directory: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def test_a_clean_apply_reaches_the_target_and_journals_every_step(
    tmp_path: Path, host: Path, at_target: dict[str, bytes]
) -> None:
    result = apply_settings(os_actuators(), TARGET, KernelTree(host), tmp_path / "journal")
    assert result.ok and contents(host) == at_target
    [record] = journals(tmp_path / "journal")
    assert record["state"] == "applied" and record["op_id"] == result.op_id
    assert {
        "setting": "os.sysctls.vm.swappiness",
        "actuator": "sysctls",
        "current": "60",
        "target": "10",
        "pending_reboot": False,
    } in (
        record["changes"]  # type: ignore[operator]
    )
    steps = [s["step"] for s in record["steps"]]  # type: ignore[attr-defined]
    assert steps[0] == "snapshot taken" and steps[-2:] == ["reading back", "at target"]
    assert len(record["started"]) == 6  # type: ignore[arg-type]


def test_nothing_to_do_writes_nothing(tmp_path: Path, host: Path) -> None:
    tree = KernelTree(host)
    assert apply_settings(os_actuators(), TARGET, tree, tmp_path / "j1").state == "applied"
    before, times = contents(host), stamps(host)
    again = KernelTree(host)
    assert apply_settings(os_actuators(), TARGET, again, tmp_path / "j2").state == NOTHING_TO_DO
    assert again.writes == [] and contents(host) == before and stamps(host) == times
    assert not (tmp_path / "j2").exists()


def test_dry_run_writes_nothing_end_to_end(tmp_path: Path, host: Path) -> None:
    before, times = contents(host), stamps(host)
    real = apply_settings(os_actuators(), TARGET, Tree(host), tmp_path / "journal", dry_run=True)
    recording = KernelTree(host, perform=False)
    faked = apply_settings(os_actuators(), TARGET, recording, tmp_path / "journal", dry_run=True)
    assert real.state == faked.state == PLANNED and len(real.changes) == 6
    assert ("os.cpu_governor.cpu1", "powersave", "performance") in [
        (c.setting, c.current, c.target) for c in real.changes
    ]
    assert recording.writes == []
    assert contents(host) == before and stamps(host) == times
    assert not (tmp_path / "journal").exists()  # not even the journal


@pytest.mark.parametrize("nth", range(1, 7))
def test_a_failed_write_at_each_change_rolls_everything_back(tmp_path: Path, host: Path, nth: int) -> None:
    before = contents(host)
    tree = KernelTree(host, fail_write_at=nth)
    result = apply_settings(os_actuators(), TARGET, tree, tmp_path / "journal")
    assert result.state == "rolled_back" and "Input/output error" in result.problems[0]
    assert contents(host) == before, f"fault at write {nth} left the host changed"
    assert [r["state"] for r in journals(tmp_path / "journal")] == ["rolled_back"]


def test_a_failed_validate_writes_nothing(tmp_path: Path, host: Path) -> None:
    before = contents(host)
    bad = OsTargets(sysctls=TARGET.sysctls, hugepages=16, thp_enabled="sometimes")
    tree = KernelTree(host)
    assert apply_settings(os_actuators(), bad, tree, tmp_path / "journal").state == REFUSED
    assert tree.writes == [] and contents(host) == before


def test_a_snapshot_that_cannot_be_journaled_writes_nothing(tmp_path: Path, host: Path) -> None:
    before = contents(host)
    (tmp_path / "not-a-dir").write_text("")
    tree = KernelTree(host)
    result = apply_settings(os_actuators(), TARGET, tree, tmp_path / "not-a-dir" / "journal")
    assert result.state == FAILED and "cannot keep the tuning journal" in result.problems[0]
    assert tree.writes == [] and contents(host) == before


@pytest.mark.parametrize("nth_save", [2, 4, 8])
def test_a_journal_step_that_fails_mid_apply_rolls_back(
    tmp_path: Path, host: Path, nth_save: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = contents(host)
    saves = 0
    real_write = journal_module.atomic_write

    def flaky(path: Path, text: str) -> None:
        nonlocal saves
        saves += 1
        if saves == nth_save:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, text)

    monkeypatch.setattr(journal_module, "atomic_write", flaky)
    result = apply_settings(os_actuators(), TARGET, KernelTree(host), tmp_path / "journal")
    assert result.state == "rolled_back" and "No space left" in result.problems[0]
    assert contents(host) == before


def test_a_failed_read_back_rolls_back(tmp_path: Path, host: Path) -> None:
    before = contents(host)
    tree = KernelTree(host, fail_read_once={SWAPPINESS})
    result = apply_settings(os_actuators(), TARGET, tree, tmp_path / "journal")
    assert result.state == "rolled_back" and "could not read /proc/sys/vm/swappiness" in result.problems[0]
    assert contents(host) == before


def test_hugepages_short_of_the_target_is_a_partial_apply_not_success(tmp_path: Path, host: Path) -> None:
    before = contents(host)
    tree = KernelTree(host, hugepages_cap=10)
    result = apply_settings(os_actuators(), TARGET, tree, tmp_path / "journal")
    assert not result.ok and result.state == "rolled_back"
    assert result.partial == [
        "os.hugepages: partial apply, the kernel allocated 10 of 16 huge pages (memory fragmented)"
    ]
    assert contents(host) == before


def test_a_kill_after_the_second_of_three_changes_is_recovered(tmp_path: Path, host: Path) -> None:
    before = contents(host)
    tree = KernelTree(host, fail_write_at=3, fault=Killed())
    with pytest.raises(Killed):
        apply_settings(os_actuators(), THREE, tree, tmp_path / "journal")
    assert tree.writes == [("proc/sys/vm/swappiness", "10"), ("proc/sys/kernel/numa_balancing", "0")]
    assert contents(host) != before
    [left] = journals(tmp_path / "journal")
    assert left["state"] == "applying" and len(left["started"]) == 3  # type: ignore[arg-type]

    [result] = recover(tmp_path / "journal", host)
    assert result.state == "rolled_back" and result.op_id == left["op_id"]
    assert "interrupted apply (state applying)" in result.problems[0]
    assert contents(host) == before
    assert journals(tmp_path / "journal")[0]["state"] == "rolled_back"
    assert recover(tmp_path / "journal", host) == []  # finished: nothing left at the next start


def test_a_rollback_that_fails_needs_attention_and_is_retried_at_start(tmp_path: Path) -> None:
    """nr_hugepages 64 -> 0 frees the pages; when the apply fails later, memory is fragmented and
    only 16 come back: the host cannot be put back, and says what is left."""
    host = make_host(tmp_path / "host", hugepages=64)
    before = contents(host)
    targets = OsTargets(sysctls={"vm.swappiness": 10}, hugepages=0)
    tree = KernelTree(host, hugepages_cap=16, fail_read_once={SWAPPINESS})
    result = apply_settings(os_actuators(), targets, tree, tmp_path / "journal")
    assert result.state == "needs_attention"
    assert result.left == [
        "os.hugepages: partial apply, the kernel allocated 16 of 64 huge pages (memory fragmented)"
    ]
    assert (host / NR_HUGEPAGES).read_text().strip() == "16"
    assert (host / SWAPPINESS).read_text().strip() == "60"  # the rest is back
    [record] = journals(tmp_path / "journal")
    assert record["state"] == "needs_attention" and record["left"] == result.left

    [again] = recover(tmp_path / "journal", host)  # memory freed since: the rollback completes
    assert again.state == "rolled_back" and contents(host) == before


def test_recover_flags_a_journal_it_cannot_roll_back(tmp_path: Path, host: Path) -> None:
    journal = Journal.create(tmp_path / "journal", [])
    journal.record["changes"] = [{"actuator": "bios", "setting": "bmc.x", "current": "a", "target": "b"}]
    journal.step("applying", "writing bmc.x")
    (tmp_path / "journal" / "garbled.json").write_text("{not json")
    results = recover(tmp_path / "journal", host)
    assert [r.state for r in results] == ["needs_attention", "needs_attention"]
    assert any("no actuator 'bios'" in p for r in results for p in r.problems)


def test_recover_without_a_journal_does_nothing(tmp_path: Path, host: Path) -> None:
    before, times = contents(host), stamps(host)
    assert recover(tmp_path / "none", host) == []
    assert contents(host) == before and stamps(host) == times


def test_an_apply_waits_for_an_unfinished_one_so_recovery_never_reverts_a_later_apply(tmp_path: Path) -> None:
    host = make_host(tmp_path / "host", hugepages=64)
    journal = tmp_path / "journal"
    first = OsTargets(sysctls={"vm.swappiness": 10}, hugepages=0)
    stuck = KernelTree(host, hugepages_cap=16, fail_read_once={SWAPPINESS})
    assert apply_settings(os_actuators(), first, stuck, journal).state == "needs_attention"
    later = OsTargets(sysctls={"vm.swappiness": 30})
    refused = apply_settings(os_actuators(), later, KernelTree(host), journal)
    assert refused.state == "refused" and "unfinished" in refused.problems[0]
    assert (host / SWAPPINESS).read_text().strip() == "60"  # nothing written
    assert apply_settings(os_actuators(), later, KernelTree(host), journal, dry_run=True).state == "planned"
    (recovered,) = recover(journal, host)  # the next start
    assert recovered.state == "rolled_back"
    assert apply_settings(os_actuators(), later, KernelTree(host), journal).state == "applied"
    assert recover(journal, host) == []  # a restart now keeps the later apply
    assert (host / SWAPPINESS).read_text().strip() == "30"
