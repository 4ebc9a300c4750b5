"""The command channel on a real SQLite file: states stored, deadlines, one mutating command per
node, re-sending with the same id after a restart, and one stream per node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.commands.channel import MEMORY_CAPABILITY, WAKE, CommandChannel
from controller.commands.kinds import CommandKind
from controller.errors import FailedPrecondition
from controller.interceptors import status_for
from controller.store.commands import CommandRecord
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0, Clock, hello

Outbox = asyncio.Queue[pb.ControllerMessage]
MUTATING = {"run_probes": CommandKind("run_probes", mutating=True, timeout_seconds=60.0)}


@contextlib.asynccontextmanager
async def channel(
    db: Path, clock: Clock, kinds: dict[str, CommandKind] | None = None
) -> AsyncIterator[CommandChannel]:
    """A channel over the store file `db`, with the commands a previous run left unfinished loaded."""
    store = Store(str(db))
    await store.open()
    try:
        ch = CommandChannel(store, clock, kinds)
        await ch.load()
        yield ch
    finally:
        await store.list_commands()  # every queued write is committed before the store closes
        store.close()


def probe() -> pb.Command:
    return pb.Command(run_probes=pb.RunProbes(probes=["gemm"]))


def sent(outbox: Outbox) -> list[str]:
    ids = []
    while not outbox.empty():
        msg = outbox.get_nowait()
        if msg.WhichOneof("msg") == "command":
            ids.append(msg.command.id)
    return ids


async def stored(db: Path) -> dict[str, CommandRecord]:
    """What a fresh controller would read from the file."""
    store = Store(str(db))
    await store.open()
    try:
        return {r.id: r for r in await store.list_commands()}
    finally:
        store.close()


def test_every_state_is_stored_with_its_requester_times_and_result(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1"), outbox, "peer-1")
            record = await ch.issue("n1", probe(), "operator:alice", timeout_seconds=30)
            assert len(record.id) == 32 and sent(outbox) == [record.id]
            assert (record.state, record.sent, record.boot_id) == ("sent", T0, "b1")
            clock.now += 1
            ch.started("n1", record.id)
            assert record.state == "running"
            clock.now += 2
            answer = pb.CommandResult(command_id=record.id, ok=True, run_probes=pb.RunProbesResult(results=3))
            assert ch.answered("n2", answer) is None  # another node's stream cannot answer it
            assert ch.answered("n1", answer) is record
            assert ch.answered("n1", answer) is None  # a late repeat changes nothing
        row = (await stored(db))[record.id]
        assert (row.node, row.kind, row.requester, row.state) == (
            "n1",
            "run_probes",
            "operator:alice",
            "succeeded",
        )
        assert (row.created, row.sent, row.finished, row.deadline) == (T0, T0, T0 + 3, T0 + 30)
        assert row.result == answer and row.command.run_probes.probes == ["gemm"] and row.error == ""

    asyncio.run(go())


def test_a_command_past_its_deadline_is_timed_out_and_stored_so(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            finished: list[CommandRecord] = []
            ch.listeners.append(finished.append)
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            record = await ch.issue("n1", probe(), "scheduler", timeout_seconds=5)
            clock.now += 4.9
            assert ch.expire() == [] and record.state == "sent"
            clock.now += 0.1
            assert ch.expire() == [record] and finished == [record]
            assert (record.state, record.error, record.failure) == (
                "timed_out",
                "no answer within 5s",
                "timeout",
            )
        row = (await stored(db))[record.id]
        assert (row.state, row.finished, row.error) == ("timed_out", T0 + 5, "no answer within 5s")
        async with channel(db, clock) as again:  # a restarted controller owes nothing
            assert again.open == {}

    asyncio.run(go())


def test_one_mutating_command_per_node_the_second_refused_naming_the_first(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock, MUTATING) as ch:
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            ch.open_stream(hello("n2"), asyncio.Queue(), "peer-2")
            first = await ch.issue("n1", probe(), "operator:alice")
            with pytest.raises(FailedPrecondition) as refused:
                await ch.issue("n1", probe(), "operator:bob")
            code, details = status_for(refused.value)
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert details == (
                f"node n1 already has a mutating command in flight: {first.id} "
                "(run_probes, sent, requested by operator:alice)"
            )
            assert len(ch.in_flight("n1")) == 1
            await ch.issue("n2", probe(), "operator:bob")  # other nodes are not held up
            ch.answered("n1", pb.CommandResult(command_id=first.id, ok=False, error="boom"))
            await ch.issue("n1", probe(), "operator:bob")  # finished, even failed: the node is free
        async with channel(db, clock) as plain:  # probing is not mutating: no such rule
            plain.open_stream(hello("n3"), asyncio.Queue(), "peer-3")
            await plain.issue("n3", probe(), "scheduler")
            await plain.issue("n3", probe(), "scheduler")

    asyncio.run(go())


def test_a_refused_or_unstored_command_is_not_sent(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            with pytest.raises(FailedPrecondition, match="node n1 is not connected"):
                await ch.issue("n1", probe(), "scheduler")
            assert await ch.list() == []

    asyncio.run(go())


def test_after_a_controller_restart_unfinished_commands_go_again_with_the_same_id(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as before:
            before.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            was_sent = await before.issue("n1", probe(), "scheduler", timeout_seconds=60)
            running = await before.issue("n1", probe(), "operator:alice", timeout_seconds=60)
            before.started("n1", running.id)
            # A command stored but not yet on the wire when the controller stopped:
            pending = CommandRecord("p1", "n1", "run_probes", "on_connect", T0, T0 + 60, probe())
            pending.command.id = "p1"
            await before.store.save_command(pending)
            late = CommandRecord("late", "n1", "run_probes", "scheduler", T0, T0 + 1, probe())
            await before.store.save_command(late)
        clock.now += 10
        async with channel(db, clock) as after:
            assert set(after.open) == {was_sent.id, running.id, "p1", "late"}
            outbox: Outbox = asyncio.Queue()
            after.open_stream(hello("n1"), outbox, "peer-1")  # the same agent boot comes back
            resent = [was_sent.id, running.id, "p1"]
            assert sorted(sent(outbox)) == sorted(resent)  # the same ids, nothing new
            assert {r.id: r.state for r in after.open.values()} == {
                was_sent.id: "sent",
                running.id: "running",  # the same boot goes on running it
                "p1": "sent",
            }
            late_now = after.get("late")
            assert late_now is not None and late_now.state == "timed_out"
            # The agent had run it already: it answers the repeat from its memory.
            repeat = pb.CommandResult(command_id=was_sent.id, ok=True, repeated=True)
            assert after.answered("n1", repeat) is not None
        rows = await stored(db)
        assert {i: rows[i].state for i in resent} == {
            was_sent.id: "succeeded",
            running.id: "running",
            "p1": "sent",
        }
        assert rows[was_sent.id].result == repeat and rows["late"].state == "timed_out"

    asyncio.run(go())


def test_a_new_agent_boot_fails_what_the_old_boot_was_sent(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            first: Outbox = asyncio.Queue()
            stream = ch.open_stream(hello("n1", boot="b1"), first, "peer-1")
            lost = await ch.issue("n1", probe(), "scheduler")
            ch.close_stream(stream)
            assert not ch.reachable("n1")
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1", boot="b2"), outbox, "peer-1")
            assert (lost.state, lost.error, lost.failure) == (
                "failed",
                "the agent restarted before answering",
                "restarted",
            )
            assert sent(outbox) == []  # not re-sent to a boot that never got it

    asyncio.run(go())


def test_the_newest_stream_of_a_node_gets_its_commands_and_the_old_is_told_why(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            old_box: Outbox = asyncio.Queue()
            old = ch.open_stream(hello("n1"), old_box, "ipv4:10.0.0.1:4000")
            in_flight = await ch.issue("n1", probe(), "scheduler")
            new_box: Outbox = asyncio.Queue()
            new = ch.open_stream(hello("n1"), new_box, "ipv4:10.0.0.2:5000")
            assert old.replaced.is_set() and not new.replaced.is_set()
            assert old.replaced_by == "replaced by a newer stream for node n1 from ipv4:10.0.0.2:5000"
            assert new.replaces == "ipv4:10.0.0.1:4000" and old.replaces == ""  # for the log (servicer)
            # The old stream's handler is woken at once (servicer.py: it waits on its outbox alone).
            queued = [old_box.get_nowait() for _ in range(old_box.qsize())]
            assert [m.command.id for m in queued[:-1]] == [in_flight.id] and queued[-1] is WAKE
            assert sent(new_box) == [in_flight.id]  # what the old stream was sent goes again, same id
            ch.close_stream(old)  # the old stream ending does not take the new one with it
            later = await ch.issue("n1", probe(), "scheduler")
            assert sent(new_box) == [later.id] and old_box.empty()

    asyncio.run(go())


def test_only_a_pending_command_can_be_cancelled(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            on_wire = await ch.issue("n1", probe(), "scheduler")
            assert ch.cancel(on_wire.id, "operator asked") is None  # it may be running: runs to its end
            waiting = CommandRecord("w1", "n9", "run_probes", "operator:alice", T0, T0 + 60, probe())
            ch.open["w1"] = waiting
            assert ch.cancel("w1", "operator asked") is waiting
            assert (waiting.state, waiting.error) == ("cancelled", "operator asked")
        assert (await stored(db))["w1"].state == "cancelled"

    asyncio.run(go())


# -- deadlines, late answers and the mutating slot ----------------------------------------------


def test_every_command_carries_its_deadline_to_the_agent(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1"), outbox, "peer-1")
            await ch.issue("n1", probe(), "scheduler", timeout_seconds=30)
            command = outbox.get_nowait().command
            assert command.HasField("seconds_left") and command.seconds_left == 30

    asyncio.run(go())


def test_a_timed_out_mutating_command_still_holds_the_node(tmp_path: Path) -> None:
    """The agent may still be applying it: a second mutating command waits for its answer."""
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock, MUTATING) as ch:
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            first = await ch.issue("n1", probe(), "operator:alice", timeout_seconds=5)
            ch.started("n1", first.id)  # the agent says it is applying it
            clock.now += 6
            assert ch.expire() == [first] and first.state == "timed_out"
            with pytest.raises(
                FailedPrecondition, match=f"in flight: {first.id} .*timed_out.*outcome unknown"
            ):
                await ch.issue("n1", probe(), "operator:bob")
            # Its real answer comes late: stored against it, and the node is free again.
            answer = pb.CommandResult(command_id=first.id, ok=True, run_probes=pb.RunProbesResult(results=2))
            assert ch.answered("n1", answer) is first
            assert (first.state, first.result, first.error) == (
                "succeeded",
                answer,
                "answered after its deadline (no answer within 5s)",
            )
            assert ch.answered("n1", answer) is None  # a repeat of it changes nothing
            await ch.issue("n1", probe(), "operator:bob")
        row = (await stored(db))[first.id]
        assert (row.state, row.result, row.finished) == ("succeeded", answer, T0 + 6)

    asyncio.run(go())


def test_a_late_refusal_frees_the_node_and_a_new_boot_does_too(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock, MUTATING) as ch:
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            first = await ch.issue("n1", probe(), "operator:alice", timeout_seconds=5)
            clock.now += 6
            ch.expire()
            # The agent had not started it: it refuses it as too late, which frees the node.
            refused = pb.CommandResult(
                command_id=first.id, ok=False, error="deadline passed before it started"
            )
            assert ch.answered("n1", refused) is first and first.state == "failed"
            assert (
                first.error
                == "answered after its deadline (no answer within 5s): deadline passed before it started"
            )
            second = await ch.issue("n1", probe(), "operator:bob", timeout_seconds=5)
            clock.now += 6
            ch.expire()
            with pytest.raises(FailedPrecondition):
                await ch.issue("n1", probe(), "operator:carol")
            ch.open_stream(hello("n1", boot="b2"), asyncio.Queue(), "peer-1")  # the agent restarted
            await ch.issue("n1", probe(), "operator:carol")
            assert second.state == "timed_out"

    asyncio.run(go())


def test_a_timed_out_mutating_command_holds_the_node_across_a_controller_restart(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock, MUTATING) as before:
            before.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            first = await before.issue("n1", probe(), "operator:alice", timeout_seconds=5)
            clock.now += 6
            before.expire()
        async with channel(db, clock, MUTATING) as after:
            outbox: Outbox = asyncio.Queue()
            after.open_stream(hello("n1"), outbox, "peer-1")  # the same boot: asked again, same id
            assert sent(outbox) == [first.id]
            with pytest.raises(FailedPrecondition, match=first.id):
                await after.issue("n1", probe(), "operator:bob")
            assert after.answered("n1", pb.CommandResult(command_id=first.id, ok=True)) is not None
            await after.issue("n1", probe(), "operator:bob")
        assert (await stored(db))[first.id].state == "succeeded"

    asyncio.run(go())


def test_a_running_command_sent_again_to_the_same_boot_stays_running(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock) as ch:
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            record = await ch.issue("n1", probe(), "scheduler")
            ch.started("n1", record.id)
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1"), outbox, "peer-2")  # a reconnect of the same agent boot
            assert sent(outbox) == [record.id] and record.state == "running"
        assert (await stored(db))[record.id].state == "running"

    asyncio.run(go())


# -- an agent restart ---------------------------------------------------------------------------


def test_a_command_the_old_boot_was_sent_is_asked_again_of_an_agent_with_memory(tmp_path: Path) -> None:
    """The agent keeps ids and results on disk (command_memory): the new boot is asked, same id, and
    answers from disk (here: it had finished the command before its result got out)."""
    db, clock = tmp_path / "c.db", Clock()
    capable = ["run_probes", MEMORY_CAPABILITY]

    async def go() -> None:
        async with channel(db, clock) as ch:
            ch.open_stream(hello("n1", boot="b1", capabilities=capable), asyncio.Queue(), "peer-1")
            record = await ch.issue("n1", probe(), "scheduler")
            ch.started("n1", record.id)
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1", boot="b2", capabilities=capable), outbox, "peer-1")
            assert sent(outbox) == [record.id]
            assert (record.state, record.boot_id) == ("sent", "b2")  # the new boot is not running it
            kept = pb.CommandResult(command_id=record.id, ok=True, repeated=True)
            assert ch.answered("n1", kept) is record and record.state == "succeeded"

    asyncio.run(go())


class SlowStore(Store):
    """The first save_command settles only when the test says so (a slow or failing disk)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.gate: asyncio.Future[None] | None = None

    def save_command(self, record: CommandRecord, *, if_open: bool = False) -> asyncio.Future[None]:
        if self.gate is None:
            self.gate = asyncio.get_running_loop().create_future()
            return self.gate
        return super().save_command(record, if_open=if_open)


