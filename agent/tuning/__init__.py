"""Agent-side tuning: OS-level actuators (cpufreq governor, sysctls, THP, hugepages) under a host
root, and the journaled apply (plan -> validate -> snapshot -> apply -> read back -> done, or roll
back and verify the rollback). See apply.py for the flow and journal.py for what is kept on disk."""
