"""Reading resources and collections for one poll: $expand where the service really supports it,
members fetched one by one where it does not, and one bad member recorded rather than fatal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agent.sources.redfish.session import BmcError, Resource, resource_path
from agent.sources.redfish.values import obj

# These end the poll: the next request would fail the same way (after another timeout, maybe).
FATAL_KINDS = ("unreachable", "timeout", "tls", "auth")


class Getter(Protocol):
    def get(self, path: str, *, expand: bool = False) -> Resource: ...


def claims_expand(root: dict[str, Any]) -> bool:
    """Whether the service root says $expand=.($levels=1) works."""
    expand = obj(root, "ProtocolFeaturesSupported", "ExpandQuery")
    return expand.get("Levels") is True or expand.get("ExpandAll") is True


class Reader:
    """GETs for one poll. `errors` collects member failures that did not stop the section."""

    def __init__(self, getter: Getter, *, expand: bool, on_expand_broken: Callable[[], None]) -> None:
        self.getter = getter
        self.expand = expand
        self._on_expand_broken = on_expand_broken
        self.errors: list[str] = []
        self._cache: dict[str, dict[str, Any]] = {}

    def get(self, path: str) -> dict[str, Any]:
        """One resource (cached for the poll: Sensors, say, serve thermal and the GPU boards)."""
        path = resource_path(path)
        if path not in self._cache:
            self._cache[path] = self.getter.get(path).body
        return self._cache[path]

    def optional(self, path: str) -> dict[str, Any]:
        """A linked resource whose absence only loses its readings: {} and a recorded error."""
        if not path:
            return {}
        try:
            return self.get(path)
        except BmcError as exc:
            if exc.kind in FATAL_KINDS:
                raise
            self.errors.append(exc.message)
            return {}

    def members(self, collection: str, *, fetch_limit: int | None = None) -> list[dict[str, Any]]:
        """The member resources of a collection. Members given as bare links are fetched one by
        one; with `fetch_limit`, only the last `fetch_limit` of those (log entries: thousands)."""
        body = self._collection(resource_path(collection))
        listed = body.get("Members")
        items = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
        if fetch_limit is not None and items and _is_link_only(items[0]):
            items = items[-fetch_limit:] if fetch_limit else []
        out = []
        for item in items:
            if _is_link_only(item):
                member = self.optional(str(item["@odata.id"]))
                if member:
                    out.append(member)
            else:
                out.append(item)
        return out

    def _collection(self, path: str) -> dict[str, Any]:
        if path in self._cache:
            return self._cache[path]
        if self.expand:
            try:
                body = self.getter.get(path, expand=True).body
                self._cache[path] = body
                return body
            except BmcError as exc:
                if exc.kind in FATAL_KINDS or exc.status not in (400, 404, 405, 500, 501):
                    raise
                body = self.get(path)  # fails too: the collection is broken, not $expand
                # The service claims $expand but refuses it (sushy-static does): stop asking.
                self.expand = False
                self._on_expand_broken()
                return body
        return self.get(path)


def _is_link_only(member: dict[str, Any]) -> bool:
    return "@odata.id" in member and all(key.startswith("@odata") for key in member)
