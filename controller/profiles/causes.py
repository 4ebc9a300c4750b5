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
    """A profile that fixes a cause, and which of its settings an apply sets: `settings` (empty: every
    setting of the profile) or, for a cause whose findings name what drifted, `by_evidence`: the
    settings for each evidence metric, so a node is only changed where its findings say it differs."""

    profile: str
    settings: list[str] = msgspec.field(default_factory=list)
    by_evidence: dict[str, list[str]] = msgspec.field(default_factory=dict)

    def paths(self) -> list[str]:
        """Every setting the fix may set (those of `settings` and of `by_evidence`)."""
        return [*self.settings, *(s for named in self.by_evidence.values() for s in named)]

    def for_evidence(self, metrics: set[str]) -> list[str]:
        """The settings for evidence `metrics` (by_evidence), in the order the cause map lists them."""
        out: list[str] = []
        for metric, named in self.by_evidence.items():
            if metric in metrics:
                out += [s for s in named if s not in out]
        return out


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
            if fix.settings and fix.by_evidence:
                found.append(f"{cause}: profile {fix.profile} has both settings and by_evidence")
            found += [
                f"{cause}: by_evidence {m!r} names no setting" for m, n in fix.by_evidence.items() if not n
            ]
            paths = {s.path for s in catalogue[fix.profile].profile.settings()}
            found += [
                f"{cause}: profile {fix.profile} has no setting {s!r}" for s in fix.paths() if s not in paths
            ]
    return found


def fixed_by(causes: dict[str, CauseEntry]) -> dict[str, list[str]]:
    """profile name -> the causes it fixes."""
    out: dict[str, list[str]] = {}
    for cause, entry in causes.items():
        for fix in entry.fixes:
            out.setdefault(fix.profile, []).append(cause)
    return out