@pytest.mark.parametrize("write_fails", [True, False])
def test_a_command_is_sent_only_once_its_row_is_stored(tmp_path: Path, write_fails: bool) -> None:
    """A stream opening during the store write does not send it: if the write fails, the caller is
    told and no agent has it; if it succeeds, it goes out on the newest stream once."""
    clock = Clock()

    async def go() -> None:
        store = SlowStore(str(tmp_path / "c.db"))
        await store.open()
        try:
            ch = CommandChannel(store, clock, MUTATING)
            ch.open_stream(hello("n1", boot="b1"), asyncio.Queue(), "peer-1")
            task = asyncio.create_task(ch.issue("n1", probe(), "scheduler"))
            await asyncio.sleep(0)
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1", boot="b1"), outbox, "peer-2")  # a reconnect during the write
            assert sent(outbox) == [] and ch.open == {}
            with pytest.raises(FailedPrecondition, match="mutating command in flight"):  # slot reserved
                await ch.issue("n1", probe(), "operator:bob")
            assert store.gate is not None
            if write_fails:
                store.gate.set_exception(OSError("disk I/O error"))
                with pytest.raises(OSError):
                    await task
                assert sent(outbox) == [] and ch.open == {}
                await ch.issue("n1", probe(), "operator:bob")  # the slot is free again
            else:
                store.gate.set_result(None)
                record = await task
                assert sent(outbox) == [record.id] and record.state == "sent"
        finally:
            await store.list_commands()
            store.close()

    asyncio.run(go())


