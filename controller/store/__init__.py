"""Persistence: SQLite, the embedded default (a file path; nothing to install)."""
