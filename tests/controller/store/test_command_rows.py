"""A command's row on both backends (tests/store_backends.py): once finished it never goes back to
open, whichever write commits last (with replica_ingest its issuer and the replica that sends it
both write it); a late answer still replaces a finished state."""

from __future__ import annotations

import dataclasses

from controller.store.commands import CommandRecord
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.store.test_store import run


def _record(**fields: object) -> CommandRecord:
    base = CommandRecord("c1", "n1", "run_probes", "scheduler", 100.0, 200.0, pb.Command(id="c1"))
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def test_a_finished_command_is_not_reopened_by_a_state_sent_before(store_db: str) -> None:
    async def go() -> None:
        store = Store(store_db)
        await store.open()
        await store.save_command(_record())
        await store.save_command(_record(state="timed_out", finished=201.0, error="no answer"))
        await store.save_command(_record(state="sent", sent=150.0, boot_id="b1"))  # committed late
        (row,) = await store.commands_by_id(["c1"])
        assert (row.state, row.finished, row.error) == ("timed_out", 201.0, "no answer")
        answer = pb.CommandResult(command_id="c1", ok=True)
        await store.save_command(_record(state="succeeded", finished=230.0, result=answer))  # late answer
        (row,) = await store.commands_by_id(["c1"])
        assert (row.state, row.finished) == ("succeeded", 230.0) and row.result == answer
        assert await store.open_commands_of(["n1"]) == []
        store.close()

    run(go())


def test_open_commands_of_lists_just_those_nodes_unfinished_ones_oldest_first(store_db: str) -> None:
    async def go() -> None:
        store = Store(store_db)
        await store.open()
        await store.save_command(_record(id="b", created=102.0))
        await store.save_command(_record(id="a", created=101.0))
        await store.save_command(_record(id="other", node="n2"))
        await store.save_command(_record(id="done", state="succeeded", finished=150.0))
        assert [r.id for r in await store.open_commands_of(["n1"])] == ["a", "b"]
        assert [r.id for r in await store.open_commands_of(["n1", "n2"])] == [
            "other",
            "a",
            "b",
        ]  # created 100, 101, 102
        assert {r.id for r in await store.commands_by_id(["done", "other", "nope"])} == {"done", "other"}
        store.close()

    run(go())
