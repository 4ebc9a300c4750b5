"""`gpufleet demo`: a simulated fleet, a controller, faults injected, found and scored."""
