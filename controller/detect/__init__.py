"""Detectors: pure functions from fleet state to findings with evidence; one file each, registered by name."""
