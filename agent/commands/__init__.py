"""Commands from the controller: one handler file per `Command` oneof member (see registry.py)."""
