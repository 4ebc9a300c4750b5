"""Runs commands from the controller through the registered handlers, each id once.

An unknown kind is answered ok=false. A repeated id (the controller re-sends after its restart, on
a new stream, or to a restarted agent) is answered from CommandMemory with `repeated` set; a repeat
that arrives while the first is still running waits for that run's result instead of starting
another. A command that arrives with no time left (`seconds_left` <= 0, not run before) is refused:
the controller has given up on it, and may have let another command for the node go. A mutating
command is refused too when its start cannot be recorded on disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from agent.commands.memory import CommandMemory, MemoryUnwritable
from agent.commands.registry import CommandContext, CommandHandler, discover
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.agent.commands")
MEMORY_CAPABILITY = "command_memory"  # in Hello.capabilities: ids and results survive an agent restart
TOO_LATE = "deadline passed before it started"


class CommandExecutor:
    def __init__(
        self,
        ctx: CommandContext,
        state_dir: str | os.PathLike[str] | None = None,
        handlers: dict[str, type[CommandHandler]] | None = None,
    ) -> None:
        registry = discover() if handlers is None else handlers
        self.handlers = {name: cls(ctx) for name, cls in sorted(registry.items())}
        self.memory = CommandMemory(state_dir)
        self._capabilities = [name for name, cls in sorted(registry.items()) if cls.applies(ctx)]
        if self._capabilities and self.memory.durable:
            self._capabilities.append(MEMORY_CAPABILITY)
        self._running: dict[str, asyncio.Future[pb.CommandResult]] = {}
        self.on_started: Callable[[str], None] | None = None  # tells the controller a run began

    @property
    def capabilities(self) -> list[str]:
        """The commands this agent can serve here, for Hello.capabilities, and `command_memory`
        when it keeps the ids it ran on disk."""
        return list(self._capabilities)

    async def execute(self, command: pb.Command) -> pb.CommandResult:
        cid = command.id
        if cid:
            running = self._running.get(cid)
            if running is not None:
                log.info("command %s repeated while running: answering when the first run ends", cid)
                return _repeat(await asyncio.shield(running))
            kept = self.memory.recall(cid)
            if kept is not None:
                log.info("command %s repeated: answering the kept result, not running it again", cid)
                return _repeat(kept)
        if command.HasField("seconds_left") and command.seconds_left <= 0:
            log.warning("command %s arrived after its deadline: not run", cid)
            return pb.CommandResult(command_id=cid, ok=False, error=TOO_LATE)
        kind = command.WhichOneof("action")
        handler = self.handlers.get(kind or "")
        if handler is None:
            offered = ", ".join(self.handlers) or "none"
            error = f"unsupported command {kind!r}: this agent serves {offered}"
            return pb.CommandResult(command_id=cid, ok=False, error=error)
        if cid:
            try:
                self.memory.started(cid, required=handler.mutating)
            except MemoryUnwritable as exc:
                log.error("command %s (%s) refused: %s", cid, kind, exc)
                return pb.CommandResult(command_id=cid, ok=False, error=f"not run: {exc}")
        future: asyncio.Future[pb.CommandResult] = asyncio.get_running_loop().create_future()
        if cid:
            self._running[cid] = future
        if cid and self.on_started is not None:
            self.on_started(cid)
        try:
            result = await handler.run(command)
        except Exception as exc:  # a failing handler is a failed command, remembered like any other
            log.exception("command %s (%s) failed", cid, kind)
            result = pb.CommandResult(ok=False, error=f"{type(exc).__name__}: {exc}")
        except BaseException:  # cancelled (the agent is stopping): a waiting repeat is cancelled too
            future.cancel()
            raise
        finally:
            self._running.pop(cid, None)
        result.command_id = cid
        if cid:
            self.memory.finished(result)
        future.set_result(result)
        return result


def _repeat(result: pb.CommandResult) -> pb.CommandResult:
    answer = pb.CommandResult()
    answer.CopyFrom(result)
    answer.repeated = True
    return answer
