"""gpufleet's version (`gpufleet --version`, the agent's Hello): the installed version, or
pyproject.toml's in a source tree."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import agent
from controller.main import main
from protos import version as version_module

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpufleet {metadata.version('gpufleet')}\n"


def test_without_package_metadata_the_version_is_pyprojects(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert version_module.version() == PYPROJECT_VERSION
    assert agent.version() == PYPROJECT_VERSION  # what the agent's Hello says, run from a checkout
    monkeypatch.setattr(version_module, "PYPROJECT", ROOT / "no-such-pyproject.toml")
    assert version_module.version() == "unknown"
    assert agent.version() == "unknown"
