"""One remediation line per finding cause, read from the cause map (controller/profiles/causes.yaml).

The line says what an operator does about a finding, with the profile where a profile fixes it:
"retune: gpu-defaults (gpu.power_limit)", "update firmware to the fleet's (firmware-fleet-baseline;
never automatic)", "drain and repair: <why>", "investigate: <why>". The words come from the cause
map's action and reason, so a new cause needs an entry there and nothing here.
"""

from __future__ import annotations

from functools import cache

from controller.profiles.causes import CauseEntry, Fix, load_cause_map

SET_FLEET_VALUE = "set the fleet majority's value (pending until the next reboot)"


def _fix(fix: Fix) -> str:
    """ "gpu-defaults (gpu.power_limit)"; "os-accelerator-performance (those drifted of: a, b)" for a
    fix that sets only what the findings name; the bare profile for the whole of it."""
    if fix.by_evidence:
        return f"{fix.profile} (those drifted of: {', '.join(fix.paths())})"
    return f"{fix.profile} ({', '.join(fix.settings)})" if fix.settings else fix.profile


def _profiles(fixes: list[Fix]) -> str:
    """Every fix's text (_fix), joined with ", "."""
    return ", ".join(_fix(fix) for fix in fixes)


def _sentence(reason: str) -> str:
    """The cause map's reason as the tail of a line: trailing full stop off, first letter lower case
    unless it starts an acronym or a name ("NVLinks", "XID errors", "PCIe")."""
    text = " ".join(reason.split()).removesuffix(".")
    first = text.split(" ", 1)[0]
    if first[1:] == first[1:].lower():  # "The", "A": an ordinary word
        text = text[:1].lower() + text[1:]
    return text


def remediation_line(cause: str, entry: CauseEntry | None) -> str:
    """What to do about a finding of `cause`, on one line; `entry` is the cause map's entry for it
    (None: a cause the map does not know, which a person investigates)."""
    if entry is None:
        return f"investigate: no remediation is known for {cause or 'this finding'}"
    if entry.action == "tune":
        return f"retune: {_profiles(entry.fixes)}"
    if entry.action == "recommend_firmware":
        return f"update firmware to the fleet's ({_profiles(entry.fixes)}; never automatic)"
    if entry.action == "set_fleet_value":
        return SET_FLEET_VALUE
    if entry.action == "drain":
        return f"drain and repair: {_sentence(entry.reason)}"
    return f"investigate: {_sentence(entry.reason)}"


@cache
def _shipped() -> dict[str, CauseEntry]:
    return load_cause_map()


def remediation(cause: str) -> str:
    """The remediation line of `cause` (a Cause name such as "power_cap") from the shipped cause map."""
    return remediation_line(cause, _shipped().get(cause))
