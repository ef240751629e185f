"""Tests of the SDPaxos core, one file per module of ``consensus/protocol/sdpaxos/``.

Paper-style unit tests: each builds ``SDPaxosReplica`` directly (or a few of them in a
``util.Net``), feeds it ``propose`` / ``step`` / ``tick``, drains ``ready()`` + ``advance()``
and asserts the exact outputs against SoCC'18 §3 and Figures 5 and 7. The small pure classes
(``test_liveness``, ``test_leases``, ``test_tracker``, ``test_history`` and parts of
``test_straggler`` and ``test_readiness``) are tested alone. ``test_stateful`` checks the
safety invariants under an adversarial network with Hypothesis.
"""
