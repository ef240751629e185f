"""Benchmarks and the ``sdpaxos`` command line (the one package allowed to import both
``consensus`` and ``cluster_state``)."""
