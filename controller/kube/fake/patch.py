"""The three PATCH bodies a kube-apiserver takes: JSON merge patch (RFC 7386), strategic merge
patch (lists merged by their merge key, e.g. `status.conditions` by `type`; any other list
replaced) and JSON patch (RFC 6902). Each returns a new document; `PatchError` means 422."""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
TYPES = (JSON_PATCH, MERGE, STRATEGIC)

MergeKeys = dict[tuple[str, ...], str]


class PatchError(ValueError):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any, merge_keys: MergeKeys) -> Any:
    return _smp(target, patch, (), merge_keys)


def _smp(target: Any, patch: Any, path: tuple[str, ...], keys: MergeKeys) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    patch = dict(patch)
    directive = patch.pop("$patch", None)
    if directive == "replace":
        return _smp({}, patch, path, keys)
    if directive == "delete":
        return None
    retain = patch.pop("$retainKeys", None)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            continue  # order hints only
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            out[name] = [v for v in out.get(name) or [] if v not in (value or [])]
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and ((*path, key)) in keys:
            out[key] = _merge_list(out.get(key), value, (*path, key), keys)
        else:
            out[key] = _smp(out.get(key), value, (*path, key), keys)
        if out.get(key, 0) is None:
            out.pop(key)
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(target: Any, patch: list[Any], path: tuple[str, ...], keys: MergeKeys) -> list[Any]:
    merge_key = keys[path]
    current = list(target) if isinstance(target, list) else []
    if not merge_key:  # a set of scalars
        return current + [v for v in patch if v not in current]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_smp({}, p, path, keys) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map: {item} does not contain declared merge key: {merge_key}")
        index = next(
            (i for i, c in enumerate(current) if isinstance(c, dict) and c.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del current[index]
        elif index is None:
            current.append(_smp({}, item, path, keys))
        else:
            current[index] = _smp(current[index], item, path, keys)
    return current


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation: {op!r}")
        name, path = op["op"], op["path"]
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"{name} operation does not apply: doc is missing value: {op!r}")
        if name == "add":
            doc = _put(doc, path, copy.deepcopy(op["value"]), insert=True)
        elif name == "replace":
            _get(doc, path)
            doc = _put(doc, path, copy.deepcopy(op["value"]), insert=False)
        elif name == "remove":
            doc = _remove(doc, path)
        elif name == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        elif name in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if name == "move":
                doc = _remove(doc, op.get("from", ""))
            doc = _put(doc, path, value, insert=True)
        else:
            raise PatchError(f"Unexpected kind: {name}")
    return doc


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _step(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchError(f"doc is missing path: {path!r}")
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise PatchError(f"doc is missing path: {path!r}")


def _get(doc: Any, path: str) -> Any:
    for token in _tokens(path):
        doc = _step(doc, token, path)
    return doc


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise PatchError("the whole document cannot be removed")
    node = doc
    for token in tokens[:-1]:
        node = _step(node, token, path)
    return node, tokens[-1]


def _put(doc: Any, path: str, value: Any, *, insert: bool) -> Any:
    if path == "":
        return value
    node, last = _parent(doc, path)
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list):
        if last == "-" and insert:
            node.append(value)
        elif last.isdigit() and int(last) <= len(node) - (0 if insert else 1):
            if insert:
                node.insert(int(last), value)
            else:
                node[int(last)] = value
        else:
            raise PatchError(f"doc is missing path: {path!r}")
    else:
        raise PatchError(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    node, last = _parent(doc, path)
    _step(node, last, path)
    if isinstance(node, dict):
        del node[last]
    else:
        del node[int(last)]
    return doc


def apply(content_type: str, target: dict[str, Any], body: Any, merge_keys: MergeKeys) -> Any:
    if content_type == JSON_PATCH:
        return json_patch(target, body)
    if not isinstance(body, dict):
        raise PatchError("a merge patch must be a JSON object")
    if content_type == MERGE:
        return merge_patch(target, body)
    return strategic_merge_patch(target, body, merge_keys)
