"""The agent's command handlers: registered by Command member, each id run once, repeats answered."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from agent.commands.executor import MEMORY_CAPABILITY, TOO_LATE, CommandExecutor
from agent.commands.memory import INTERRUPTED, UNREADABLE, CommandMemory
from agent.commands.registry import REGISTRY, CommandContext, CommandHandler, discover, register
from agent.commands.run_probes import RunProbesHandler
from agent.probes.base import ProbeOutcome
from protos.gpufleet.v1 import telemetry_pb2 as pb


class CountingProbes:
    """A probe runner that counts its runs; `gate` (when set) holds a run until it is opened."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.gate: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def available(self) -> list[str]:
        return ["membw"]

    def close(self) -> None:
        pass

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        self.runs.append(command_id)
        if self.gate is not None and self.loop is not None:
            asyncio.run_coroutine_threadsafe(self.gate.wait(), self.loop).result(timeout=10)
        return [ProbeOutcome("membw", "d2d", 0, 3000.0, "GB/s", 0.5, 0.0)]


def executor(
    probes: CountingProbes,
    state_dir: Path | None = None,
    handlers: dict[str, type[CommandHandler]] | None = None,
) -> tuple[CommandExecutor, list[str]]:
    delivered: list[str] = []
    ctx = CommandContext(
        probes=probes, deliver_probes=lambda outs: delivered.extend(o.command_id for o in outs)
    )
    return CommandExecutor(ctx, state_dir, handlers), delivered


def probe(cid: str) -> pb.Command:
    return pb.Command(id=cid, run_probes=pb.RunProbes(probes=["membw"]))


def test_handlers_are_registered_by_their_command_member() -> None:
    assert discover()["run_probes"] is RunProbesHandler
    members = {f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["action"].fields}
    assert set(REGISTRY) <= members  # every handler serves a Command member
    assert "run_probes" in executor(CountingProbes())[0].capabilities

    class Typo(CommandHandler):
        name = "run_probe"

        async def run(self, command: pb.Command) -> pb.CommandResult:
            return pb.CommandResult(ok=True)

    with pytest.raises(ValueError, match=r"names no member of Command\.action"):
        register(Typo)
    with pytest.raises(ValueError, match="registered twice"):
        register(RunProbesHandler)


def test_an_unknown_kind_is_answered_not_ok_with_what_the_agent_serves() -> None:
    ex, _ = executor(CountingProbes())
    result = asyncio.run(ex.execute(pb.Command(id="x1")))  # no action: a member this agent lacks
    assert (result.command_id, result.ok) == ("x1", False)
    assert result.error == "unsupported command None: this agent serves apply_profile, run_probes"
    ex_without, _ = executor(CountingProbes())
    ex_without.handlers.clear()
    result = asyncio.run(ex_without.execute(probe("x2")))
    assert (result.ok, result.error) == (False, "unsupported command 'run_probes': this agent serves none")


def test_a_repeated_id_is_answered_from_memory_not_run_again() -> None:
    probes = CountingProbes()
    ex, delivered = executor(probes)

    async def go() -> tuple[pb.CommandResult, pb.CommandResult, pb.CommandResult]:
        first = await ex.execute(probe("c1"))
        again = await ex.execute(probe("c1"))
        other = await ex.execute(probe("c2"))
        return first, again, other

    first, again, other = asyncio.run(go())
    assert probes.runs == ["c1", "c2"] and delivered == ["c1", "c2"]  # c1 ran once
    assert first.ok and not first.repeated and first.run_probes.results == 1
    assert again.repeated and (again.command_id, again.ok, again.run_probes) == ("c1", True, first.run_probes)
    assert other.ok and not other.repeated


def test_a_repeat_while_running_waits_for_the_first_run() -> None:
    probes = CountingProbes()
    ex, _ = executor(probes)
    started: list[str] = []
    ex.on_started = started.append

    async def go() -> list[pb.CommandResult]:
        probes.gate, probes.loop = asyncio.Event(), asyncio.get_running_loop()
        first = asyncio.create_task(ex.execute(probe("c1")))
        while not probes.runs:
            await asyncio.sleep(0.01)
        repeat = asyncio.create_task(ex.execute(probe("c1")))
        await asyncio.sleep(0.05)
        assert not repeat.done()  # it waits rather than answering "already in progress"
        probes.gate.set()
        return [await first, await repeat]

    first, repeat = asyncio.run(go())
    assert probes.runs == ["c1"] and started == ["c1"]
    assert first.ok and repeat.ok and repeat.repeated and not first.repeated


