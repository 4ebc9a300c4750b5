"""The house's layers, from the import graph of the source (tests/layering.py): no cycles between
the agent's or the controller's parts, and the agent and the controller never import each other."""

from __future__ import annotations

from tests import layering


def test_no_cycles_between_parts() -> None:
    graph = layering.edges()
    found = layering.cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(layering.describe(c, graph) for c in found)


def test_agent_and_controller_never_import_each_other() -> None:
    crossing = [
        f"{imp.where}: {imp.source} imports {imp.target}"
        for (a, b), imp in layering.edges().items()
        if a.split(".")[0] != b.split(".")[0]
    ]
    assert not crossing, "\n".join(crossing)


def test_the_graph_sees_lazy_imports_and_names_modules_by_part() -> None:
    graph = layering.edges()
    assert ("controller.main", "controller.demo") in graph  # imported inside main(), not at the top
    assert layering.part("agent.sources.nvml.source") == "agent.sources.nvml"
    assert layering.part("controller.fleet.model") == "controller.fleet"
    assert layering.part("controller.app") == "controller.app"


def test_a_cycle_is_found_and_described() -> None:
    imp = layering.Import("x.a.m", "x.b.m", "x/a/m.py:1")
    back = layering.Import("x.b.m", "x.c.m", "x/b/m.py:2")
    close = layering.Import("x.c.m", "x.a.m", "x/c/m.py:3")
    graph = {("x.a", "x.b"): imp, ("x.b", "x.c"): back, ("x.c", "x.a"): close, ("x.a", "x.d"): imp}
    assert layering.cycles(graph) == [["x.a", "x.b", "x.c"]]
    assert "x/c/m.py:3" in layering.describe(["x.a", "x.b", "x.c"], graph)
