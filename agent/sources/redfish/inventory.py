"""BIOS attributes and pending settings, firmware inventory, BMC firmware and log entries from
Redfish JSON. Values become text so the wire carries one map type whatever the attribute's type."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agent.sources.bmc import BmcFirmware, BmcLogEntry
from agent.sources.redfish.values import member_id, obj, text

MAX_MESSAGE = 500  # characters of a log message kept; SEL text is short, OEM dumps are not


def attribute_text(value: Any) -> str:
    """A BIOS attribute value as text: strings as they are, numbers written out, booleans JSON-style."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def bios_attributes(bios: dict[str, Any]) -> dict[str, str]:
    attributes = obj(bios, "Attributes")
    return {str(name): attribute_text(value) for name, value in attributes.items()}


def bios_pending(current: dict[str, str], settings: dict[str, Any]) -> dict[str, str]:
    """Attributes of the Bios/Settings resource whose value differs from the current one."""
    pending = bios_attributes(settings)
    return {name: value for name, value in pending.items() if current.get(name) != value}


def settings_object_path(bios: dict[str, Any]) -> str:
    """The pending-settings resource the current BIOS resource points at ("" when it has none)."""
    return text(obj(bios, "@Redfish.Settings", "SettingsObject"), "@odata.id")


def apply_times(bios: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The settings apply times the service supports, from either place the schema allows."""
    found: list[str] = []
    for values in (
        obj(bios, "@Redfish.Settings").get("SupportedApplyTimes"),
        obj(settings, "@Redfish.SettingsApplyTime").get("ApplyTime@Redfish.AllowableValues"),
    ):
        if isinstance(values, list):
            found.extend(v for v in values if isinstance(v, str) and v not in found)
    return found


def firmware_item(item: dict[str, Any]) -> BmcFirmware:
    return BmcFirmware(
        id=member_id(item),
        name=text(item, "Name"),
        version=text(item, "Version"),
        updateable=item.get("Updateable") is True,
    )


def log_entry(entry: dict[str, Any], log_path: str) -> BmcLogEntry:
    message = text(entry, "Message") or text(entry, "EntryCode") or text(entry, "Name")
    return BmcLogEntry(
        id=member_id(entry),
        severity=text(entry, "Severity").lower(),
        message=message[:MAX_MESSAGE],
        created=text(entry, "Created"),
        message_id=text(entry, "MessageId"),
        log=log_path,
    )


def created_seconds(created: str) -> float:
    """An entry's Created time as unix seconds; -inf when missing or unreadable (sorts last)."""
    try:
        moment = datetime.fromisoformat(created)
    except ValueError:
        return float("-inf")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a BMC without an offset is taken to mean UTC
    return moment.timestamp()


def newest(entries: list[BmcLogEntry], limit: int) -> list[BmcLogEntry]:
    """The `limit` most recent entries, newest first, across logs whatever their time offsets."""
    return sorted(entries, key=lambda e: created_seconds(e.created), reverse=True)[:limit]
