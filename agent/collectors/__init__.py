"""Collectors: one file each, registered by name; the name is also the config key."""
