"""Durable state: the file write-ahead log (the simulator models its own disk)."""
