"""gpufleet's version, as `gpufleet --version` prints it and the agent's Hello and gpufleet_agent_info
carry it: the installed package's, else (a source tree, as on a machine the agent runs on from a
checkout) pyproject.toml's; "unknown" when neither says."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def version() -> str:
    try:
        return metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        pass
    try:
        with PYPROJECT.open("rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
