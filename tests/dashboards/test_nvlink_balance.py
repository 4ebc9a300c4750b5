"""The node dashboard's "Weakest NVLinks" panel, evaluated by promtool on series where one link of a
GPU carries a quarter of what its siblings do: that link comes first at a third of the GPU's mean
link, and a GPU moving nothing over NVLink is left out (no 0/0)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.dashboards.expressions import load_dashboards, panels, substitute
from tests.dashboards.test_alerts import promtool

TITLE = "Weakest NVLinks: traffic against the GPU's mean link"
# Bytes added every 10 s, per (gpu, link): GPU 0's link 2 moves a quarter of links 0 and 1; GPU 1 idles.
STEPS = {("0", "0"): 1000, ("0", "1"): 1000, ("0", "2"): 250, ("1", "0"): 0, ("1", "1"): 0}


def _expr() -> str:
    node = load_dashboards()["gpufleet-node.json"]
    [panel] = [p for p in panels(node) if p.get("title") == TITLE]
    [target] = panel["targets"]
    return substitute(target["expr"])


def test_the_weakest_link_is_singled_out_and_idle_gpus_left_out(tmp_path: Path) -> None:
    series = [
        {
            "series": f'gpufleet_gpu_nvlink_link_{way}_bytes_total{{node="n1", gpu="{gpu}", link="{link}"}}',
            "values": f"0+{step}x12",
        }
        for (gpu, link), step in STEPS.items()
        for way in ("transmit", "receive")
    ]
    # tx + rx: 200, 200 and 50 B/s; their mean 150
    expected = [
        {"labels": f'{{node="n1", gpu="0", link="{link}"}}', "value": value}
        for link, value in (("2", 1 / 3), ("0", 4 / 3), ("1", 4 / 3))
    ]
    case = {
        "rule_files": [],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "10s",
                "input_series": series,
                "promql_expr_test": [{"expr": _expr(), "eval_time": "1m", "exp_samples": expected}],
            }
        ],
    }
    path = tmp_path / "nvlink_balance.test.yaml"
    path.write_text(yaml.safe_dump(case, sort_keys=False))
    tested = promtool("test", "rules", str(path))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
