"""`gpufleet profiles` and `gpufleet profile show NAME`: the tuning profiles, read from the shipped
catalogue and `--profiles-dir` on this machine (no controller needed).

JSON/YAML: {"profiles": [{name, description, levels, settings, risk, source, overrides, path,
fixes}]} and, for one profile, {name, description, levels, risk, source, overrides, path, fixes,
settings: [{setting, level, target, risk, action, reason, source, vendors?}]}.
Exit status: 0, or 2 for an unknown profile or one that does not validate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from controller.cli.layout import Col, make_table, show
from controller.cli.output import DOCUMENT_FORMATS, OUTPUT_FORMATS, print_document
from controller.profiles import Entry, ProfileError, load_catalogue, load_cause_map
from controller.profiles.causes import fixed_by

RISK_STYLE = {"needs_reboot": "yellow", "online": "green"}


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profiles-dir",
        metavar="DIR",
        help="a site's own profiles (*.yaml), beside the shipped ones; same name: the site's wins",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (default), wide (more columns), json or yaml (the same document)",
    )


def _source(entry: Entry) -> str:
    return "site (overrides shipped)" if entry.overrides else entry.origin


def summary(entry: Entry, fixes: list[str]) -> dict[str, Any]:
    profile = entry.profile
    return {
        "name": profile.name,
        "description": profile.description,
        "levels": profile.levels(),
        "settings": len(profile.settings()),
        "risk": profile.risk(),
        "source": entry.origin,
        "overrides": entry.overrides,
        "path": str(entry.path),
        "fixes": fixes,
    }


def profiles_table(entries: dict[str, Entry], fixes: dict[str, list[str]], *, wide: bool = False) -> Table:
    columns = (
        Col("NAME", key=True),
        Col("LEVELS", drop=3),
        Col("SETTINGS", justify="right", drop=4),
        Col("RISK"),
        Col("SOURCE", drop=2),
        Col("FIXES", drop=5, wrap=True, wide=True),
        Col("DESCRIPTION", drop=1, wrap=True),
    )
    rows = []
    for entry in entries.values():
        p = entry.profile
        rows.append(
            (
                p.name,
                ",".join(p.levels()),
                str(len(p.settings())),
                Text(p.risk(), style=RISK_STYLE[p.risk()]),
                _source(entry),
                ", ".join(fixes.get(p.name, [])) or "-",
                p.description,
            )
        )
    return make_table("Profiles", columns, rows, wide=wide)


def settings_table(entry: Entry, *, wide: bool = False) -> Table:
    columns = (
        Col("SETTING", key=True),
        Col("TARGET"),
        Col("RISK", drop=3),
        Col("ACTION", drop=4, wide=True),
        Col("VENDORS", drop=5, wrap=True, wide=True),
        Col("REASON", drop=2, wrap=True),
        Col("SOURCE", drop=1, wrap=True),
    )
    rows = []
    for s in entry.profile.settings():
        vendors = ", ".join(f"{v}: {a['name']}={a['target']}" for v, a in (s.vendors or {}).items())
        rows.append(
            (
                s.path,
                s.target_text(),
                Text(s.risk, style=RISK_STYLE[s.risk]),
                "recommend" if s.recommend_only else "apply",
                vendors or "-",
                s.reason,
                s.source,
            )
        )
    p = entry.profile
    return make_table(f"Profile {p.name} ({_source(entry)}): {p.description}", columns, rows, wide=wide)


def _load(profiles_dir: str | None) -> tuple[dict[str, Entry], dict[str, list[str]]]:
    entries = load_catalogue(Path(profiles_dir) if profiles_dir else None)
    return entries, fixed_by(load_cause_map())


def profiles(profiles_dir: str | None, output: str) -> int:
    try:
        entries, fixes = _load(profiles_dir)
    except ProfileError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    if output in DOCUMENT_FORMATS:
        doc = [summary(e, fixes.get(name, [])) for name, e in entries.items()]
        print_document({"profiles": doc}, output)
    else:
        show(profiles_table(entries, fixes, wide=output == "wide"))
    return 0


def profile_show(name: str, profiles_dir: str | None, output: str) -> int:
    try:
        entries, fixes = _load(profiles_dir)
    except ProfileError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    entry = entries.get(name)
    if entry is None:
        print(f"gpufleet: no profile {name!r}; profiles: {', '.join(entries)}", file=sys.stderr)
        return 2
    if output in DOCUMENT_FORMATS:
        doc = summary(entry, fixes.get(name, []))
        doc["settings"] = [s.to_dict() for s in entry.profile.settings()]
        print_document(doc, output)
    else:
        show(settings_table(entry, wide=output == "wide"))
    return 0
