"""The real GPU source: NVML through nvidia-ml-py (the only package that imports pynvml)."""
