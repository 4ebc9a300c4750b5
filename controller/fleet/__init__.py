"""Fleet state: what the controller knows about every node and GPU, updated by ingest."""
