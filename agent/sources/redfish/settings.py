"""BIOS pending settings, for the tuning work: read them with their ETag and supported apply times,
and PATCH new values with If-Match so a concurrent change is refused (HTTP 412), not overwritten.

Nothing in the agent calls these on its own: writing to a BMC is a tuning action, planned and
approved elsewhere. They run on the caller's RedfishSession (`with RedfishSession(endpoint) as s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.sources.redfish import inventory as inv
from agent.sources.redfish.bmc import host_system
from agent.sources.redfish.session import BmcError, RedfishSession
from agent.sources.redfish.values import link

AttributeValue = str | int | float | bool


@dataclass(slots=True)
class BiosSettings:
    system: str  # @odata.id of the ComputerSystem
    bios: str  # @odata.id of its Bios resource (current values)
    settings: str  # @odata.id of the pending-settings resource ("" when the service has none)
    etag: str = ""  # the settings resource's ETag, sent back as If-Match ("" when none is given)
    apply_times: list[str] = field(default_factory=list)
    current: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)  # values that differ from `current`


def read_bios_settings(session: RedfishSession) -> BiosSettings:
    """The host system's current BIOS attributes, pending settings, their ETag and apply times."""
    systems_path = link(session.root, "Systems")
    if not systems_path:
        raise BmcError("the service has no Systems collection", kind="http")
    members = session.get(systems_path).body.get("Members")
    systems = [
        session.get(m["@odata.id"]).body for m in members or [] if isinstance(m, dict) and "@odata.id" in m
    ]
    system = host_system(systems)
    bios_path = link(system, "Bios")
    if not bios_path:
        raise BmcError(f"system {system.get('@odata.id', '?')} exposes no Bios resource", kind="http")
    bios = session.get(bios_path).body
    result = BiosSettings(str(system.get("@odata.id", "")), bios_path, inv.settings_object_path(bios))
    result.current = inv.bios_attributes(bios)
    settings = {}
    if result.settings:
        resource = session.get(result.settings)
        settings, result.etag = resource.body, resource.etag
        result.pending = inv.bios_pending(result.current, settings)
    result.apply_times = inv.apply_times(bios, settings)
    return result


def patch_bios_settings(
    session: RedfishSession, attributes: dict[str, AttributeValue], *, apply_time: str | None = None
) -> BiosSettings:
    """Write `attributes` to the pending settings (If-Match with the ETag just read) and return the
    settings as read back. BmcError: no settings resource, an apply time the service does not list,
    the ETag no longer matching (HTTP 412: someone changed them meanwhile) or any other refusal."""
    if not attributes:
        raise BmcError("no BIOS attributes to write", kind="config")
    target = read_bios_settings(session)
    if not target.settings:
        raise BmcError(f"{target.bios} has no pending-settings resource (@Redfish.Settings)", kind="http")
    unknown = sorted(set(attributes) - set(target.current))
    if unknown:
        raise BmcError(f"unknown BIOS attributes {', '.join(unknown)} (not in {target.bios})", kind="config")
    body: dict[str, object] = {"Attributes": dict(attributes)}
    if apply_time is not None:
        if target.apply_times and apply_time not in target.apply_times:
            supported = ", ".join(target.apply_times)
            raise BmcError(
                f"apply time {apply_time!r} is not supported (the service lists {supported})", kind="config"
            )
        body["@Redfish.SettingsApplyTime"] = {"ApplyTime": apply_time}
    session.patch(target.settings, body, etag=target.etag)
    return read_bios_settings(session)
