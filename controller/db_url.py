"""Store URLs: which backend a `db` names, and a URL fit for messages (no password)."""

from __future__ import annotations

import urllib.parse


def is_postgres_url(text: str) -> bool:
    return text.lower().startswith(("postgresql://", "postgres://"))


def redact_url(text: str) -> str:
    """A URL with its password (and any query, which may carry one) replaced by ***, for messages."""
    parts = urllib.parse.urlsplit(text)
    if parts.password is None and not parts.query:
        return text
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"  # host:port as given
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))
