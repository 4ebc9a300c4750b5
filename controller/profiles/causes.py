"""The cause map (causes.yaml): for every finding cause, the profiles and settings that fix it, or
the action to take when no setting does (drain, investigate, ...). Pure data and its checks."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
import yaml

from controller.profiles.catalogue import Entry, ProfileError
from protos.names import CAUSES

CAUSES_FILE = Path(__file__).resolve().parent / "causes.yaml"
Action = Literal["tune", "set_fleet_value", "recommend_firmware", "drain", "investigate"]
ACTIONS: tuple[str, ...] = ("tune", "set_fleet_value", "recommend_firmware", "drain", "investigate")


class Fix(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    profile: str
    settings: list[str] = msgspec.field(default_factory=list)  # empty: every setting of the profile


class CauseEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    action: Action
    reason: str
    fixes: list[Fix] = msgspec.field(default_factory=list)


def load_cause_map(path: Path = CAUSES_FILE) -> dict[str, CauseEntry]:
    try:
        data = yaml.safe_load(path.read_text())
        return msgspec.convert(data, dict[str, CauseEntry])
    except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def problems(causes: dict[str, CauseEntry], catalogue: dict[str, Entry]) -> list[str]:
    """What is wrong with the cause map against the contract's causes and the profiles; [] if nothing."""
    found = [f"cause {c!r} has no entry" for c in CAUSES if c not in causes]
    found += [f"{c!r} is not a cause ({', '.join(CAUSES)})" for c in causes if c not in CAUSES]
    for cause, entry in causes.items():
        if entry.action in ("tune", "recommend_firmware") and not entry.fixes:
            found.append(f"{cause}: action {entry.action} names no profile")
        if entry.action in ("drain", "investigate", "set_fleet_value") and entry.fixes:
            found.append(f"{cause}: action {entry.action} takes no profiles")
        for fix in entry.fixes:
            if fix.profile not in catalogue:
                found.append(f"{cause}: no profile {fix.profile!r}")
                continue
            paths = {s.path for s in catalogue[fix.profile].profile.settings()}
            found += [
                f"{cause}: profile {fix.profile} has no setting {s!r}" for s in fix.settings if s not in paths
            ]
    return found


def fixed_by(causes: dict[str, CauseEntry]) -> dict[str, list[str]]:
    """profile name -> the causes it fixes."""
    out: dict[str, list[str]] = {}
    for cause, entry in causes.items():
        for fix in entry.fixes:
            out.setdefault(fix.profile, []).append(cause)
    return out
