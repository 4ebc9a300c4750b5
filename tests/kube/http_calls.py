"""Plain HTTP against the fake kube-apiserver for the tests: `call` answers (status, JSON body) for
errors too, and `web` adds a ReplicaSet's pods; the patch media types as named constants."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import pod

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def call(
    server: FakeApiServer, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def web(server: FakeApiServer, *names: str, node_name: str = "n1") -> None:
    for name in names:
        owned = ("ReplicaSet", "web-1")
        server.add(pod(name, node_name, namespace="app", owned_by=owned, labels={"app": "web"}))
