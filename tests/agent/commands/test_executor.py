"""The agent's command handlers: registered by Command member, each id run once, repeats answered."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.commands.executor import CommandExecutor
from agent.commands.memory import INTERRUPTED, CommandMemory
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


def executor(probes: CountingProbes, state_dir: Path | None = None) -> tuple[CommandExecutor, list[str]]:
    delivered: list[str] = []
    ctx = CommandContext(
        probes=probes, deliver_probes=lambda outs: delivered.extend(o.command_id for o in outs)
    )
    return CommandExecutor(ctx, state_dir), delivered


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
    assert result.error == "unsupported command None: this agent serves run_probes"
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
