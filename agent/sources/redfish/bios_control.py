"""BiosControl over Redfish: a real BMC's BIOS attributes, its attribute registry and its pending
settings, written through read_bios_settings / patch_bios_settings (ETag If-Match, apply times).

The registry is the one the Bios resource names in AttributeRegistry, found in the Registries
collection and read from the registry file's local Location Uri (never a PublicationUri: nothing
outside the BMC is fetched). A service that publishes none (DMTF's mockups, many older BMCs) gets
no validation beyond "the BMC has this attribute": read-only flags and allowable values are then
unknown, and a refused value shows only as the BMC's own error on PATCH.

@Redfish.SettingsApplyTime {"ApplyTime": "OnReset"} goes with the PATCH when the service lists
OnReset among its SupportedApplyTimes and is left out otherwise; a service that lists it and then
refuses the annotation with HTTP 400 (some vendors do) is asked once more without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from agent.sources.redfish.session import BmcEndpoint, BmcError, RedfishSession, resource_path
from agent.sources.redfish.settings import AttributeValue, patch_bios_settings, read_bios_settings
from agent.sources.redfish.values import link, links, obj, text
from agent.tuning.base import TuningError
from agent.tuning.bios import BOOLEAN, INTEGER, BiosAttribute, BiosState

log = logging.getLogger("gpufleet.agent.tuning")
APPLY_TIME = "OnReset"
# Words in a vendor or manufacturer name -> the vendor key profiles use.
VENDORS = {"dell": "dell", "hpe": "hpe", "hewlett": "hpe", "lenovo": "lenovo", "supermicro": "supermicro"}


def vendor_key(name: str) -> str:
    """ "Dell Inc." -> "dell", "HPE" -> "hpe"; "" for a vendor profiles do not name."""
    lowered = name.lower()
    return next((key for word, key in VENDORS.items() if word in lowered), "")


def tuning_error(endpoint: BmcEndpoint, exc: BmcError) -> TuningError:
    """One line for a BMC failure met reading or writing the BIOS settings."""
    where = f"BMC {endpoint.base}"
    if exc.status == 412:
        return TuningError(
            f"{where}: the BIOS settings changed since they were read (someone else wrote them)"
        )
    if exc.kind == "auth":
        return TuningError(f"{where}: login refused: {exc.message}")
    if exc.kind in ("unreachable", "timeout", "tls"):
        return TuningError(f"{where} unreachable: {exc.message}")
    return TuningError(f"{where}: {exc.message}")


def parse_registry(doc: Mapping[str, Any]) -> dict[str, BiosAttribute]:
    """An AttributeRegistry's RegistryEntries.Attributes by AttributeName."""
    entries = obj(doc, "RegistryEntries").get("Attributes")
    found: dict[str, BiosAttribute] = {}
    for entry in entries if isinstance(entries, list) else []:
        name = text(entry, "AttributeName")
        if not name:
            continue
        values = entry.get("Value")
        allowable = tuple(text(v, "ValueName") for v in values if text(v, "ValueName")) if values else ()
        lower, upper = entry.get("LowerBound"), entry.get("UpperBound")
        found[name] = BiosAttribute(
            name=name,
            type=text(entry, "Type"),
            read_only=entry.get("ReadOnly") is True or entry.get("Immutable") is True,
            allowable=allowable,
            lower=lower if isinstance(lower, int) and not isinstance(lower, bool) else None,
            upper=upper if isinstance(upper, int) and not isinstance(upper, bool) else None,
        )
    return found


