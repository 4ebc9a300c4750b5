"""Generated modules for gpufleet.v1; regenerate with `make protos`."""
