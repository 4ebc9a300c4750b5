"""argparse types for what operators type: a bad value is a usage error that names the flag
(`gpufleet history: error: argument --limit: ...`), never a traceback."""

from __future__ import annotations

import argparse


def limit(text: str) -> int:
    """--limit N: a whole number from 1 (the controller caps the top)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
