"""The import graph between the agent's and the controller's parts, read from the source (every import,
lazy ones included), and its cycles.

A part is a subpackage or top-level module: `controller.fleet`, `controller.app`, `agent.probes`; the
agent's sources are parts one level deeper (`agent.sources.nvml.source`, `agent.sources.sim`), since each is
a layer of its own. Run `python -m tests.layering` to print the graph's edges, with the file and line
of one import per edge, and its cycles.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "controller")
DEEPER = ("agent.sources",)  # parts one level below these


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (or name within it)
    where: str  # path:line


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: str) -> Iterator[Import]:
    for path in sorted((ROOT / package).rglob("*.py")):
        name = module_name(path)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(name, alias.name, where)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.module, node.level)
                yield Import(name, base, where)
                for alias in node.names:  # `from agent.sources.nvml import source as nvml` names a module
                    yield Import(name, f"{base}.{alias.name}", where)


def _resolve(module: str, is_package: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def part(module: str) -> str:
    """The part a module belongs to."""
    for deeper in DEEPER:
        if module.startswith(deeper + "."):
            return ".".join(module.split(".")[: deeper.count(".") + 2])
    return ".".join(module.split(".")[:2])


def known_modules() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        found.update(module_name(p) for p in (ROOT / package).rglob("*.py"))
    return found


@functools.cache
def edges() -> dict[tuple[str, str], Import]:
    """(part, part) -> one import that makes the edge; imports of names that are not modules count
    for the module that holds them."""
    modules = known_modules()
    graph: dict[tuple[str, str], Import] = {}
    for package in PACKAGES:
        for imp in imports(package):
            target = imp.target
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target:
                continue
            a, b = part(imp.source), part(target)
            if a != b and (a == b.split(".")[0] or not b.startswith(a + ".")):
                graph.setdefault((a, b), imp)
    return graph


def cycles(graph: dict[tuple[str, str], Import]) -> list[list[str]]:
    """Strongly connected components with more than one part (Tarjan), each sorted."""
    succ: dict[str, list[str]] = {}
    for a, b in graph:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], graph: dict[tuple[str, str], Import]) -> str:
    inside = [imp for (a, b), imp in sorted(graph.items()) if a in component and b in component]
    lines = [f"  {part(i.source)} -> {part(i.target)}  ({i.where}: {i.target})" for i in inside]
    return " <-> ".join(component) + "\n" + "\n".join(lines)


def main() -> int:
    graph = edges()
    for (a, b), imp in sorted(graph.items()):
        print(f"{a} -> {b}  ({imp.where})")
    found = cycles(graph)
    for component in found:
        print("cycle:", describe(component, graph))
    print(f"{len(graph)} edges, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
