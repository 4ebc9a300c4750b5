"""gpufleet controller: fleet state, peer comparison, findings, and the operator API."""
