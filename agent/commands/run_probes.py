"""RunProbes: run the requested probes off the event loop; results ride in the next frame.

One run at a time: a second RunProbes while one runs is refused (the controller keeps to one probe
run per node too). Each result is stamped with the command's id, so the controller matches them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from agent.commands.registry import CommandContext, CommandHandler, register
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.agent")


@register
class RunProbesHandler(CommandHandler):
    name = "run_probes"

    def __init__(self, ctx: CommandContext) -> None:
        super().__init__(ctx)
        self._busy = False

    @classmethod
    def applies(cls, ctx: CommandContext) -> bool:
        return bool(ctx.probes.available())

    async def run(self, command: pb.Command) -> pb.CommandResult:
        if self._busy:
            return pb.CommandResult(ok=False, error="a probe run is already in progress")
        self._busy = True
        request = command.run_probes
        names, gpus, suite = list(request.probes), list(request.gpus), request.suite or "short"
        started = time.perf_counter()
        try:
            log.info(
                "running probes %s (%s suite) on %s (command %s)",
                ", ".join(names) or "default suite",
                suite,
                f"GPUs {', '.join(map(str, gpus))}" if gpus else "every GPU",
                command.id,
            )
            outcomes = await asyncio.to_thread(
                self.ctx.probes.run, names, force=request.force, gpus=gpus, suite=suite, command_id=command.id
            )
        finally:
            self._busy = False
        for outcome in outcomes:  # whatever the runner did: the controller matches results by it
            outcome.command_id = command.id
        self.ctx.deliver_probes(outcomes)
        failed = [f"{o.probe}/{o.variant}: {o.error}" for o in outcomes if o.error]
        payload = pb.RunProbesResult(
            results=len(outcomes), failed=len(failed), duration_seconds=time.perf_counter() - started
        )
        return pb.CommandResult(ok=not failed, error="; ".join(failed), run_probes=payload)
