"""The `gpufleet` command line: dispatcher, controller runner and operator commands."""