def find_registry(session: RedfishSession, name: str) -> dict[str, BiosAttribute] | None:
    """The attribute registry `name` as the service publishes it; None when it publishes none.

    Registry files are matched by the last segment of their path: the exact name first, then any
    that mention "Bios" or "Attribute" (services name the file and the registry differently: the
    file BiosAttributeRegistry.v1_0_0 holds BiosAttributeRegistryP89.v1_0_0). A file is taken
    when it or the registry it points at carries `name`."""
    collection = link(session.root, "Registries")
    if not name or not collection:
        return None
    members = links(session.get(collection).body, "Members")

    def rank(path: str) -> int:
        last = path.rstrip("/").rsplit("/", 1)[-1]
        return 0 if last == name else 1 if "bios" in last.lower() or "attribute" in last.lower() else 2

    for path in sorted((p for p in members if rank(p) < 2), key=rank):
        try:
            file = session.get(path).body
            for location in file.get("Location") or []:
                uri = text(location, "Uri")
                if not uri:
                    continue
                doc = session.get(resource_path(uri)).body
                if name in (text(doc, "Id"), text(file, "Id"), text(file, "Registry")):
                    return parse_registry(doc)
        except BmcError as exc:
            if exc.kind not in ("http", "malformed"):
                raise
            log.info("BIOS registry %s: skipping %s: %s", name, path, exc.message)
    return None


class RedfishBiosControl:
    """The host's BIOS settings on one BMC; a session per call. The registry, the vendor and the
    attributes' JSON types are read once, with the first read, and kept."""

    def __init__(self, endpoint: BmcEndpoint) -> None:
        self.endpoint = endpoint
        self._described = False
        self._registry: dict[str, BiosAttribute] | None = None
        self._vendor = ""
        self._types: dict[str, type] = {}  # each attribute's JSON type, as the Bios resource gives it

    @contextlib.contextmanager
    def _session(self) -> Iterator[RedfishSession]:
        try:
            with RedfishSession(self.endpoint) as session:
                yield session
        except BmcError as exc:
            raise tuning_error(self.endpoint, exc) from None

    def _describe(self, session: RedfishSession, bios_path: str, system_path: str) -> None:
        if self._described:
            return
        bios = session.get(bios_path).body
        self._types = {str(k): type(v) for k, v in obj(bios, "Attributes").items()}
        self._registry = find_registry(session, text(bios, "AttributeRegistry"))
        vendor = text(session.root, "Vendor")
        if not vendor_key(vendor) and system_path:
            vendor = text(session.get(system_path).body, "Manufacturer")
        self._vendor = vendor_key(vendor)
        self._described = True

    def read(self) -> BiosState:
        with self._session() as session:
            settings = read_bios_settings(session)
            self._describe(session, settings.bios, settings.system)
        return BiosState(dict(settings.current), dict(settings.pending))

    def registry(self) -> dict[str, BiosAttribute] | None:
        if not self._described:
            self.read()
        return self._registry

    def vendor(self) -> str:
        if not self._described:
            self.read()
        return self._vendor

    def set_pending(self, attributes: Mapping[str, str]) -> None:
        with self._session() as session:
            before = read_bios_settings(session)
            self._describe(session, before.bios, before.system)
            body = {name: self._typed(name, value) for name, value in attributes.items()}
            apply_time = APPLY_TIME if APPLY_TIME in before.apply_times else None
            try:
                patch_bios_settings(session, body, apply_time=apply_time)
            except BmcError as exc:
                if apply_time is None or exc.status != 400:
                    raise
                log.warning(
                    "BMC %s refused @Redfish.SettingsApplyTime (%s); writing the BIOS settings without it",
                    self.endpoint.base,
                    exc.message,
                )
                patch_bios_settings(session, body, apply_time=None)

    def _typed(self, name: str, value: str) -> AttributeValue:
        """The text value in the attribute's JSON type: the registry's, else the current value's."""
        spec = (self._registry or {}).get(name)
        kind = spec.type if spec is not None else ""
        if kind == INTEGER or (not kind and self._types.get(name) is int):
            try:
                return int(value)
            except ValueError:
                return value  # let the BMC refuse it in its own words
        if kind == BOOLEAN or (not kind and self._types.get(name) is bool):
            return {"true": True, "false": False}.get(value, value)
        return value
