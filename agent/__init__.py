"""gpufleet agent: per-node telemetry, probes and streaming to the controller."""

from __future__ import annotations


def version() -> str:
    """gpufleet's version: the installed distribution's, else the source tree's (protos/version.py)."""
    from protos.version import version as gpufleet_version

    return gpufleet_version()
