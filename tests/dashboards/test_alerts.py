"""The alert rules (dashboards/gpufleet-alerts.yaml): promtool accepts them and passes their unit
tests, every alert is tested both firing and quiet, and every alert is labelled and described."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import yaml

from tests.dashboards.expressions import ALERT_TESTS, ALERTS, DASHBOARDS, alert_rules, unknown_names
from tests.support import require


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    require(binary is not None, "promtool missing: apt-get install prometheus")
    assert binary is not None
    return subprocess.run(
        [binary, *args], cwd=DASHBOARDS, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_checks_the_rules() -> None:
    checked = promtool("check", "rules", ALERTS.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_promtool_unit_tests_pass() -> None:
    tested = promtool("test", "rules", ALERT_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests: dict[str, Any] = yaml.safe_load(ALERT_TESTS.read_text())
    assert tests["rule_files"] == [ALERTS.name]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), "two alerts share a name"
    assert set(names) - firing == set(), "alerts never tested firing"
    assert set(names) - quiet == set(), "alerts never tested staying quiet"
    assert firing | quiet <= set(names), "tests name an alert the rules do not have"


def test_every_alert_has_a_severity_and_names_where() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        assert summary and description, name
        # A process's own health (an agent's scrape, the controller's detection, open files,
        # recording, breaker or actions) names its instance.
        own = r"\bup\b|gpufleet_controller_(detect|open_files|record|breaker|actions)"
        process = re.search(own, rule["expr"])
        where = "$labels.instance" if process else "$labels.node"
        assert where in summary and where in description, name
        if "gpufleet_gpu_" in rule["expr"] or "finding_active" in rule["expr"]:
            assert "$labels.gpu" in summary and "$labels.gpu" in description, name
        assert not unknown_names(rule["expr"]), name