def test_the_memory_on_disk_survives_an_agent_restart(tmp_path: Path) -> None:
    probes = CountingProbes()
    first, _ = executor(probes, tmp_path / ".commands")
    assert asyncio.run(first.execute(probe("c1"))).ok
    failed = asyncio.run(first.execute(pb.Command(id="c2", run_probes=pb.RunProbes(probes=["nope"]))))
    restarted, _ = executor(probes, tmp_path / ".commands")  # a new agent boot, the same state dir
    again = asyncio.run(restarted.execute(probe("c1")))
    assert again.repeated and again.ok and probes.runs == ["c1", "c2"]
    assert asyncio.run(restarted.execute(probe("c2"))).error == failed.error  # failures are kept too
    in_memory_only, _ = executor(probes)
    assert not asyncio.run(in_memory_only.execute(probe("c1"))).repeated  # no state dir: runs again


def test_a_run_cut_short_by_a_restart_is_not_run_again(tmp_path: Path) -> None:
    memory = CommandMemory(tmp_path)
    memory.started("c1")  # the agent died here
    probes = CountingProbes()
    ex, _ = executor(probes, tmp_path)
    result = asyncio.run(ex.execute(probe("c1")))
    assert (result.ok, result.error, result.repeated) == (False, INTERRUPTED, True)
    assert probes.runs == []


def test_ids_unfit_for_a_file_name_are_remembered_in_memory_only(tmp_path: Path) -> None:
    memory = CommandMemory(tmp_path)
    memory.finished(pb.CommandResult(command_id="../escape", ok=True))
    assert memory.recall("../escape") is not None
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "escape.result").exists()


