"""`gpufleet profiles` and `gpufleet profile show NAME`: JSON, YAML and table output from the
catalogue on this machine (no controller), a site directory, and the errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.main import main

Capture = pytest.CaptureFixture[str]


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_profiles_json_lists_every_shipped_profile(capsys: Capture) -> None:
    code, out, _ = run(capsys, "profiles", "-o", "json")
    assert code == 0
    doc = {p["name"]: p for p in json.loads(out)["profiles"]}
    assert {"gpu-defaults", "gpu-locked-base", "os-accelerator-performance", "bios-hpc"} <= set(doc)
    assert doc["bios-hpc"]["risk"] == "needs_reboot" and doc["bios-hpc"]["levels"] == ["bmc"]
    assert doc["gpu-defaults"] | {"path": ""} == {
        "name": "gpu-defaults",
        "description": doc["gpu-defaults"]["description"],
        "levels": ["gpu"],
        "settings": 4,
        "risk": "online",
        "source": "shipped",
        "overrides": False,
        "path": "",
        "fixes": ["power_cap", "clocks_locked_low"],
    }


def test_profiles_yaml_is_the_same_document(capsys: Capture) -> None:
    _, as_json, _ = run(capsys, "profiles", "-o", "json")
    code, as_yaml, _ = run(capsys, "profiles", "-o", "yaml")
    assert code == 0 and yaml.safe_load(as_yaml) == json.loads(as_json)


def test_profiles_table_names_each_profile_whole(capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = run(capsys, "profiles")
    assert code == 0
    for name in ("gpu-defaults", "os-accelerator-performance", "bios-hpc"):
        assert name in out
    assert "needs_reboot" in out


def test_profile_show_gives_every_setting(capsys: Capture) -> None:
    code, out, _ = run(capsys, "profile", "show", "gpu-defaults", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    settings = {s["setting"]: s for s in doc["settings"]}
    assert settings["gpu.power_limit"] == {
        "setting": "gpu.power_limit",
        "level": "gpu",
        "target": "default",
        "risk": "online",
        "action": "apply",
        "reason": settings["gpu.power_limit"]["reason"],
        "source": settings["gpu.power_limit"]["source"],
    }
    assert all(s["reason"] and s["source"] for s in doc["settings"])
    code, out, _ = run(capsys, "profile", "show", "bios-hpc", "-o", "yaml")
    bios = {s["setting"]: s for s in yaml.safe_load(out)["settings"]}
    assert bios["bmc.bios.TurboMode"]["vendors"]["dell"] == {"name": "ProcTurboMode", "target": "Enabled"}
    assert bios["bmc.bios.PcieAcsControl"]["risk"] == "needs_reboot"
    code, out, _ = run(capsys, "profile", "show", "firmware-fleet-baseline", "-o", "json")
    assert {s["action"] for s in json.loads(out)["settings"]} == {"recommend"}


def test_profile_show_table(capsys: Capture) -> None:
    code, out, _ = run(capsys, "profile", "show", "os-accelerator-performance", "-o", "wide")
    assert code == 0
    assert "os.sysctls.kernel.numa_balancing" in out and "performance" in out and "online" in out


def test_an_unknown_profile_exits_2_and_lists_the_names(capsys: Capture) -> None:
    code, out, err = run(capsys, "profile", "show", "gpu-fast")
    assert code == 2 and out == ""
    assert err.startswith("gpufleet: no profile 'gpu-fast'; profiles: bios-hpc, ")
    assert "gpu-defaults" in err


def test_a_site_directory_is_listed_as_site(capsys: Capture, tmp_path: Path) -> None:
    (tmp_path / "gpu-defaults.yaml").write_text(
        "name: gpu-defaults\ndescription: ours\ngpu:\n  power_limit: {target: 650, reason: r, source: s}\n"
    )
    code, out, _ = run(capsys, "profiles", "--profiles-dir", str(tmp_path), "-o", "json")
    assert code == 0
    doc = {p["name"]: p for p in json.loads(out)["profiles"]}
    assert doc["gpu-defaults"]["source"] == "site" and doc["gpu-defaults"]["overrides"] is True
    assert doc["bios-hpc"]["source"] == "shipped"
    code, out, _ = run(capsys, "profiles", "--profiles-dir", str(tmp_path))
    assert "site (overrides shipped)" in out
    code, out, _ = run(
        capsys, "profile", "show", "gpu-defaults", "--profiles-dir", str(tmp_path), "-o", "json"
    )
    assert json.loads(out)["settings"][0]["target"] == 650


def test_a_bad_site_profile_exits_2_naming_file_and_key(capsys: Capture, tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text(
        "name: x\ndescription: d\ngpu:\n  compute_mode: {target: exclusive, reason: r, source: s}\n"
    )
    code, out, err = run(capsys, "profiles", "--profiles-dir", str(tmp_path))
    assert code == 2 and out == ""
    assert err.strip() == (
        f"gpufleet: {tmp_path / 'x.yaml'}: gpu.compute_mode: 'exclusive' is not one of default, "
        "exclusive_process, prohibited"
    )
