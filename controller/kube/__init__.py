"""Kubernetes: the controller's node actions (cordon, drain, uncordon) and node health, through the
official `kubernetes` client; `fake/` is a small API server for tests and the demo."""
