"""Load profiles: the shipped catalogue (controller/profiles/catalogue/*.yaml) and a site's own
(`--profiles-dir DIR`). A site profile with a shipped profile's name replaces it (and says so); two
profiles with one name in one directory are an error.

Every error is one line: `FILE: KEY.PATH: what is wrong (the allowed values)`.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from controller.profiles.schema import (
    APPLICATION_CLOCK_KEYS,
    APPLICATION_CLOCKS_GONE,
    SYSCTLS,
    VENDOR,
    BiosAttribute,
    Profile,
    Sysctl,
)

SHIPPED_DIR = Path(__file__).resolve().parent / "catalogue"
Origin = Literal["shipped", "site"]


class ProfileError(Exception):
    """A profile (or a profiles directory) is not usable; the message names the file and key."""


@dataclass
class Entry:
    profile: Profile
    origin: Origin
    path: Path
    overrides: bool = False  # a site profile that replaces the shipped one of the same name


_AT = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD = re.compile(r"^Object (?P<kind>contains unknown|missing required) field `(?P<name>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`$")


def _join(*parts: str) -> str:
    return ".".join(p.strip(".") for p in parts if p.strip("."))


def _struct_at(root: type, path: str) -> type | None:
    """The Struct type at a msgspec error path (`.gpu.power_limit`, `.bmc.firmware[0]`)."""
    current: Any = root
    for segment in re.findall(r"\.([A-Za-z_][\w]*)|\[([^\]]*)\]", path):
        name, index = segment
        if name:
            fields = {f.name: f.type for f in msgspec.structs.fields(current)}
            if name not in fields:
                return None
            current = fields[name]
        elif index and not index.isdigit() and index != "...":
            return None
        current = _unwrap(current, container=not name)
        if current is None:
            return None
    return current if isinstance(current, type) and issubclass(current, msgspec.Struct) else None


def _unwrap(tp: Any, *, container: bool) -> Any:
    """The Struct inside `X | None`, and (for an index) inside list[X] or dict[str, X]."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        structs = [a for a in typing.get_args(tp) if isinstance(a, type) and issubclass(a, msgspec.Struct)]
        return structs[0] if structs else tp
    if container and origin in (list, dict):
        return _unwrap(typing.get_args(tp)[-1], container=False)
    return tp


def _explain(error: str, root: type, base: str = "") -> str:
    """A msgspec or schema error as `key.path: what is wrong`."""
    match = _AT.match(error.strip())
    assert match is not None  # the pattern matches any text
    text, at = match["text"], match["path"] or ""
    path = _join(base, re.sub(r"\[(\d+)\]", r".\1", at).replace("[...]", ""))
    if text.startswith("@"):  # a sub-key named by the schema: "@enabled.target: ..."
        sub, _, text = text[1:].partition(": ")
        path = _join(path, re.sub(r"\[(\d+)\]", r".\1", sub))
    field = _FIELD.match(text)
    if field and field["kind"] == "contains unknown":
        name = field["name"]
        if name in APPLICATION_CLOCK_KEYS:
            return f"{_join(path, name)}: {APPLICATION_CLOCKS_GONE}"
        struct = _struct_at(root, at)
        allowed = ", ".join(f.name for f in msgspec.structs.fields(struct)) if struct else ""
        return f"{path or '(top level)'}: unknown key {name!r}" + (f"; allowed: {allowed}" if allowed else "")
    if field:
        return f"{path or '(top level)'}: missing key {field['name']!r}"
    expected = _EXPECTED.match(text)
    if expected:
        want = expected["want"].replace("object", "a mapping").replace("array", "a list")
        return f"{path or '(top level)'}: expected {want}, got {expected['got']}"
    return f"{path or '(top level)'}: {text}"


def _convert(data: Any, tp: type, where: str, base: str = "") -> Any:
    try:
        return msgspec.convert(data, tp)
    except msgspec.ValidationError as exc:
        raise ProfileError(f"{where}: {_explain(str(exc), tp, base)}") from exc


def _check_keyed(data: dict[str, Any], where: str) -> None:
    """Sysctls and BIOS attributes are keyed by name: check each here, so the error names the key."""
    os_part = data.get("os")
    if isinstance(os_part, dict) and isinstance(os_part.get("sysctls"), dict):
        for key, value in os_part["sysctls"].items():
            if key not in SYSCTLS:
                raise ProfileError(
                    f"{where}: os.sysctls: {key!r} is not in the allowlist ({', '.join(SYSCTLS)})"
                )
            sysctl = _convert(value, Sysctl, where, f"os.sysctls.{key}")
            low, high = SYSCTLS[key]
            if not low <= sysctl.target <= high:
                raise ProfileError(
                    f"{where}: os.sysctls.{key}.target: {sysctl.target} is outside {low}..{high}"
                )
    bmc_part = data.get("bmc")
    if isinstance(bmc_part, dict) and isinstance(bmc_part.get("bios"), dict):
        for key, value in bmc_part["bios"].items():
            if not isinstance(key, str) or not re.match(r"^[A-Za-z][\w.-]*$", key):
                raise ProfileError(f"{where}: bmc.bios: {key!r} is not a BIOS attribute name")
            attribute = _convert(value, BiosAttribute, where, f"bmc.bios.{key}")
            for vendor in attribute.vendors:
                if not VENDOR.match(vendor):
                    raise ProfileError(
                        f"{where}: bmc.bios.{key}.vendors: {vendor!r} must be a lower-case vendor name"
                    )


def parse_profile(text: str, where: str) -> Profile:
    """One profile document; `where` names it in errors (a file path)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile is a mapping (name, description, gpu, os, bmc)")
    _check_keyed(data, where)
    profile: Profile = _convert(data, Profile, where)
    return profile


def load_profile(path: Path) -> Profile:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_profile(text, str(path))


def load_dir(directory: Path, origin: Origin) -> dict[str, Entry]:
    """Every *.yaml / *.yml profile in `directory`, by name; a name twice is an error."""
    if not directory.is_dir():
        raise ProfileError(f"{directory}: not a directory of profiles")
    found: dict[str, Entry] = {}
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        profile = load_profile(path)
        if profile.name in found:
            raise ProfileError(
                f"{path}: profile {profile.name!r} is already defined in {found[profile.name].path}"
            )
        found[profile.name] = Entry(profile, origin, path)
    return found


def load_catalogue(site_dir: Path | str | None = None, shipped_dir: Path = SHIPPED_DIR) -> dict[str, Entry]:
    """The shipped profiles, then the site's (which win on a shared name), sorted by name."""
    entries = load_dir(shipped_dir, "shipped")
    if site_dir is not None:
        for name, entry in load_dir(Path(site_dir), "site").items():
            entry.overrides = name in entries
            entries[name] = entry
    return dict(sorted(entries.items()))
