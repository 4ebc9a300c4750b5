"""ApplyProfile: apply a tuning profile's settings on this node, all or nothing, and keep them only
when a re-probe shows the node back within fleet normal (or measurably better).

The controller sends the targets and, for the probes the settings move, a bar per GPU (its peers'
edge of normal and the GPU's value before). After the read-back, the handler re-runs those probes
(short suite, the affected GPUs) and checks every bar; one missed bar rolls the whole apply back
(agent/tuning/apply.py). The re-probe's results ride to the controller like any probe run's.
Refused unless the agent's own config says tuning.enabled: true (a dry run is always allowed: it
writes nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from agent.commands.registry import CommandContext, CommandHandler, register
from agent.probes.base import ProbeOutcome
from agent.tuning.apply import NOTHING_TO_DO, PLANNED, ApplyResult
from agent.tuning.base import Change
from agent.tuning.journal import APPLIED
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.agent.tuning")
COMMITTED = "committed"  # the journal's `applied`, as the controller names it
OK_STATES = (COMMITTED, PLANNED, NOTHING_TO_DO)


@register
class ApplyProfileHandler(CommandHandler):
    name = "apply_profile"
    mutating = True

    @classmethod
    def applies(cls, ctx: CommandContext) -> bool:
        """Advertised only where tuning is on; a command that comes anyway is refused, saying why."""
        return ctx.tuner is not None and ctx.tuner.enabled

    async def run(self, command: pb.Command) -> pb.CommandResult:
        request = command.apply_profile
        tuner = self.ctx.tuner
        if tuner is None:
            return _answer(ApplyResult("refused", problems=["this agent has no tuning configured"]))
        try:
            targets = json.loads(request.targets_json or "{}")
            if not isinstance(targets, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            return _answer(ApplyResult("refused", problems=[f"targets_json is not valid: {exc}"]))
        gpus = list(request.gpus)
        outcomes: list[ProbeOutcome] = []
        checks: list[pb.ProbeCheck] = []

        def reprobe(changes: list[Change]) -> list[str]:
            """Runs in the apply's thread, after the read-back: re-probe and check every bar."""
            if not request.verify:
                return []
            names = list(dict.fromkeys(bar.probe for bar in request.verify))
            probed = sorted({bar.gpu for bar in request.verify if bar.HasField("gpu")})
            try:
                found = self.ctx.probes.run(names, gpus=probed or gpus, suite="short", command_id=command.id)
            except Exception as exc:  # noqa: BLE001 - a probe run that cannot start fails the check
                return [f"re-probe failed: {exc}"]
            outcomes.extend(found)
            checks.extend(check_bars(request.verify, found))
            return [_missed(c) for c in checks if not c.passed]

        log.info(
            "applying profile %s%s (command %s)%s",
            request.profile,
            " as a dry run" if request.dry_run else "",
            command.id,
            f": {request.reason}" if request.reason else "",
        )
        result = await asyncio.to_thread(
            tuner.apply, request.profile, targets, gpus=gpus, dry_run=request.dry_run, check=reprobe
        )
        if outcomes:
            for outcome in outcomes:
                outcome.command_id = command.id
            self.ctx.deliver_probes(outcomes)
        log.info("profile %s: %s%s", request.profile, _state(result), _why(result))
        return _answer(result, checks)


def check_bars(bars: Sequence[pb.ProbeBar], outcomes: Sequence[ProbeOutcome]) -> list[pb.ProbeCheck]:
    """Each bar against the re-probe's result for its probe, variant and GPU: passed when the value
    is within the peers' normal, or better than before by `better_by`; a missing or failed result
    never passes."""
    found = {(o.probe, o.variant, o.gpu): o for o in outcomes}
    checks = []
    for bar in bars:
        gpu = bar.gpu if bar.HasField("gpu") else None
        check = pb.ProbeCheck(probe=bar.probe, variant=bar.variant, normal=bar.normal, before=bar.before)
        if gpu is not None:
            check.gpu = gpu
        outcome = found.get((bar.probe, bar.variant, gpu))
        if outcome is None:
            check.error = "not measured by the re-probe"
        elif outcome.error:
            check.error = outcome.error
        else:
            check.value = outcome.value
            sign = 1.0 if bar.higher_is_better else -1.0
            within = sign * (outcome.value - bar.normal) >= 0
            gain = sign * (outcome.value - bar.before) / bar.before if bar.before > 0 else 0.0
            check.passed = within or (bar.better_by > 0 and gain >= bar.better_by)
        checks.append(check)
    return checks


def _missed(check: pb.ProbeCheck) -> str:
    where = f"{check.probe}/{check.variant}" + (f" on GPU {check.gpu}" if check.HasField("gpu") else "")
    if check.error:
        return f"{where}: {check.error}"
    return (
        f"{where}: {check.value:.4g} is outside fleet normal ({check.normal:.4g}), before {check.before:.4g}"
    )


def _state(result: ApplyResult) -> str:
    return COMMITTED if result.state == APPLIED else result.state


def _why(result: ApplyResult) -> str:
    return f" ({'; '.join(result.problems)})" if result.problems else ""


def _answer(result: ApplyResult, checks: Sequence[pb.ProbeCheck] = ()) -> pb.CommandResult:
    state = _state(result)
    payload = pb.ApplyProfileResult(
        state=state,
        changes=[
            pb.SettingChange(
                setting=c.setting, current=c.current, target=c.target, pending_reboot=c.pending_reboot
            )
            for c in result.changes
        ],
        problems=result.problems + result.partial,
        checks=checks,
        op_id=result.op_id,
        left=result.left,
    )
    error = "" if state in OK_STATES else f"{state}: {'; '.join(result.problems) or 'see the result'}"
    return pb.CommandResult(ok=state in OK_STATES, error=error, apply_profile=payload)
