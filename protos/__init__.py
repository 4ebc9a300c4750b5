"""The wire contract between agent and controller (package gpufleet.v1)."""
