"""Streaming telemetry to the controller: frames, spool, client."""
