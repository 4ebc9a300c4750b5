"""gpufleet agent: per-node telemetry, probes and streaming to the controller."""

from __future__ import annotations


def version() -> str:
    """The installed distribution's version ("0+unknown" when running from an uninstalled tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gpufleet")
    except PackageNotFoundError:
        return "0+unknown"
