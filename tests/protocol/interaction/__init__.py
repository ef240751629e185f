"""Interaction scripts for the SDPaxos core (etcd-raft's datadriven style): ``env.py`` drives
real cores from text commands, ``datadriven.py`` runs ``testdata/*.txt`` against it."""
