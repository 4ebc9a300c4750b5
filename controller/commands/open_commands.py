"""The unfinished commands by id, oldest first, with an index by node.

A node's Hello asks for its unfinished commands (to send them again) and an issue asks whether a
mutating one holds the node. Scanning every open command for that is fine with a few, but when a
tenth of a 12,500-node fleet is probing and the fleet reconnects at once, 12,500 scans of 1,250
records were most of a second of the event loop. The index keeps each node's commands in the order
they were opened, like the dict itself.
"""

from __future__ import annotations

from typing import Any, NoReturn

from controller.store.commands import CommandRecord


class OpenCommands(dict[str, CommandRecord]):
    """id -> record, oldest first; `of_node(node)`: that node's, oldest first."""

    def __init__(self) -> None:
        super().__init__()
        self._by_node: dict[str, dict[str, CommandRecord]] = {}

    def __setitem__(self, command_id: str, record: CommandRecord) -> None:
        old = self.get(command_id)
        if old is not None and old.node != record.node:
            self._unindex(command_id, old.node)
        super().__setitem__(command_id, record)
        self._by_node.setdefault(record.node, {})[command_id] = record

    def __delitem__(self, command_id: str) -> None:
        record = self[command_id]
        super().__delitem__(command_id)
        self._unindex(command_id, record.node)

    def pop(self, command_id: str, *default: Any) -> Any:
        if command_id not in self:
            if default:
                return default[0]
            raise KeyError(command_id)
        record = self[command_id]
        del self[command_id]
        return record

    def of_node(self, node: str) -> list[CommandRecord]:
        return list(self._by_node.get(node, {}).values())

    def _unindex(self, command_id: str, node: str) -> None:
        mine = self._by_node[node]
        del mine[command_id]
        if not mine:
            del self._by_node[node]

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise TypeError("OpenCommands changes one command at a time: set, del or pop")

    clear = update = setdefault = popitem = __ior__ = _refuse
