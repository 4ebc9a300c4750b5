"""Commands to agents: one channel (channel.py) for every kind (kinds.py), stored by controller/store."""
