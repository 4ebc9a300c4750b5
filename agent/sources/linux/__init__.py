"""The real host source: /proc and /sys under a host root, and psutil."""
