"""Smoke test of bench/exporter_scrape.py: a few scrapes of each exporter print every figure (no timings)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench.scripts import bench_script
from tests.support import require


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with bench_script("exporter_scrape") as module:
        yield module


def test_a_few_scrapes_print_every_figure(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    require(
        os.access(bench.NODE_EXPORTER, os.X_OK),
        f"{bench.NODE_EXPORTER} is not installed (Debian package prometheus-node-exporter)",
    )
    assert bench.main(["--scrapes", "3", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    rows = {
        name: line
        for line in out.splitlines()
        for name in ("(render)", "(cached)", "node-exporter")
        if name in line
    }
    assert len(rows) == 3
    for line in rows.values():
        assert re.search(r"median +[\d.]+ ms +p95 +[\d.]+ ms +[\d,]+ bytes +[\d,]+ series", line), line
    assert re.search(r"ours / node exporter: [\d.]+x per scrape, [\d.]+x per series", out)


def test_without_the_node_exporter_it_says_so_and_exits_2(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "prometheus-node-exporter"
    assert bench.main(["--scrapes", "1", "--node-exporter", str(missing)]) == 2
    assert f"{missing} is not installed" in capsys.readouterr().err


def test_bad_arguments_exit_2(bench: ModuleType) -> None:
    assert bench.main(["--scrapes", "0"]) == 2
