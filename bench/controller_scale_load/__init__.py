"""The parts of bench/controller_scale.py: simulated-agent templates (templates.py), the load
generator's worker processes (worker.py), the controller under test (target.py) and the report
(report.py)."""
