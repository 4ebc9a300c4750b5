"""OpenCommands: the unfinished commands by id, with a by-node index that must never drift."""

from __future__ import annotations

import random

import pytest

from controller.commands.open_commands import OpenCommands
from controller.store.commands import CommandRecord
from protos.gpufleet.v1 import telemetry_pb2 as pb


def _record(command_id: str, node: str) -> CommandRecord:
    return CommandRecord(command_id, node, "probe", "op", 0.0, 60.0, pb.Command(id=command_id))


def _scan(commands: OpenCommands, node: str) -> list[str]:
    return [r.id for r in commands.values() if r.node == node]


def test_a_nodes_commands_come_oldest_first_and_leave_with_their_record() -> None:
    commands = OpenCommands()
    for command_id, node in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]:
        commands[command_id] = _record(command_id, node)
    assert [r.id for r in commands.of_node("a")] == ["a1", "a2", "a3"]
    del commands["a2"]
    assert commands.pop("a1").id == "a1"
    assert commands.pop("zz", None) is None
    with pytest.raises(KeyError):
        commands.pop("zz")
    assert [r.id for r in commands.of_node("a")] == ["a3"]
    assert [r.id for r in commands.of_node("b")] == ["b1"]
    assert commands.of_node("nobody") == []
    del commands["a3"]
    assert commands.of_node("a") == [] and list(commands) == ["b1"]


def test_setting_an_id_again_keeps_its_place_and_follows_a_new_node() -> None:
    commands = OpenCommands()
    commands["x"] = _record("x", "a")
    commands["y"] = _record("y", "a")
    commands["x"] = _record("x", "a")  # a reloaded row: same place
    assert [r.id for r in commands.of_node("a")] == ["x", "y"]
    commands["x"] = _record("x", "b")
    assert [r.id for r in commands.of_node("a")] == ["y"]
    assert [r.id for r in commands.of_node("b")] == ["x"]


def test_bulk_changes_that_would_bypass_the_index_are_refused() -> None:
    commands = OpenCommands()
    commands["x"] = _record("x", "a")
    with pytest.raises(TypeError, match="one command at a time"):
        commands.clear()
    with pytest.raises(TypeError, match="one command at a time"):
        commands.update({})
    with pytest.raises(TypeError, match="one command at a time"):
        commands.popitem()
    with pytest.raises(TypeError):
        commands.setdefault("y", _record("y", "a"))
    assert [r.id for r in commands.of_node("a")] == ["x"]


def test_the_index_matches_a_scan_through_random_opens_and_finishes() -> None:
    rng = random.Random(17)
    commands = OpenCommands()
    nodes = [f"n{i}" for i in range(12)]
    for step in range(3000):
        if commands and rng.random() < 0.45:
            victim = rng.choice(list(commands))
            if rng.random() < 0.5:
                del commands[victim]
            else:
                commands.pop(victim)
        else:
            command_id = f"c{step}"
            commands[command_id] = _record(command_id, rng.choice(nodes))
        node = rng.choice(nodes)
        assert [r.id for r in commands.of_node(node)] == _scan(commands, node)
    assert sum(len(commands.of_node(n)) for n in nodes) == len(commands)
