"""Acting safely: the blast-radius breaker (pure decisions in breaker.py, state and audit in guard.py)."""
