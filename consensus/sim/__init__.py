"""Deterministic simulation of protocol cores, and the linearizability checker."""