def test_a_command_that_times_out_as_a_new_boot_connects_does_not_hold_the_node(tmp_path: Path) -> None:
    db, clock = tmp_path / "c.db", Clock()

    async def go() -> None:
        async with channel(db, clock, MUTATING) as ch:
            ch.open_stream(hello("n1", boot="b1"), asyncio.Queue(), "peer-1")
            first = await ch.issue("n1", probe(), "operator:alice", timeout_seconds=5)
            clock.now += 6  # no expire() pass ran before the agent came back
            outbox: Outbox = asyncio.Queue()
            ch.open_stream(hello("n1", boot="b2"), outbox, "peer-1")
            assert first.state == "timed_out" and sent(outbox) == []
            await ch.issue("n1", probe(), "operator:bob")

    asyncio.run(go())


def test_a_refused_probe_run_is_logged_as_one_short_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    why = "refused: GPU {} runs other processes (pid 4242); force or drain to probe"
    variants = ["gemm/bf16", "gemm/fp16", "gemm/fp8", "gemm/tf32", "membw/copy", "pcie/h2d", "pcie/d2h"]
    error = "; ".join(f"{v}: {why.format(gpu)}" for gpu in range(8) for v in variants)
    assert len(error) > 4000  # what the agent answers when every GPU is busy

    async def go() -> None:
        async with channel(tmp_path / "c.db", Clock()) as ch:
            ch.open_stream(hello("n1"), asyncio.Queue(), "peer-1")
            record = await ch.issue("n1", probe(), "scheduler", timeout_seconds=30)
            with caplog.at_level("DEBUG", logger="gpufleet.controller"):
                ch.answered("n1", pb.CommandResult(command_id=record.id, ok=False, error=error))
            assert record.error == error  # stored whole

    asyncio.run(go())
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(line) <= 300 and "\n" not in line
    assert "failed: gemm/bf16: refused: GPU 0 runs other processes" in line
    assert any(error in r.getMessage() for r in caplog.records if r.levelname == "DEBUG")