def test_the_memory_is_bounded(tmp_path: Path) -> None:
    memory = CommandMemory(tmp_path, keep=3)
    for i in range(5):
        memory.finished(pb.CommandResult(command_id=f"c{i}", ok=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c2.result", "c3.result", "c4.result"]
    assert memory.recall("c0") is None and memory.recall("c4") is not None


def test_a_result_that_could_not_be_written_does_not_erase_the_started_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk full when the result is written: <id>.started stays, so after an agent restart a repeat
    is answered (interrupted), not run a second time."""
    real_replace = Path.replace

    def replace(self: Path, target: os.PathLike[str] | str) -> Path:
        if str(target).endswith(".result"):
            raise OSError(28, "No space left on device")
        return real_replace(self, target)

    probes = CountingProbes()
    first, _ = executor(probes, tmp_path)
    monkeypatch.setattr(Path, "replace", replace)
    assert asyncio.run(first.execute(probe("c1"))).ok
    assert asyncio.run(first.execute(probe("c1"))).repeated  # this boot still remembers it
    monkeypatch.setattr(Path, "replace", real_replace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c1.started"]  # no temporary file left
    restarted, _ = executor(probes, tmp_path)  # agent restart, same state dir
    again = asyncio.run(restarted.execute(probe("c1")))
    assert probes.runs == ["c1"], f"run twice: {probes.runs}"
    assert again.repeated and (again.ok, again.error) == (False, INTERRUPTED)


def test_an_empty_result_file_still_answers_the_command_it_names(tmp_path: Path) -> None:
    """A zero-length <id>.result (power loss before the data reached disk) is unreadable, and the
    answer names the id asked about (an empty message would carry command_id '')."""
    CommandMemory(tmp_path)
    (tmp_path / "c1.result").write_bytes(b"")
    probes = CountingProbes()
    ex, _ = executor(probes, tmp_path)
    answer = asyncio.run(ex.execute(probe("c1")))
    assert answer.command_id == "c1" and not answer.ok and UNREADABLE in answer.error
    assert probes.runs == []


def test_a_corrupt_result_file_is_answered_as_unreadable_not_raised(tmp_path: Path) -> None:
    CommandMemory(tmp_path)
    (tmp_path / "c1.result").write_bytes(b"\xff\xff\xff")
    ex, _ = executor(CountingProbes(), tmp_path)
    answer = asyncio.run(ex.execute(probe("c1")))  # protobuf's DecodeError is caught
    assert (answer.command_id, answer.ok, answer.repeated) == ("c1", False, True)
    assert answer.error.startswith(UNREADABLE)


def test_a_result_file_naming_another_id_answers_the_id_asked_about(tmp_path: Path) -> None:
    CommandMemory(tmp_path)
    (tmp_path / "c1.result").write_bytes(pb.CommandResult(ok=True).SerializeToString())
    ex, _ = executor(CountingProbes(), tmp_path)
    assert asyncio.run(ex.execute(probe("c1"))).command_id == "c1"


def test_a_command_past_its_deadline_is_refused_not_run(tmp_path: Path) -> None:
    probes = CountingProbes()
    ex, _ = executor(probes, tmp_path)
    late = probe("c1")
    late.seconds_left = 0.0
    answer = asyncio.run(ex.execute(late))
    assert (answer.command_id, answer.ok, answer.error) == ("c1", False, TOO_LATE)
    in_time = probe("c2")
    in_time.seconds_left = 1.0
    assert asyncio.run(ex.execute(in_time)).ok and probes.runs == ["c2"]
    # A command it ran before its deadline is answered from memory after it, not refused.
    in_time.seconds_left = 0.0
    ex_later, _ = executor(probes, tmp_path)
    again = asyncio.run(ex_later.execute(in_time))
    assert again.ok and again.repeated and probes.runs == ["c2"]


class Retune(CommandHandler):
    """A mutating handler for tests (served under a real Command member's name)."""

    name = "run_probes"
    mutating: ClassVar[bool] = True
    runs: ClassVar[list[str]] = []

    async def run(self, command: pb.Command) -> pb.CommandResult:
        self.runs.append(command.id)
        return pb.CommandResult(ok=True)


def test_a_mutating_command_is_refused_when_its_start_cannot_be_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Retune.runs.clear()
    ex, _ = executor(CountingProbes(), tmp_path, handlers={"run_probes": Retune})
    real_replace = Path.replace

    def replace(self: Path, target: os.PathLike[str] | str) -> Path:
        if str(target).endswith(".started"):
            raise OSError(28, "No space left on device")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    refused = asyncio.run(ex.execute(probe("m1")))
    assert not refused.ok and refused.error.startswith("not run: cannot record the command as started")
    assert Retune.runs == []
    monkeypatch.setattr(Path, "replace", real_replace)
    assert asyncio.run(ex.execute(probe("m2"))).ok and Retune.runs == ["m2"]
    # A command that does not change the node still runs when the mark cannot be written.
    monkeypatch.setattr(Path, "replace", replace)
    assert asyncio.run(executor(CountingProbes(), tmp_path)[0].execute(probe("p1"))).ok


def test_an_agent_with_a_state_dir_says_it_remembers_commands(tmp_path: Path) -> None:
    assert MEMORY_CAPABILITY in executor(CountingProbes(), tmp_path)[0].capabilities
    assert executor(CountingProbes())[0].capabilities == ["run_probes"]


def test_started_marks_and_temporary_files_are_pruned_too(tmp_path: Path) -> None:
    (tmp_path / ".c9.result.tmp").write_bytes(b"half")  # a write cut short by a crash
    memory = CommandMemory(tmp_path, keep=3)
    for i in range(5):
        memory.started(f"s{i}")  # begun, never finished (each agent stopped mid-run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s2.started", "s3.started", "s4.started"]
    memory.finished(pb.CommandResult(command_id="c0", ok=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0.result", "s3.started", "s4.started"]
    newest = (tmp_path / "c0.result").stat().st_mtime_ns + 10**9
    os.utime(tmp_path / "c0.result", ns=(newest, newest))
    reopened = CommandMemory(tmp_path, keep=2)  # bounded when it starts, too
    assert len(list(tmp_path.iterdir())) == 2 and reopened.recall("c0") is not None
