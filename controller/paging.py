"""Pages of the operator API's long lists (ListNodes, ListFindings).

A page holds at most page_size entries (0, or more than the list's limit: the limit) in a fixed
order, and ends before its entries pass PAGE_BYTES; its next_page_token is opaque to clients: the
kind of list and the last entry's sort key, as base64 of JSON. A token this controller did not give
(or gave for the other list) is INVALID_ARGUMENT. Keys, not offsets: a node joining or leaving
between two pages shifts nothing, and every entry present throughout is listed exactly once.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from controller.errors import InvalidMessage
from controller.fleet.findings import StoredFinding

NODES = "nodes"
FINDINGS = "findings"
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}  # worst first; anything else after
FindingKey = tuple[int, str, int, str, str]
# A page's summaries stay under this: gRPC clients refuse answers over 4 MiB unless told otherwise
# (a maintenance comment has no length limit of its own).
PAGE_BYTES = 3 * 1024 * 1024
# Most a NodeSummary adds beyond its strings' bytes: tags, lengths, numbers, flags, last_seen.
SUMMARY_FIXED_BYTES = 128
ENTRY_FRAMING_BYTES = 8  # a repeated message's tag and length, at most, beyond its own bytes


def page_size(requested: int, limit: int) -> int:
    """The entries one answer holds: `requested`, or `limit` when that is 0 or larger."""
    return limit if requested == 0 or requested > limit else requested


def encode(kind: str, key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps([kind, *key]).encode()).decode()


def decode(kind: str, token: str, types: Sequence[type]) -> list[Any]:
    """The sort key a token of `kind` carries; InvalidMessage for anything else."""
    try:
        body = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (UnicodeError, binascii.Error, ValueError):
        body = None
    if (
        not isinstance(body, list)
        or len(body) != len(types) + 1
        or body[0] != kind
        or not all(type(v) is t for v, t in zip(body[1:], types, strict=True))
    ):
        raise InvalidMessage(f"page_token is not one this controller gave for its list of {kind}")
    return body[1:]


def finding_key(stored: StoredFinding) -> FindingKey:
    """Worst first, then by node, GPU (node-level first) and cause; the id makes the order total."""
    f = stored.finding
    return (SEVERITY_RANK.get(f.severity, 3), f.node, -1 if f.gpu is None else f.gpu, f.cause, stored.id)


def finding_after(token: str) -> FindingKey | None:
    if not token:
        return None
    rank, node, gpu, cause, fid = decode(FINDINGS, token, (int, str, int, str, str))
    return (rank, node, gpu, cause, fid)


def node_after(token: str) -> str | None:
    return str(decode(NODES, token, (str,))[0]) if token else None
