"""A small step of bench/store_growth.py, so that it cannot rot: 3 nodes, rounds 2 to 4 (its
figures are not asserted, but the rounds it wrote are: the store holds each key's newest results)."""

from __future__ import annotations

import subprocess
import sys

from tests.bench.scripts import BENCH, bench_json


def test_the_store_growth_per_probe_round_is_measured() -> None:
    row = bench_json("store_growth", "--nodes", "3", "--rounds", "2,4")
    assert (row["nodes"], row["rounds"], row["store"]) == (3, "2-4", "sqlite")
    assert row["probe_keys"] == 3 * 57  # the scale bench's archetype: 8 GPUs' probes and the node's
    assert row["mb_at_high"] >= row["mb_at_low"] > 0
    assert row["ms_per_probe_frame"] > 0


def test_bad_rounds_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "store_growth.py"), "--rounds", "4,2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--rounds" in done.stderr
