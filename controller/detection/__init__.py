"""Detection in a process of its own (issue 17): the event loop keeps to ingest and acks."""
