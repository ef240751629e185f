"""Theoretical latency bounds per site, computed from the RTT table (DESIGN §7).

* Any protocol: a write at site ``s`` needs a round trip to the nearest majority of replicas,
  ``s`` itself included (the Q-th smallest RTT from ``s``, counting 0 to itself).
* SDPaxos (sequencer at ``q``): the C-instance needs that majority and the O-instance the
  sequencer, both in parallel: ``max(majority(s), rtt(s, q))``. A linearizable read is one
  round trip to the sequencer: ``rtt(s, q)``.
* Multi-Paxos (leader ``l``): at the leader ``majority(l)``; elsewhere the command is
  forwarded, committed by the leader, and the commit comes back: ``rtt(s, l) + majority(l)``.
  Reads go through the log like writes.
* Mencius: no closed form (a slot waits to hear every other replica's skips, which depends
  on their load), so the any-protocol bound is reported.
* EPaxos (``consensus.protocol.epaxos``): a command without conflicts commits on the fast
  path, one round trip to the nearest fast quorum (the optimized F + floor((F+1)/2)
  replicas, itself included: 2 of 3, 3 of 5, where it is the nearest majority).
"""

from __future__ import annotations

from collections.abc import Sequence

from consensus.config import SITES, site_rtt_ms

__all__ = [
    "BOUND_KINDS",
    "fast_quorum_rtt_ms",
    "majority_rtt_ms",
    "read_bounds_ms",
    "ready_bounds_ms",
    "sites_for",
]

#: what each protocol's reported bound is
BOUND_KINDS: dict[str, str] = {
    "sdpaxos": "max(RTT to nearest majority, RTT to sequencer)",
    "multipaxos": "RTT to leader + leader's RTT to its nearest majority",
    "mencius": "RTT to nearest majority (lower bound for any protocol)",
    "epaxos": "RTT to nearest fast quorum (F + floor((F+1)/2) replicas, itself included)",
}


def sites_for(replicas: int) -> tuple[str, ...]:
    """Replica ``i`` sits at ``SITES[i]`` (the cluster files the benches write)."""
    if not 1 <= replicas <= len(SITES):
        raise ValueError(f"the paper's table has {len(SITES)} sites, not {replicas}")
    return tuple(SITES[:replicas])


def majority_rtt_ms(sites: Sequence[str], me: int) -> float:
    """RTT from ``sites[me]`` to its nearest majority, itself included."""
    quorum = len(sites) // 2 + 1
    rtts = sorted(site_rtt_ms(sites[me], other) for other in sites)
    return float(rtts[quorum - 1])


def fast_quorum_rtt_ms(sites: Sequence[str], me: int) -> float:
    """RTT from ``sites[me]`` to its nearest EPaxos fast quorum (the optimized F +
    floor((F+1)/2) replicas, itself included; a cluster of one is its own quorum)."""
    f = len(sites) // 2
    quorum = max(1, f + (f + 1) // 2)
    rtts = sorted(site_rtt_ms(sites[me], other) for other in sites)
    return float(rtts[quorum - 1])


def ready_bounds_ms(protocol: str, sites: Sequence[str], *, leader: int = 0) -> list[float]:
    """Lowest possible write (ready) latency at each site; ``leader`` is the SDPaxos sequencer
    or the Multi-Paxos leader."""
    bounds = []
    for me in range(len(sites)):
        nearest = majority_rtt_ms(sites, me)
        to_leader = float(site_rtt_ms(sites[me], sites[leader]))
        if protocol == "sdpaxos":
            bounds.append(max(nearest, to_leader))
        elif protocol == "multipaxos":
            bounds.append(nearest if me == leader else to_leader + majority_rtt_ms(sites, leader))
        elif protocol == "mencius":
            bounds.append(nearest)
        elif protocol == "epaxos":
            bounds.append(fast_quorum_rtt_ms(sites, me))
        else:
            raise ValueError(f"no bound known for protocol {protocol!r}")
    return bounds


def read_bounds_ms(protocol: str, sites: Sequence[str], *, leader: int = 0) -> list[float]:
    """Lowest possible linearizable-read latency at each site."""
    if protocol == "sdpaxos":
        return [float(site_rtt_ms(site, sites[leader])) for site in sites]
    return ready_bounds_ms(protocol, sites, leader=leader)
